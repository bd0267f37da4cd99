"""Issue 44: an audit of a file under 100 KB peaks under 1 GiB.  A few hundred bytes of ONNX whose Resize scales the
graph computes from the input (the plan cannot size it) asked for a 1.49 GiB value: the meta run of the check made it
for real (a 16-element input was kept real) and nothing refused it; the audit peaked at 3.4 GB.  The run-time check
now sizes it on meta tensors and counts what the audit holds with it, as the plan does.  The peak is measured in a
fresh process whose only child is the audit."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

onnx = pytest.importorskip("onnx")


def _computed_resize(path, scale: float) -> None:
    """``Resize(x, scales = [1, 1, s, s] + 0 * sum(x))``: scales computed from the input at run time."""
    from onnx import TensorProto as T
    from onnx import helper as h

    nodes = [
        h.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        h.make_node("Mul", ["s", "zero"], ["z"]),
        h.make_node("Add", ["base", "z"], ["scales"]),
        h.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest"),
        h.make_node("Relu", ["y"], ["out"]),
    ]
    inits = [h.make_tensor("zero", T.FLOAT, [], [0.0]), h.make_tensor("base", T.FLOAT, [4], [1, 1, scale, scale])]
    x = h.make_tensor_value_info("x", T.FLOAT, [1, 1, 4, 4])
    g = h.make_graph(nodes, "g", [x], [h.make_tensor_value_info("out", T.FLOAT, None)], inits)
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), path)


_PEAK = """
import json, resource, subprocess, sys
p = subprocess.run([sys.executable, "-m", "bnfold", *sys.argv[1:]], capture_output=True, text=True)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps({"rc": p.returncode, "peak": peak, "err": p.stderr.strip().splitlines()[-1:]}))
"""


def test_a_tiny_file_whose_resize_scales_are_computed_peaks_under_1_gib(tmp_path):
    path = tmp_path / "tiny.onnx"
    _computed_resize(path, 5000.0)  # a [1, 1, 20000, 20000] float32 value: 1.49 GiB
    assert path.stat().st_size < 100_000
    run = subprocess.run([sys.executable, "-c", _PEAK, "audit", str(path), "-q"], capture_output=True, text=True)
    got = json.loads(run.stdout)
    assert got["rc"] == 2, got
    (err,) = got["err"]
    assert "Resize 'Resize_3' would create 1.49 GiB" in err and "over the budget" in err
    assert got["peak"] < 1 << 30, got
