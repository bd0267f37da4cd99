"""Hypothesis strategies for the fold property: random layer configurations (conv / transposed conv
of 1-3 dims with groups, stride, dilation, padding; linear) and BatchNorm statistics including
extremes (means to 1e3, variances from 1e-8, eps from 1e-9).  Used at the fold-math level
(tests/fold_math/test_fold_property.py, hundreds of examples) and through torch.export
(tests/torch_export/test_property.py, a few dozen)."""

import math

import torch
import torch.nn as nn
from hypothesis import strategies as st

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
