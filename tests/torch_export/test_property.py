"""Property: for random layer configurations and BatchNorm statistics, including extremes,
the folded program equals the float64 reference of the unfolded model -- through torch.export, in the
default and the decomposed IR.  The same property at the fold-math level, with hundreds of examples,
is tests/fold_math/test_fold_property.py; here a few dozen examples check that the engine finds the
pattern and writes what the fold math computes."""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bnfold
from bn_property import bn_stats, layer_configs
from bnfold.report import Code
from bnfold_testutil import Pair, assert_matches, export, norm_nodes, record_count, record_max, reference, run


@settings(max_examples=24, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
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
