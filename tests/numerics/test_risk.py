"""The per-normalization risk: predicted from the statistics, confirmed by the emulated run.

* A batch norm with a dead channel (running variance 0, constant input 5) is safe at the model's eps
  (1e-3) but overflows fp16 at a runtime eps of 1e-9: ``x*scale`` = 5 * 31623 > 65504.  Its input's
  headroom alone (65504 / 5) would call it safe; the verdict must not.
* An analytic case: a 1x1 conv whose 64 output channels have means 100..1000 and standard deviations
  ~3, followed by a BatchNorm holding exactly those statistics (kappa ~400).  The predicted local
  SQNR of the unfolded and the folded layer, and the loss between them, match the emulated
  measurement within 2 dB (the model's expectations; 64 channels average the per-channel constants
  the runtime rounds).
"""

import json
import math

import pytest
import torch
from numerics_helpers import batch_norm_with
from torch import nn

import bnfold
from bnfold.numerics.risk import DEGRADE_DB

TOLERANCE_DB = 2.0


class DeadChannel(nn.Module):
    """conv (channel 0: zero weights, bias 5: a constant 5) -> BatchNorm(eps 1e-3) -> ReLU."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 1)
        with torch.no_grad():
            self.conv.weight[0].zero_()
            self.conv.bias.copy_(torch.tensor([5.0, 0.0]))
        self.bn = batch_norm_with(2, mean=[5.0, 0.0], var=[0.0, 1.0], eps=1e-3)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def _dead_channel_audit(bn_eps):
    torch.manual_seed(0)
    x = torch.randn(4, 3, 6, 6) * 0.5
    return bnfold.audit(DeadChannel(), [(x,)], profile="htp", bn_eps=bn_eps)


def test_a_norm_that_overflows_only_at_the_runtime_eps_is_flagged():
    safe = _dead_channel_audit(None)
    (n,) = safe.norms
    assert n.verdict != "overflows" and n.headroom > 1
    assert n.risk.what_if is not None and n.risk.what_if.overflows  # the QNN-eps what-if predicts it
    assert any("--bn-eps 1e-09" in line for line in safe.advice())
    assert safe.unfolded.output.nonfinite == 0

    rep = _dead_channel_audit(1e-9)
    (n,) = rep.norms
    assert n.kappa == pytest.approx(5 / math.sqrt(1e-3), rel=1e-6)  # at the model's eps
    assert n.runtime_kappa == pytest.approx(5 / math.sqrt(1e-9), rel=1e-6)  # at the runtime's
    assert n.input_max_abs == pytest.approx(5.0)  # the input alone has ~13000x headroom...
    assert n.verdict == "overflows"  # ...but x*scale and bias' do not fit in fp16
    assert n.headroom < 1
    risk = n.risk
    assert not risk.model.overflows and risk.runtime.overflows  # predicted from the statistics
    assert risk.runtime.intermediates["x*scale"] == pytest.approx(5 / math.sqrt(1e-9), rel=1e-3)
    assert risk.measured.headroom_reference < 1 and risk.measured.output_nonfinite > 0  # and measured
    assert risk.cause in ("x*scale overflows", "bias' overflows")
    # the emulation agrees: the unfolded output holds NaN (inf - inf), the folded one none
    assert rep.unfolded.output.nonfinite > 0 and math.isnan(rep.unfolded.output.sqnr_db)
    assert rep.folded.output.nonfinite == 0 and math.isfinite(rep.folded.output.sqnr_db)
    text = rep.table()
    assert "overflows" in text and "breaks the unfolded model" in text
    doc = json.loads(json.dumps(rep.to_dict(), allow_nan=False))
    assert doc["end_to_end"]["unfolded"]["output_sqnr_db"] is None
    assert doc["end_to_end"]["unfolded"]["nan"] + doc["end_to_end"]["unfolded"]["inf"] > 0
    assert doc["normalizations"][0]["risk"]["verdict"] == "overflows"


def analytic_conv_bn(seed, channels=64):
    """A 1x1 conv with per-channel means 100..1000 (its bias plus a shifted input) and the BatchNorm
    holding its exact statistics; inputs are fp16-exact."""
    torch.manual_seed(seed)
    conv = nn.Conv2d(8, channels, 1, bias=True)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(channels, 8, 1, 1).half().float())
        conv.bias.copy_(torch.rand(channels) * 900 + 100)
    x = (torch.randn(64, 8, 8, 8) + 3).half().float()
    with torch.no_grad():
        c = conv(x).double()
    bn = batch_norm_with(channels, mean=c.mean((0, 2, 3)), var=c.var((0, 2, 3), unbiased=False))
    return nn.Sequential(conv, bn).eval(), x


@pytest.mark.parametrize("profile", ["htp", "fp16"])
@pytest.mark.parametrize("seed", [0, 1])
def test_predicted_sqnr_matches_the_emulation(profile, seed):
    model, x = analytic_conv_bn(seed)
    rep = bnfold.audit(model, [(x[:32],), (x[32:],)], profile=profile)
    (n,) = rep.norms
    (row,) = rep.layers
    pred = n.risk.effective
    assert n.kappa > 100
    assert abs(pred.unfolded_sqnr_db - row.local_unfolded.sqnr_db) < TOLERANCE_DB
    assert abs(pred.folded_sqnr_db - row.local_folded.sqnr_db) < TOLERANCE_DB
    assert abs(pred.loss_db - n.risk.measured.loss_db) < TOLERANCE_DB
    assert pred.loss_db > 30 and n.verdict == "degrades"
    assert n.risk.cause == "kappa"  # roundings of values near the mean, times the scale


def test_a_centred_norm_is_safe():
    """The same layer with its means removed (kappa ~0): no loss predicted, none measured."""
    model, x = analytic_conv_bn(0)
    with torch.no_grad():
        model[0].bias.zero_()
        model[1].running_mean.zero_()
    x = x - 3
    rep = bnfold.audit(model, [(x,)], profile="htp")
    (n,) = rep.norms
    assert n.verdict == "safe"
    assert n.risk.effective.loss_db < DEGRADE_DB and n.risk.measured.loss_db < DEGRADE_DB


def test_a_runtime_eps_near_the_variance_is_named_as_the_cause():
    """Channels whose running variance is comparable to the model's eps: a runtime eps of 1e-9 changes
    their scale (a systematic error, not rounding); predicted and measured alike."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 16, 1, bias=False)
    with torch.no_grad():
        conv.weight.mul_(3e-3)  # outputs with variance ~1e-5, the size of eps
    x = torch.randn(32, 3, 8, 8)
    with torch.no_grad():
        c = conv(x).double()
    bn = batch_norm_with(16, mean=c.mean((0, 2, 3)), var=c.var((0, 2, 3), unbiased=False))
    model = nn.Sequential(conv, bn).eval()
    plain = bnfold.audit(model, [(x,)], profile="htp")
    rt = bnfold.audit(model, [(x,)], profile="htp", bn_eps=1e-9)
    (p,), (n,) = plain.norms, rt.norms
    assert p.verdict == "safe" and p.risk.risky_at_what_if  # the what-if at 1e-9 predicts what the run then measures
    assert n.verdict == "degrades" and n.risk.cause == "runtime eps"
    assert abs(n.risk.runtime.loss_db - n.risk.measured.loss_db) < TOLERANCE_DB


def test_risk_of_many_norms_at_once_is_each_norms_own():
    """The risk model runs over every norm's channels at once (``NormBatch``): each norm's prediction and
    measurement equal those of the norm alone, across channel counts, a norm without statistics, one whose
    statistics are undefined (var + eps < 0) and one with inconsistent channel counts."""
    from bnfold.numerics.probe import NormProbe
    from bnfold.numerics.profiles import get_profile
    from bnfold.numerics.risk import NormBatch, NormStats, measure_intermediates, predict_at

    g = torch.Generator().manual_seed(3)
    f64 = dict(dtype=torch.float64)

    def stats(c, scale=1.0):
        mean = torch.randn(c, generator=g, **f64) * scale
        var = torch.rand(c, generator=g, **f64) * scale
        return NormStats(mean, var, torch.randn(c, generator=g, **f64), torch.randn(c, generator=g, **f64), 1e-5)

    undefined = stats(4)
    undefined.var[1] = -1.0
    broken = stats(5)
    broken.gamma = torch.ones(3, **f64)
    norms = [stats(16, 100.0), None, stats(3), undefined, broken, stats(64, 1e-3)]
    norms[2].layer_bias, norms[2].rounded_input = torch.randn(3, generator=g, **f64), False
    probes = [
        None if st is None else NormProbe("n", st.mean - 1, st.mean + 1, st.mean - 2, st.mean + 3) for st in norms
    ]
    for name in ("fp16", "htp", "fp32"):
        prof = get_profile(name)
        together = predict_at(NormBatch(norms), prof, [None, 1e-9])  # both eps in one call
        measured = measure_intermediates(NormBatch(norms), prof, [1e-5] * len(norms), probes)
        for i, st in enumerate(norms):
            alone = [predict_at(NormBatch([st]), prof, [eps])[0][0] for eps in (None, 1e-9)]
            for a, b in zip(together, alone):
                assert (a[i] is None) == (b is None) == (i in (1, 3, 4)), (name, i)
                if b is not None:
                    _same(a[i].to_dict(), b.to_dict(), (name, i))
            m = measure_intermediates(NormBatch([st]), prof, [1e-5], [probes[i]])[0]
            assert (measured[i] is None) == (m is None), (name, i)
            if m is not None:
                _same(measured[i].to_dict(), m.to_dict(), (name, i))
        assert together[0][0].kappa > 1 and together[0][5].kappa_channel < 64


def _flat(d: dict, path: str = "") -> dict:
    """A nested dict's leaves by path (numbers comparable with ``pytest.approx``)."""
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{path}{k}.") if isinstance(v, dict) else {path + k: v})
    return out


def _same(got: dict, want: dict, where) -> None:
    """Equal leaves, numbers to 1e-12 (the per-norm sums are added in another order)."""
    got, want = _flat(got), _flat(want)
    assert got.keys() == want.keys(), where
    for k, w in want.items():
        if isinstance(w, float) and not isinstance(w, bool):
            assert got[k] == pytest.approx(w, rel=1e-12, abs=1e-300), (where, k)
        else:
            assert got[k] == w, (where, k)
