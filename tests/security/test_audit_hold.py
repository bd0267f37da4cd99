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
