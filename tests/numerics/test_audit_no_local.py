"""``audit(local=False)`` (``bnfold audit`` without ``--local``): no local run of any segment, in either program and
either format, and the rest of the report as the full audit's: the same cumulative errors, end-to-end numbers and
predicted risk; the local errors and the measured loss of a fold are absent, and a verdict says it rests on the
prediction.  The plot's worst layers are then those of the lowest cumulative SQNR."""

from __future__ import annotations

import pytest
import torch
from numerics_helpers import onnx_keeping_batch_norms
from test_risk import analytic_conv_bn
from torch import nn

import bnfold
from bnfold.numerics.runner import Runner


def _net():
    """The analytic conv + BatchNorm of ``test_risk`` (a norm that degrades by ~40 dB under fp16) and a second
    conv + BatchNorm after a ReLU, in eval mode with calibrated statistics."""
    first, x = analytic_conv_bn(0)
    net = nn.Sequential(first, nn.ReLU(), nn.Conv2d(64, 16, 3, padding=1), nn.BatchNorm2d(16, momentum=None)).eval()
    net[3].train()
    with torch.no_grad():
        net(x)  # the second norm's running statistics: those of this batch (the first norm's stay)
    return net.eval(), x[:8]


def _without_local(d: dict) -> dict:
    """``to_dict()`` less what the local runs add: the layers' local errors and the norms' measured loss and
    verdicts (which the measured loss may move); and less the fold's time and whether the local runs ran."""
    d["fold_report"]["summary"].pop("seconds")
    d.pop("local_runs")
    for layer in d["layers"]:
        layer.pop("local")
    for norm in d["normalizations"]:
        risk = norm.pop("risk")
        norm["predicted"] = risk["predicted_model_eps"]
        norm["measured"] = {k: v for k, v in risk["measured"].items() if k != "loss_db"}
    d.pop("what_to_do")
    return d


@pytest.mark.parametrize("fmt", ["module", "onnx"])
def test_no_local_run_and_the_rest_of_the_report_unchanged(fmt, monkeypatch):
    net, x = _net()
    model = net if fmt == "module" else onnx_keeping_batch_norms(net, x)
    full = bnfold.audit(model, [(x,)], profile="fp16")
    assert all(r.local_unfolded is not None and r.local_folded is not None for r in full.layers)
    assert all(n.risk.measured.loss_db is not None for n in full.norms)

    def no_local_run(*_):
        raise AssertionError("a local run")

    monkeypatch.setattr(Runner, "_local", no_local_run)
    fast = bnfold.audit(model, [(x,)], profile="fp16", local=False)
    assert len(fast.layers) == len(full.layers) == 2
    assert all(r.local_unfolded is None and r.local_folded is None for r in fast.layers)
    assert all(n.risk.measured.loss_db is None for n in fast.norms)
    degrades = [n for n in fast.norms if n.verdict == "degrades"]
    assert len(degrades) == 1 and "(predicted)" in degrades[0].risk.detail
    assert (fast.to_dict()["local_runs"], full.to_dict()["local_runs"]) == (False, True)
    assert _without_local(fast.to_dict()) == _without_local(full.to_dict())


def test_the_same_on_a_trained_paddleocr_model():
    """PP-OCR cls (the rapidocr wheel's ONNX: 54 layer rows, 35 batch norms, hundreds of small values measured in
    batches beside the local errors): the report without the local runs is the full one less what they add."""
    import onnx
    from paddleocr_models import model_path

    model = onnx.load(model_path("cls"))
    x = torch.randn(1, 3, 48, 192, generator=torch.Generator().manual_seed(0))
    full = bnfold.audit(model, [(x,)], tensors=False)
    fast = bnfold.audit(model, [(x,)], tensors=False, local=False)
    assert sum(r.local_unfolded is not None for r in full.layers) > 50
    assert all(r.local_unfolded is None and r.local_folded is None for r in fast.layers)
    assert _without_local(fast.to_dict()) == _without_local(full.to_dict())


def test_the_plot_of_an_audit_without_local_runs_shows_the_worst_cumulative_layers():
    plt = pytest.importorskip("matplotlib.pyplot")
    from bnfold.numerics.plot import _worst_panel

    net, x = _net()
    for local, kind in ((True, "local"), (False, "cumulative")):
        rep = bnfold.audit(net, [(x,)], local=local)
        worst = rep.worst_layers(2, local=local)[::-1]  # the panel's rows, bottom up
        prefix = "local_" if local else ""
        bars = [getattr(r, prefix + w).sqnr_db for w in ("unfolded", "folded") for r in worst]
        fig, ax = plt.subplots()
        try:
            _worst_panel(ax, rep, 25)
            assert ax.get_title() == f"worst 2 layers (lowest {kind} SQNR, unfolded)"
            assert [t.get_text() for t in ax.get_yticklabels()] == [r.title for r in worst]
            assert [b.get_width() for b in ax.patches] == bars  # all below the axis top (100 dB)
        finally:
            plt.close(fig)


def test_the_chart_names_the_reference_the_profile_runs():
    """The whole-model panel's axis names the reference run's dtype: float32 under a profile that stores fp16,
    float64 under fp32 (it read "vs float64" under every profile)."""
    plt = pytest.importorskip("matplotlib.pyplot")
    from bnfold.numerics.plot import _depth_panel

    net, x = _net()
    for profile, dtype in (("fp16", "float32"), ("htp", "float32"), ("fp32", "float64")):
        rep = bnfold.audit(net, [(x,)], profile=profile, local=False)
        fig, ax = plt.subplots()
        try:
            _depth_panel(ax, rep)
            assert ax.get_ylabel() == f"cumulative SQNR vs the {dtype} reference (dB)"
        finally:
            plt.close(fig)
