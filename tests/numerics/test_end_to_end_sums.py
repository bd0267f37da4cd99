"""Issue 44, point 6: the audit holds one batch's outputs at a time, its end-to-end numbers summed as the batches run
(:class:`bnfold.numerics.end_to_end.EndToEndSum`).  They must be the numbers of the whole arrays: here every batch's
outputs are kept (the runner run by hand, as the audit runs it) and each number is computed again over their
concatenation, in float64, for a model with two float outputs (a classifier's logits and a probability map), four
batches, one of which overflows fp16 in one output."""

import math

import pytest
import torch
from numerics_helpers import calibrated
from torch import nn

import bnfold
from bnfold.numerics.fx_program import fx_program
from bnfold.numerics.runner import Runner

BATCHES = 4


class TwoHeads(nn.Module):
    """Logits ``[N, 5]`` and a probability map ``[N, 1, 6, 6]``, with a batch norm to fold in each head."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)
        self.head = nn.Conv2d(8, 1, 1)
        self.bn2 = nn.BatchNorm2d(1)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        logits = self.fc(y.mean((2, 3)))
        return logits, torch.sigmoid(self.bn2(self.head(y)))


def _model():
    torch.manual_seed(0)
    return calibrated(TwoHeads(), (8, 3, 6, 6), rounds=3)


def _batches():
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(3, 3, 6, 6, generator=g) for _ in range(BATCHES)]
    xs[2] = xs[2] * 3e4  # fp16 overflows in this batch: NaN/inf counts
    return [(x,) for x in xs]


def _whole(emulated: list, reference: list) -> dict:
    """The numbers of the concatenated outputs (every batch's, float64 sums over the whole array)."""
    e = torch.cat([t.reshape(-1) for t in emulated]).double()
    r = torch.cat([t.reshape(-1) for t in reference]).double()
    finite = e.isfinite() & r.isfinite()
    d = (e - r)[finite]
    return {
        "signal": float((r[finite] ** 2).sum()),
        "noise": float((d**2).sum()),
        "nan": int(e.isnan().sum()),
        "inf": int(e.isinf().sum()),
        "elements": e.numel(),
        "max_abs_err": float(d.abs().max()),
    }


def _sqnr(w: dict) -> float:
    if w["nan"] or w["inf"]:
        return math.nan
    return 10 * math.log10(w["signal"] / w["noise"])


def _close(a, b, rel=1e-12):
    if isinstance(a, float) and math.isnan(a):
        return b is None or math.isnan(b)
    return a == b or abs(a - b) <= rel * max(abs(a), abs(b))


@pytest.mark.parametrize("tensors", [True, False])
def test_the_summed_numbers_are_those_of_the_whole_arrays(tensors):
    m = _model()
    xs = _batches()
    ep = torch.export.export(m, xs[0])
    labels = torch.randint(0, 5, (3 * BATCHES,), generator=torch.Generator().manual_seed(2))
    rep = bnfold.audit(ep, xs, threshold=0.5, labels=labels, tensors=tensors, local=False)
    d = rep.to_dict()["end_to_end"]
    assert rep.batches == BATCHES and rep.fold_report.folded

    # every batch's outputs, kept: the unfolded program's emulation and reference, the folded program's emulation
    prog = fx_program(ep)
    fprog = fx_program(bnfold.fold(ep).model, prog)
    unfolded, folded = Runner(prog, "fp16"), Runner(fprog, "fp16")
    runs = [unfolded.run(*x) for x in xs]
    emulated = {"unfolded": [r.outputs for r in runs], "folded": [folded.run(*x, reference=False).outputs for x in xs]}
    refs = [r.reference for r in runs]

    for which in ("unfolded", "folded"):
        got = d[which]
        outs = emulated[which]
        per_output = [_whole([o[k] for o in outs], [r[k] for r in refs]) for k in range(2)]
        together = _whole([t for o in outs for t in o], [t for r in refs for t in r])
        assert together["nan"] + together["inf"] > 0  # the overflowing batch is in it
        for w, e in [*zip(per_output, got["outputs"]), (together, got)]:
            assert w["nan"] == e["nan"] and w["inf"] == e["inf"] and w["elements"] == e["elements"]
            assert _close(_sqnr(w), e.get("sqnr_db", e.get("output_sqnr_db")))
        for k, e in enumerate(got["outputs"]):  # each output's finite SQNR and largest error
            w = per_output[k]
            assert _close(10 * math.log10(w["signal"] / w["noise"]), e["finite_sqnr_db"])
            assert _close(w["max_abs_err"], e["max_abs_err"])
        # top-1 of the logits against the float model's, over all positions at once
        pred = torch.cat([o[0].argmax(1) for o in outs])
        fp32 = torch.cat([r[0].argmax(1) for r in refs])
        assert _close(float((pred == fp32).double().mean()), got["top1_agreement"])
        assert _close(float((pred == labels).double().mean()), got["accuracy"])
        assert torch.equal(getattr(rep, which).predictions, pred)
        # the mask IoU (of the first output, as the task reads it), pooled over all batches
        a = torch.cat([o[0].reshape(-1) for o in outs]) > 0.5
        b = torch.cat([r[0].reshape(-1).float() for r in refs]) > 0.5
        assert _close(int((a & b).sum()) / int((a | b).sum()), got["mask_iou"])
        batch_sqnr = [_sqnr(_whole(list(o), list(r))) for o, r in zip(outs, refs)]
        assert all(_close(w, g) for w, g in zip(batch_sqnr, got["batch_output_sqnr_db"]))
    assert _close(float((fp32 == labels).double().mean()), rep.fp32_accuracy)


@pytest.mark.parametrize("profile", ["fp16", "fp32"])
def test_the_reference_run_alone_gives_the_runs_reference_bit_for_bit(profile):
    """The prescription's runs and the real runtimes read the float model's outputs of a batch again from the reference
    run alone (``Runner.reference_outputs``): the same values as the audit's run gave, bit for bit (float32 under fp16,
    float64 under fp32)."""
    ep = torch.export.export(_model(), _batches()[0])
    runner = Runner(fx_program(ep), profile)
    for x in _batches():
        again = runner.reference_outputs(*x)
        ran = runner.run(*x).reference
        assert len(again) == len(ran) == 2
        assert all(a.dtype == r.dtype and torch.equal(a, r) for a, r in zip(again, ran))
