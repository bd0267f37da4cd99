"""Issues 43 and 44: what the audit holds does not grow with the batches.  The folded run is measured against the
unfolded run's reference values of the same batch; the audit held every batch's until the folded run began (6.3 GB
for PP-OCRv4 det at 960x960, 8 batches; 1.65 GB at 256x512).  Both programs now run batch by batch
(:func:`bnfold.numerics.execute.execute_pair`): one batch's references at a time, counted by the run-time check."""

from __future__ import annotations

import os
import sys

import pytest
import torch

import bnfold
from bnfold.io import run_checks
from bnfold.numerics.runner import Runner

onnx = pytest.importorskip("onnx")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "numerics"))
from paddleocr_models import model_path  # noqa: E402


@pytest.mark.parametrize("tensors", [True, False])
def test_what_the_audit_holds_does_not_grow_with_the_batches(monkeypatch, tensors):
    try:
        model = onnx.load(model_path("v4-det"))
    except FileNotFoundError as e:
        pytest.skip(str(e))
    held = []  # what the run-time check counts as held before each op (the caller's holding, the live values)
    runner_held = Runner._held
    monkeypatch.setattr(Runner, "_held", lambda self, n: held.append(runner_held(self, n)) or held[-1])
    peaks = []
    for n in (1, 4):
        g = torch.Generator().manual_seed(n)
        batches = [(torch.rand(1, 3, 64, 96, generator=g),) for _ in range(n)]
        held.clear()
        with run_checks.watch():
            bnfold.audit(model, batches, prescribe=False, tensors=tensors)
        peaks.append(max(held))
    # before: the fourth batch's folded run counted the references of all four (1.6x the peak of one batch)
    assert peaks[1] < 1.25 * peaks[0], peaks


def test_no_batch_outputs_are_held_past_its_run(monkeypatch, tmp_path):
    """A model whose outputs dominate (a Resize x50 of a 4x4 input, :func:`crafted_work.computed_resize`): the audit
    kept every batch's outputs, both programs', emulated and reference, for its end-to-end numbers (at s = 600, 1.2 GB
    for 8 batches).  They are now summed as the batches run (:class:`bnfold.numerics.end_to_end.EndToEndSum`): what the
    run-time check counts as held is the same at 6 batches as at 1 (before: 1.69x)."""
    from crafted_work import computed_resize

    model = onnx.load(computed_resize(tmp_path, 50.0))
    held = []
    runner_held = Runner._held
    monkeypatch.setattr(Runner, "_held", lambda self, n: held.append(runner_held(self, n)) or held[-1])
    peaks = []
    for n in (1, 6):
        batches = [(torch.rand(1, 1, 4, 4),) for _ in range(n)]
        held.clear()
        with run_checks.watch():
            rep = bnfold.audit(model, batches, prescribe=False)
        assert rep.unfolded.output.count == n * 200 * 200
        peaks.append(max(held))
    assert peaks[1] <= 1.05 * peaks[0], peaks


class _Pointwise(torch.nn.Module):
    """Three 1x1 convs of 32 channels: little work per byte held, so the audit's bytes decide."""

    def __init__(self):
        super().__init__()
        conv, relu = torch.nn.Conv2d, torch.nn.ReLU
        self.convs = torch.nn.Sequential(conv(3, 32, 1), relu(), conv(32, 32, 1), relu(), conv(32, 1, 1))

    def forward(self, x):
        return self.convs(x)


def test_the_plan_counts_what_the_audits_profile_and_options_hold(monkeypatch):
    """BENCHMARKS L: the plan counted a float64 reference and a float64 local run of every value (20 bytes per
    float32 element) and a float64 im2col buffer at each conv, 2.9-3.7x the detector's measured peak.  Under the
    profiles that store fp16 the reference runs in float32, and the local runs are off unless asked: the plan counts
    8 bytes per element, as the run-time check counts what the run holds (and checks it, op by op).  With a
    budget of 160 MiB (``--max-work 20MiB``) a 256x256 input is refused as before under fp32 with ``--local`` (a float64
    reference and local run: the plan is 192 MiB) and audits under fp16 (120 MiB; before: refused at 192 MiB)."""
    from bnfold.io.budget import WorkError, max_work
    from bnfold.numerics import audit_memory
    from bnfold.numerics.audit_memory import AuditHold

    x = torch.randn(1, 3, 256, 256)
    ep = torch.export.export(_Pointwise().eval(), (x,))
    plans, plan = [], audit_memory.fx_plan
    monkeypatch.setattr(audit_memory, "fx_plan", lambda *a, **k: plans.append(plan(*a, **k)) or plans[-1])
    with run_checks.watch(), max_work(20 << 20):  # the run-time check counts what the run holds, op by op
        with pytest.raises(WorkError, match="values alive at once"):
            bnfold.audit(ep, [(x,)], random_inputs=True, profile="fp32", local=True, prescribe=False)
        bnfold.audit(ep, [(x,)], random_inputs=True, profile="fp16", local=False, prescribe=False)
    assert plans[-1].peak < 0.7 * 192 * 2**20, plans[-1]
    assert AuditHold(3).float_bytes == 4 + 8 + 8  # no profile said: the most any audit holds
    assert AuditHold.of(3, torch.float32, False).float_bytes == 4 + 4
    assert AuditHold.of(3, torch.float64, True).float_bytes == 4 + 8 + 8
