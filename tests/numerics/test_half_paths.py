"""PyTorch's CPU half kernels as ``torch_half_path`` probes them, here and on the other ISA paths.

The fp16 claims of ``test_real_runtimes`` depend on the half kernels torch picks on the CPU.  Two
settings select another path on the same machine, and the CPU-dependent tests run under each in a
subprocess, so a claim that holds on one CPU family only fails before it lands:

* ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2``: ATen's AVX2 kernels and oneDNN's AVX2 kernels
  (the float32 convs the emulator runs).  On this AMD EPYC Zen 5 it reproduces what issue 29 measured
  on an AVX2-only AMD EPYC: PP-OCRv4 det's folded fp16 SQNR 32.9 dB (36.9 dB on the native AVX-512
  path), PP-OCRv6 rec's worst fp16 batch norm ``BatchNormalization.0`` at headroom 3.23e+03x.  On an
  Intel CPU with AVX-512 FP16 the oneDNN cap is expected to switch torch's half conv off oneDNN
  (``ideep::has_fp16_type_support`` reads oneDNN's effective ISA), i.e. onto the AMD path.
* ``ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41`` (no vector extensions in ATen, SSE4.1 in
  oneDNN) takes the same paths as AVX2 here, with a few other elements moved (probe: conv 29 of 16384
  differ against 27): not run by the suite, to keep it short; add it to ``ISAS`` to check it.

Neither can reach a path the CPU lacks (oneDNN fp16 needs AVX-512 FP16 or AMX-FP16 in hardware).

The audit's printed numbers are checked the same way: on a trained PaddleOCR model, the output SQNR over
several random batches moves between the two paths by less than the spread the audit prints next to it
(the README test's rule, ``readme_blocks.matches``), and the verdicts and the worst normalization stay.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch_half_path import KINDS, PATHS, fp16_steps, probe

HERE = Path(__file__).parent
ISAS = {
    "AVX2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
}
ORDER = ("DEFAULT", "AVX2", "AVX512")  # torch's capabilities on x86, lowest first


def test_fp16_steps_counts_fp16_values_between():
    h = lambda *v: torch.tensor(v, dtype=torch.float16).float()  # noqa: E731
    tiny = 2.0**-24  # the smallest fp16 subnormal
    a = h(1.0, 1.0, -1.0, 0.0, -0.0, tiny, 65504.0, 2.0)
    b = h(1.0, 1.0 + 2**-10, -1.0 - 2**-10, -0.0, tiny, -tiny, 65504.0, 1.0)
    assert fp16_steps(a, b).tolist() == [0, 1, 1, 0, 1, 2, 0, 1024]


def test_the_probe_names_a_path_per_kind_and_each_holds_what_it_says():
    """Per layer kind on this CPU: once rounded is bit-identical (by definition), a reordered sum
    differs on at most 1% and nearly never by more than one fp16 step, a double rounding differs on
    many elements but stays within one step on most (measured on Zen 5: conv 1 of 16384 elements by
    two steps, conv transpose 94% within one step)."""
    path = probe()
    assert set(path.ops) == set(KINDS) and path.capability in ORDER
    for op in path.ops.values():
        assert op.path in PATHS and op.elements >= 4096
        within = 1 - op.beyond_one_step / op.elements
        assert within >= {"once rounded": 1.0, "reordered": 0.999, "rounds twice": 0.9}[op.path], (op, path.describe())
    if path.mkldnn_fp16:  # oneDNN accumulates half convs in float32 and rounds once: no double rounding
        assert path.ops["conv_transpose"].path != "rounds twice", path.describe()
    else:  # ATen's slow_conv_transpose2d rounds the product, then adds the bias in fp16
        assert path.ops["conv_transpose"].path == "rounds twice", path.describe()


@pytest.mark.parametrize("isa", list(ISAS))
def test_the_fp16_claims_hold_on_another_isa_path(isa):
    """The probe and ``test_real_runtimes``' fp16 checks in a subprocess on the ``isa`` path (as far as
    this CPU has it): the capability torch reports is the one asked for, and the claims hold there."""
    host = torch.backends.cpu.get_cpu_capability()
    want = min(isa, host, key=ORDER.index) if host in ORDER else None
    env = dict(os.environ, **ISAS[isa])
    script = (
        f"{sys.executable} {HERE / 'torch_half_path.py'} && "
        f"{sys.executable} -m pytest -q -p no:cacheprovider {HERE / 'test_real_runtimes.py'} -k fp16_profile "
        f"{HERE / 'test_half_paths.py'}::test_the_probe_names_a_path_per_kind_and_each_holds_what_it_says"
    )
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    first = proc.stdout.splitlines()[0]
    if want is not None:
        assert first.startswith(f"cpu capability {want},"), first
    assert " passed" in out and "failed" not in out, out[-2000:]


def audit_numbers() -> dict:
    """PP-OCRv6 rec audited under fp16 on 6 random batches in [-1, 1] (1x3x48x64): what it prints."""
    import onnx
    from paddleocr_models import model_path

    from bnfold.numerics import audit

    g = torch.Generator().manual_seed(0)
    batches = [(torch.rand((1, 3, 48, 64), generator=g) * 2 - 1,) for _ in range(6)]
    rep = audit(onnx.load(model_path("v6-rec")), batches, profile="fp16", random_inputs=True)
    return {
        "capability": torch.backends.cpu.get_cpu_capability(),
        "sqnr line": next(ln for ln in rep.table().splitlines() if ln.strip().startswith("output SQNR")),
        "verdicts": [n.verdict for n in rep.norms],
        "worst": [n.name for n in rep.worst_norms(3)],
    }


def test_the_audits_printed_numbers_hold_on_the_avx2_path():
    """Measured: output SQNR 45.5 ± 4.2 dB unfolded, 47.3 ± 2.6 dB folded here (Zen 5), 46.3 ± 4.1 and
    48.4 ± 2.3 dB on its AVX2 path; the worst batch norm by measured loss alone flips between them."""
    sys.path.insert(0, str(HERE.parent / "readme"))
    from readme_blocks import matches

    here = audit_numbers()
    code = f"import json, sys; sys.path.insert(0, {str(HERE)!r}); from test_half_paths import audit_numbers; "
    code += "print(json.dumps(audit_numbers()))"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=dict(os.environ, **ISAS["AVX2"]), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    there = json.loads(proc.stdout.splitlines()[-1])
    assert "±" in here["sqnr line"], here  # several batches: the spread is printed
    assert matches(here["sqnr line"], there["sqnr line"]), (here, there)
    assert (here["verdicts"], here["worst"]) == (there["verdicts"], there["worst"]), (here, there)
