"""Issue 44: an audit of a file under 100 KB peaks under 1 GiB.  A few hundred bytes of ONNX whose Resize scales the
graph computes from the input (the plan cannot size it, :func:`crafted_work.computed_resize`) ask for a value of
``16 s^2`` elements.  At s = 5000 (1.49 GiB) the meta run of the check made it for real and the audit peaked at
3.4 GB; at s = 600 (22 MiB a value) it passed every check and peaked at 1.2 GB, exit 0: it kept every batch's
outputs, and its budget's floor was 8 x 256 MiB.  Now no batch's outputs are kept past its run, the run-time check
counts what the audit holds as the plan counts it, and the audit's floor is lower.  The peak is measured in a fresh
process whose only child is the audit."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from crafted_work import computed_resize

onnx = pytest.importorskip("onnx")

_PEAK = """
import json, resource, subprocess, sys
p = subprocess.run([sys.executable, "-m", "bnfold", *sys.argv[1:]], capture_output=True, text=True, timeout=570)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps({"rc": p.returncode, "peak": peak, "err": p.stderr.strip().splitlines()[-1:]}))
"""


def _audit_peak(path) -> dict:
    assert path.stat().st_size < 100_000
    # the wall clock only ends a hang (the audit takes 10-50 s at load 6 on two cores)
    run = subprocess.run(
        [sys.executable, "-c", _PEAK, "audit", str(path), "-q"], capture_output=True, text=True, timeout=600
    )
    return json.loads(run.stdout)


def test_a_tiny_file_whose_resize_scales_are_computed_peaks_under_1_gib(tmp_path):
    got = _audit_peak(computed_resize(tmp_path, 5000.0))  # a [1, 1, 20000, 20000] float32 value: 1.49 GiB
    assert got["rc"] == 2, got
    (err,) = got["err"]
    assert "Resize 'Resize_3' would create 1.49 GiB" in err and "over the budget" in err
    assert got["peak"] < 1 << 30, got


@pytest.mark.parametrize("scale", [600.0, 1000.0])
def test_values_the_plan_cannot_size_keep_the_audit_under_1_gib(tmp_path, scale):
    """Where the old bound failed: s = 600 (1207 MiB, exit 0) and s = 1000 (refused, but at 1120-1181 MiB).  Audited
    or refused in one line, the audit stays under 1 GiB."""
    got = _audit_peak(computed_resize(tmp_path, scale))
    assert got["rc"] in (0, 2), got
    if got["rc"] == 2:
        (err,) = got["err"]
        assert err.startswith("bnfold: error: ") and "over the budget" in err, got
    assert got["peak"] < 1 << 30, got
