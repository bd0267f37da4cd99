"""Property, at the fold-math level: for random layer configurations and BatchNorm statistics,
including extremes, the layer with the weight and bias that ``fold_math`` computes (rounded once to
float32, as the fold writes them) equals the float64 reference of layer -> BatchNorm.  No export: the
300 examples take seconds (tests/torch_export/test_property.py checks the same property through
torch.export on a few dozen)."""

import copy

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bn_property import bn_stats, layer_configs
from bnfold import fold_math
from bnfold.errors import FoldError
from bnfold.report import Code
from bnfold_testutil import Pair, assert_matches, record_count, record_max, reference


def folded_layer(layer, bn, kind: str):
    """``layer`` with ``bn`` folded into it by the fold math (weight and bias in the layer's dtype)."""
    aff = fold_math.batch_norm_affine(bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias)
    groups = getattr(layer, "groups", 1)
    weight, bias = fold_math.fold_output_affine(layer.weight, layer.bias, aff, kind, groups, dtype=layer.weight.dtype)
    out = copy.deepcopy(layer)
    with torch.no_grad():
        out.weight.copy_(weight)
    out.bias = torch.nn.Parameter(fold_math.cast_checked(bias, layer.weight.dtype, f"{kind} bias"))
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(config=layer_configs(), data=st.data(), seed=st.integers(0, 99))
def test_folded_layer_equals_float64_reference(config, data, seed):
    kind, layer, bn_cls, channels, shape = config
    mean, var, gamma, beta, eps = data.draw(bn_stats(channels))
    bn = bn_cls(channels, eps=eps)
    with torch.no_grad():
        bn.running_mean.copy_(mean), bn.running_var.copy_(var), bn.weight.copy_(gamma), bn.bias.copy_(beta)
    model = Pair(layer, bn).eval()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    ref = reference(model, x)
    try:
        folded = folded_layer(layer, bn, kind)
    except FoldError as e:  # only a folded tensor leaving float32's range may stop the fold
        assert e.code == Code.CAST_RANGE, e
        record_count("fold-math property: examples refused for float32 range")
        return
    with torch.no_grad():
        out = folded(x)
    err = assert_matches(out, ref, rel=1e-4)
    record_max("fold-math property: largest error / output magnitude", err)
    record_count("fold-math property: examples folded and compared")
