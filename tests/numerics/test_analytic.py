"""One conv + BatchNorm with a known kappa: the htp error the audit measures matches the prediction.

The conv's output has mean ~1000 and standard deviation ~4 (its bias is 1000),
and the BatchNorm holds exactly those statistics, so
``kappa = |mean| / sqrt(var + eps) ~ 250``.  Unfolded, the conv output is
stored in fp16 before the BatchNorm subtracts the mean: a relative rounding
error of at most u = 2^-11, RMS about u/sqrt(3) (uniform), of ~1000.  The
normalized output carries that error times kappa, relative to its own size:
a predicted SQNR of ``-20 log10(kappa * u / sqrt(3))``.  Folded, the conv computes the normalized value
directly and rounds it once: an SQNR near fp16's own ~-20 log10(u).
"""

import math

import pytest
import torch
from numerics_helpers import batch_norm_with
from torch import nn

import bnfold

U = 2.0**-11


def conv_bn_with_known_kappa(seed=0, n=64):
    torch.manual_seed(seed)
    conv = nn.Conv2d(4, 1, 1, bias=True)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor([2.0, -1.5, 1.0, 3.0]).reshape(1, 4, 1, 1))
        conv.bias.fill_(1000.0)
    x = (torch.randn(n, 4, 8, 8) * 0.9).half().float()  # fp16-exact inputs: no input rounding error
    with torch.no_grad():
        c = conv(x).double()
    mean, var = c.mean().item(), c.var(unbiased=False).item()
    bn = batch_norm_with(1, mean=[mean], var=[var])
    return nn.Sequential(conv, bn).eval(), x, c, mean, var


@pytest.mark.parametrize("profile", ["htp", "fp16"])
def test_unfolded_error_follows_kappa_and_folding_removes_it(profile):
    model, x, c, mean, var = conv_bn_with_known_kappa()
    kappa = abs(mean) / math.sqrt(var + 1e-5)
    assert 200 < kappa < 300
    rep = bnfold.audit(model, [(x[:32],), (x[32:],)], profile=profile)

    (norm,) = rep.norms
    assert norm.kappa == pytest.approx(kappa, rel=1e-6)
    assert norm.input_max_abs == pytest.approx(c.abs().max().item(), rel=1e-6)
    # the smallest headroom of any stored value: the input's in float64, or the emulated (rounded) input's
    assert norm.headroom == pytest.approx(65504 / c.abs().max().item(), rel=1e-3)
    assert norm.headroom <= 65504 / c.abs().max().item()
    assert norm.folded

    (layer,) = rep.layers
    predicted = -20 * math.log10(kappa * U / math.sqrt(3))
    measured = layer.unfolded.sqnr_db
    assert abs(measured - predicted) < 10, (measured, predicted)  # same order of magnitude (within ~3x)
    assert rep.unfolded.output.sqnr_db == pytest.approx(measured)
    folded = layer.folded.sqnr_db
    assert folded > -20 * math.log10(U) - 10  # about fp16's own precision
    assert folded > measured + 30  # an error ~kappa times smaller
    # end to end is measured against the unfolded model's float64 output, the layer against the folded
    # program's own float64 run: they differ by the float32 rounding of the folded weights, far below fp16's
    assert rep.folded.output.sqnr_db == pytest.approx(folded, abs=0.1)


def test_small_kappa_costs_nothing():
    """The same layer with its mean removed (kappa ~0): unfolded and folded are equally good."""
    model, x, *_ = conv_bn_with_known_kappa()
    with torch.no_grad():
        model[0].bias.zero_()
        model[1].running_mean.zero_()
    rep = bnfold.audit(model, [(x,)], profile="htp")
    assert rep.norms[0].kappa < 0.01
    (layer,) = rep.layers
    assert abs(layer.unfolded.sqnr_db - layer.folded.sqnr_db) < 6
    assert layer.unfolded.sqnr_db > -20 * math.log10(U) - 10
