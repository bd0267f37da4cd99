"""Property: for random layer configurations and BatchNorm statistics, including extremes,
the folded program equals the float64 reference of the unfolded model."""

import math

import torch
import torch.nn as nn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bnfold
from bnfold.report import Code
from bnfold_testutil import Pair, assert_matches, export, norm_nodes, record_count, record_max, reference, run

LAYERS = {
    ("conv", 1): (nn.Conv1d, nn.BatchNorm1d),
    ("conv", 2): (nn.Conv2d, nn.BatchNorm2d),
    ("conv", 3): (nn.Conv3d, nn.BatchNorm3d),
    ("conv_transpose", 1): (nn.ConvTranspose1d, nn.BatchNorm1d),
    ("conv_transpose", 2): (nn.ConvTranspose2d, nn.BatchNorm2d),
    ("conv_transpose", 3): (nn.ConvTranspose3d, nn.BatchNorm3d),
}


@st.composite
def layer_configs(draw):
    kind = draw(st.sampled_from(["conv", "conv_transpose", "linear"]))
    bias = draw(st.booleans())
    if kind == "linear":
        cin, cout = draw(st.integers(1, 6)), draw(st.integers(1, 6))
        return kind, nn.Linear(cin, cout, bias=bias), nn.BatchNorm1d, cout, (draw(st.integers(2, 4)), cin)
    dims = draw(st.integers(1, 3))
    groups = draw(st.integers(1, 3))
    cin, cout = groups * draw(st.integers(1, 3)), groups * draw(st.integers(1, 3))
    k = draw(st.integers(1, 3))
    stride, dilation = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    layer_cls, bn_cls = LAYERS[(kind, dims)]
    if kind == "conv":
        padding = draw(st.integers(0, 2))
        layer = layer_cls(cin, cout, k, stride=stride, padding=padding, dilation=dilation, groups=groups, bias=bias)
    else:
        padding = draw(st.integers(0, dilation * (k - 1)))
        output_padding = draw(st.integers(0, max(stride, dilation) - 1))
        layer = layer_cls(
            cin,
            cout,
            k,
            stride=stride,
            padding=padding,
            output_padding=output_padding,
            groups=groups,
            dilation=dilation,
            bias=bias,
        )
    size = dilation * (k - 1) + 1 + draw(st.integers(0, 3))
    return kind, layer, bn_cls, cout, (draw(st.integers(1, 2)), cin) + (size,) * dims


def _log_uniform(lo, hi):
    return st.floats(math.log10(lo), math.log10(hi)).map(lambda e: 10.0**e)


@st.composite
def bn_stats(draw, channels):
    vec = lambda s: torch.tensor(draw(st.lists(s, min_size=channels, max_size=channels)), dtype=torch.float32)
    mean = vec(st.floats(-1e3, 1e3))
    var = vec(_log_uniform(1e-8, 1e2))
    gamma = vec(st.floats(-3, 3))
    beta = vec(st.floats(-10, 10))
    eps = draw(_log_uniform(1e-9, 1e-1))
    return mean, var, gamma, beta, eps


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(config=layer_configs(), data=st.data(), ir=st.sampled_from(["default", "decomposed"]), seed=st.integers(0, 99))
def test_fold_equals_float64_reference(config, data, ir, seed):
    kind, layer, bn_cls, channels, shape = config
    mean, var, gamma, beta, eps = data.draw(bn_stats(channels))
    bn = bn_cls(channels, eps=eps)
    with torch.no_grad():
        bn.running_mean.copy_(mean), bn.running_var.copy_(var), bn.weight.copy_(gamma), bn.bias.copy_(beta)
    model = Pair(layer, bn).eval()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    ep = export(model, (x,), ir)
    result = bnfold.fold(ep)
    ref = reference(model, x)
    if result.report.skipped:  # only a folded tensor leaving float32's range may stop the fold here
        assert all(s.code == Code.CAST_RANGE for s in result.report.skipped), result.report
        assert len(norm_nodes(result.model)) == 1
        record_count("property: examples skipped for float32 range")
        return
    assert norm_nodes(result.model) == []
    err = assert_matches(run(result.model, x), ref, rel=1e-4)
    record_max("property: largest error / output magnitude", err)
    record_count("property: examples folded and compared")
