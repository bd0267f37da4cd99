"""The audit's plan counts a convolution's im2col buffer exactly where torch's CPU convolution allocates one
(``numerics.audit_memory.conv_columns``): float64 (the reference) in torch's native kernels, for the whole batch,
one sample's when dilated, a transposed one's over its input positions, none for a 1x1 kernel at stride 1 without
padding, group by group with the group's slices; float32 only where torch runs it natively (one small sample, not
in oneDNN).  Checked against the peak memory of single convolutions, measured in a fresh process: the plan never
counts less (an undercount is a security bug), the buffer never much more (a usability one).  Native kernels and
torch's choice of them are the same on Intel and AMD CPUs; oneDNN's float32 runs are left to the 24 bytes per output
element the plan counts for every op."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import bnfold
from bnfold.io.cost import Conv, fx_conv, onnx_conv
from bnfold.io.fx_cost import op_flops
from bnfold.numerics.audit_memory import AuditHold, conv_columns

MIB = 1 << 20

# (dtype, input, weight, stride, padding, dilation, groups, transposed)
CASES = {
    "float64 3x3": ("float64", (4, 32, 128, 128), (32, 32, 3, 3), 1, 1, 1, 1, False),
    "float64 3x3 stride 2": ("float64", (4, 32, 128, 128), (32, 32, 3, 3), 2, 1, 1, 1, False),
    "float64 dilated": ("float64", (4, 32, 128, 128), (32, 32, 3, 3), 1, 2, 2, 1, False),
    "float64 1x1": ("float64", (4, 32, 128, 128), (32, 32, 1, 1), 1, 0, 1, 1, False),
    "float64 groups 2": ("float64", (4, 32, 128, 128), (32, 16, 3, 3), 1, 1, 1, 2, False),
    "float64 transposed": ("float64", (4, 32, 64, 64), (32, 32, 3, 3), 2, 1, 1, 1, True),
    "float32 small, padded": ("float32", (1, 20, 32, 32), (1, 20, 3, 3), 1, 20, 1, 1, False),
}

_PROBE = r"""
import json, sys, torch
torch.set_num_threads(1)
def hwm(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
out = {}
for name, (dt, xs, ws, st, pad, dil, g, tr) in json.loads(sys.argv[1]).items():
    dtype = getattr(torch, dt)
    conv = (lambda x, w: torch.nn.functional.conv_transpose2d(x, w, None, st, pad, 0, g, dil)) if tr else (
        lambda x, w: torch.nn.functional.conv2d(x, w, None, st, pad, dil, g))
    w = torch.randn(ws, dtype=dtype)
    conv(torch.randn(1, xs[1], 12, 12, dtype=dtype), w)  # the kernels' first-call setup, on a small input
    x = torch.randn(xs, dtype=dtype)
    open("/proc/self/clear_refs", "w").write("5")
    base = hwm("VmRSS:")
    y = conv(x, w)
    out[name] = [hwm("VmHWM:") - base - y.nbytes, list(y.shape)]
    del x, y
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def measured() -> dict:
    """``{case: [peak bytes beyond the output, output dims]}``, measured in one fresh process (large blocks
    mmapped, so that a freed buffer leaves the process and the next peak is its own)."""
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak RSS")
    env = {"MALLOC_MMAP_THRESHOLD_": "65536", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(CASES)], capture_output=True, text=True, env=env, timeout=300
    )
    if run.returncode != 0 and "clear_refs" in run.stderr:
        pytest.skip("cannot reset the peak RSS here")
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.splitlines()[-1])


@pytest.mark.parametrize("case", list(CASES))
def test_the_plan_counts_a_convs_buffer_as_the_run_allocates_it(measured, case):
    dt, xs, ws, _, _, dil, _, tr = CASES[case]
    peak, out_dims = measured[case]
    conv, itemsize = Conv(tr, dil != 1), torch.finfo(getattr(torch, dt)).bits // 8
    hold = AuditHold.of(3, getattr(torch, dt), local=False)
    planned = hold._temp(conv, out_dims, [list(xs), list(ws)], torch.Size(out_dims).numel())
    assert peak <= planned * 1.1 + MIB, (peak / MIB, planned / MIB)  # never less than the run (1 MiB of page noise)
    columns = conv_columns(conv, out_dims, [list(xs), list(ws)], itemsize)
    assert columns <= peak * 1.15 + MIB, (columns / MIB, peak / MIB)  # nor much more


def test_a_float32_conv_in_onednn_counts_no_buffer():
    """A batch of 4 (or one sample over 20480 input elements, a grouped one, a transposed one) runs in oneDNN."""
    for xs, ws in (((4, 32, 128, 128), (32, 32, 3, 3)), ((1, 20, 33, 33), (4, 20, 3, 3)), ((1, 8, 8, 8), (8, 2, 3, 3))):
        assert conv_columns(Conv(), [xs[0], ws[0], *xs[2:]], [list(xs), list(ws)], 4) == 0
    assert conv_columns(Conv(transposed=True), [1, 8, 15, 15], [[1, 8, 8, 8], [8, 8, 3, 3]], 4) == 0


def test_the_facts_come_from_the_programs_and_graphs_convolutions(tmp_path):
    """``fx_conv`` / ``onnx_conv`` read transposed and dilated from an exported program's and an ONNX graph's ops."""
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=2, dilation=2), torch.nn.ConvTranspose2d(4, 4, 3, stride=2)
    ).eval()
    x = torch.randn(1, 3, 8, 8)
    ep = torch.export.export(model, (x,)).run_decompositions()
    convs = [fx_conv(n.target.__name__.split(".")[0], n.args) for n in ep.graph.nodes if n.op == "call_function"]
    assert [c for c in convs if c is not None] == [Conv(False, True), Conv(True, False)]
    onnx = pytest.importorskip("onnx")
    torch.onnx.export(model, (x,), str(tmp_path / "m.onnx"), opset_version=17, dynamo=False)
    nodes = onnx.load(str(tmp_path / "m.onnx")).graph.node
    assert [onnx_conv(n, n.op_type) for n in nodes if onnx_conv(n, n.op_type)] == [Conv(False, True), Conv(True, False)]


def test_a_transposed_convs_flops_are_its_input_positions_whatever_its_spelling():
    """``convolution(..., transposed=True, ...)`` and ``conv_transpose2d`` are one op to the cost model: one inner
    product of ``C_out/g x kh x kw`` per input element (the im2col buffer's facts decide it, ``fx_conv``), and a
    ``convolution`` not transposed one per output element."""
    aten = torch.ops.aten
    x, w, out = [1, 8, 16, 16], [8, 4, 3, 3], [1, 4, 33, 33]
    per_input = 2 * 2048 * 36
    conv_args = (None, None, None, [2, 2], [0, 0], [1, 1], True, [0, 0], 1)
    assert op_flops(aten.convolution.default, conv_args, out, [x, w]) == per_input
    assert op_flops(aten.conv_transpose2d.input, (None, None, None, [2, 2]), out, [x, w]) == per_input
    forward = (None, None, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    assert op_flops(aten.convolution.default, forward, [1, 8, 16, 16], [x, [8, 8, 3, 3]]) == 2 * 2048 * 72


class _TimeBatchConv(torch.nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3, c, c) / 20)

    def forward(self, x):
        return torch.conv_tbc(x, self.w, torch.zeros(self.w.shape[2]), 1)


def test_conv_tbc_is_no_transposed_conv():
    """``conv_tbc`` (input ``[T, B, C_in]``, weight ``[taps, C_in, C_out]``) adds one matrix product per tap into its
    output and allocates nothing else (torch's profiler: one ``empty``, the output): no im2col buffer is counted, and
    its FLOPs are ``taps x C_in`` products per output element.  Before, its ``conv_t`` prefix read it as a transposed
    conv: an fp32-profile audit of a 100 x 4 x 128 sequence (a 200 KB output) was refused at 2.35 GiB."""
    assert fx_conv("conv_tbc", (None, None, None, 1)) is None
    assert fx_conv("conv_transpose2d", ()) == Conv(True, False)
    dims = [[100, 4, 128], [3, 128, 128], [128]]
    assert op_flops(torch.ops.aten.conv_tbc.default, (None, None, None, 1), [100, 4, 128], dims) == 2 * 51200 * 384
    x = torch.randn(100, 4, 128)
    ep = torch.export.export(_TimeBatchConv(128).eval(), (x,))
    report = bnfold.audit(ep, [(x,)], profile="fp32").to_dict()
    assert report["end_to_end"]["unfolded"]["elements"] == 51200
