"""The engine through a fake adapter (plain Python objects): every rule, the retry policy, exclude /
only, lowering and the fold-math error path.  Each fold is checked on the graph (what is left, what
the report says) and numerically, against the unfolded graph evaluated in float64."""

from __future__ import annotations

import copy

import pytest
import torch
from fake_graph import FakeAdapter, FakeGraph

from bnfold.engine import broadcast_shape, fold_graph
from bnfold.report import Code

G = torch.Generator().manual_seed(0)


def rand(*shape, lo=-1.0, hi=1.0):
    return torch.rand(*shape, generator=G, dtype=torch.float64) * (hi - lo) + lo


def bn(g: FakeGraph, x: str, c: int, name: str, gamma=None, **attrs) -> str:
    w = g.const(f"{name}.w", rand(c, lo=0.5, hi=1.5) if gamma is None else gamma)
    b = g.const(f"{name}.b", rand(c))
    m = g.const(f"{name}.mean", rand(c))
    v = g.const(f"{name}.var", rand(c, lo=0.5, hi=2.0))
    return g.node("bn", [x, w, b, m, v], name, **attrs)


def conv(g: FakeGraph, x: str, cin: int, cout: int, name: str, k=1, bias=True, dtype=torch.float64, **attrs) -> str:
    groups = attrs.get("groups", 1)
    w = g.const(f"{name}.weight", rand(cout, cin // groups, k, k).to(dtype))
    inputs = [x, w] + ([g.const(f"{name}.bias", rand(cout).to(dtype))] if bias else [])
    return g.node("conv", inputs, name, **attrs)


def fold(g: FakeGraph, feeds: dict, **kwargs):
    """Fold ``g`` in place; check that it computes what it computed before (float64, scaled tolerance)."""
    before = copy.deepcopy(g)
    adapter = FakeAdapter(g, kwargs.pop("groups", None))
    tol = kwargs.pop("tol", 1e-9)  # float64 weights; a float32 weight is rounded once
    report = fold_graph(adapter, **kwargs)
    for out, ref in zip(g.run(feeds), before.run(feeds)):
        assert torch.allclose(out, ref, rtol=0, atol=tol * (1 + ref.abs().max().item())), (out - ref).abs().max()
    return report, adapter


def x_input(g: FakeGraph, c=4, hw=5) -> tuple[str, dict]:
    x = g.input("x", 2, c, hw, hw)
    return x, {"x": rand(2, c, hw, hw)}


# ------------------------------------------------------------------ output side


def test_output_side_folds_a_batch_norm_and_records_the_edit():
    g = FakeGraph()
    x, feeds = x_input(g)
    g.outputs = [bn(g, conv(g, x, 4, 6, "conv"), 6, "bn")]
    report, adapter = fold(g, feeds)
    assert g.ops() == ["conv"] and not report.skipped and not report.kept_ops
    (f,) = report.folded
    assert (f.norm, f.into, f.into_node, f.side, f.rule, f.pattern) == (
        "bn",
        "conv",
        "conv",
        "output",
        "output",
        "conv+batch_norm",
    )
    assert [(s.node, s.action) for s in f.steps] == [("bn", "removed")] and f.removed == ["bn"]
    assert f.layers == ["conv"] and adapter.writes == ["conv"] and adapter.removed == ["bn"]
    assert f.kind == "batch_norm"
    assert not any(k.startswith("bn.") for k in g.consts)  # its parameters went with it
    assert report.to_dict()["folded"][0]["steps"] == [{"node": "bn", "op": "batch_norm", "action": "removed"}]


def test_output_chain_through_a_hop_and_elementwise_ops():
    g = FakeGraph()
    x, feeds = x_input(g)
    y = g.node("identity", [conv(g, x, 4, 6, "conv", bias=False)], "id")
    y = g.node("mul", [bn(g, y, 6, "bn"), g.const("s", rand(1, 6, 1, 1))], "mul")
    g.outputs = [g.node("add", [y, g.const("t", rand(6, 1, 1))], "add")]
    report, adapter = fold(g, feeds)
    assert g.ops() == ["conv", "identity"]
    (f,) = report.folded
    assert [(s.node, s.action) for s in f.steps] == [
        ("id", "kept"),
        ("bn", "removed"),
        ("mul", "removed"),
        ("add", "removed"),
    ]
    assert f.removed == adapter.removed == ["bn", "mul", "add"] and not f.bias_added
    assert g.by_name("conv").inputs[2] == "conv_bias"  # a layer without a bias gets one


def test_retry_drops_the_farthest_step_on_the_output_side():
    g = FakeGraph()
    x, feeds = x_input(g)
    y = bn(g, conv(g, x, 4, 6, "conv", dtype=torch.float32), 6, "bn1")
    g.outputs = [bn(g, y, 6, "bn2", gamma=torch.full((6,), 1e39, dtype=torch.float64))]
    report, _ = fold(g, feeds, tol=1e-6)
    assert [f.norm for f in report.folded] == ["bn1"] and g.ops() == ["conv", "bn"]
    (s,) = report.skipped
    assert (s.norm, s.code) == ("bn2", Code.CAST_RANGE)


def test_a_value_with_two_users_stops_the_chain():
    g = FakeGraph()
    x, feeds = x_input(g)
    c = conv(g, x, 4, 6, "conv")
    g.outputs = [bn(g, c, 6, "bn"), g.node("relu", [c], "relu")]
    report, _ = fold(g, feeds)
    assert not report.folded and [s.code for s in report.skipped] == [Code.SHARED_VALUE]


def test_a_normalization_that_can_never_fold_keeps_its_code():
    g = FakeGraph()
    x, feeds = x_input(g)
    g.outputs = [bn(g, conv(g, x, 4, 6, "conv"), 6, "bn", training=True)]
    report, _ = fold(g, feeds)
    assert [s.code for s in report.skipped] == [Code.TRAINING_MODE]


def test_no_layer_next_to_it():
    g = FakeGraph()
    x, feeds = x_input(g)
    g.outputs = [g.node("relu", [bn(g, g.node("relu", [x], "r1"), 4, "bn")], "r2")]
    report, _ = fold(g, feeds)
    (s,) = report.skipped
    assert s.code == Code.NO_LAYER and s.producer == ""
    assert report.to_dict()["skipped"][0]["code"] == "no_layer"


def test_a_lost_channel_axis_stops_a_normalization():
    g = FakeGraph()
    x, feeds = x_input(g)
    y = g.node("flatten", [conv(g, x, 4, 2, "conv")], "flat")  # [2, 50]
    g.outputs = [bn(g, y, 50, "bn")]
    report, _ = fold(g, feeds)
    assert not report.folded and [s.code for s in report.skipped] == [Code.AXIS_LOST]


def test_a_layer_that_cannot_hold_a_bias_gets_an_add_after_the_chain():
    g = FakeGraph()
    x = g.input("x", 3, 5)
    feeds = {"x": rand(3, 5)}
    y = g.node("bmm", [x, g.const("fc.weight", rand(4, 5))], "fc")
    y = g.node("mul", [y, g.const("s", rand(4))], "mul")
    g.outputs = [g.node("add", [y, g.const("t", rand(4))], "add")]
    report, _ = fold(g, feeds)
    (f,) = report.folded
    assert f.bias_added and g.ops() == ["bmm", "add"]
    assert list(g.consts["fc_added_bias"].shape) == broadcast_shape(4, -1, 2, True) == [1, 4]


def test_a_lone_shift_after_a_layer_without_a_bias_stays():
    g = FakeGraph()
    x = g.input("x", 3, 5)
    y = g.node("bmm", [x, g.const("fc.weight", rand(4, 5))], "fc")
    g.outputs = [g.node("add", [y, g.const("t", rand(4))], "add")]
    report, _ = fold(g, {"x": rand(3, 5)})
    assert not report.folded and g.ops() == ["bmm", "add"]


# ------------------------------------------------------------------ through a maximum (max-pool)


def _gamma(c: int, negative: tuple = ()) -> torch.Tensor:
    gamma = rand(c, lo=0.5, hi=1.5)
    gamma[list(negative)] *= -1
    return gamma


@pytest.mark.parametrize("negative", [(), (2,)])
def test_output_side_through_a_max_pool_needs_a_non_negative_scale(negative):
    g = FakeGraph()
    x, feeds = x_input(g, hw=6)
    y = g.node("maxpool", [conv(g, x, 4, 6, "conv", k=3, pad=1)], "pool")
    g.outputs = [g.node("relu", [bn(g, y, 6, "bn", gamma=_gamma(6, negative))], "relu")]
    report, _ = fold(g, feeds)
    if not negative:
        (f,) = report.folded
        assert [(s.node, s.action) for s in f.steps] == [("pool", "kept"), ("bn", "removed")]
        assert g.ops() == ["conv", "maxpool", "relu"]
    else:
        assert not report.folded and g.ops() == ["conv", "maxpool", "bn", "relu"]
        (s,) = report.skipped
        assert s.code == Code.NEGATIVE_SCALE and "1 of 6 channels" in s.reason


def test_the_scale_that_crosses_is_the_composed_one():
    """bn1 (negative on a channel) does not cross the pool; bn2 after it does: only bn2's sign counts.
    Then a second negative BN after the pool: bn2 * bn3 is positive there, so both cross."""
    g = FakeGraph()
    x, feeds = x_input(g, hw=6)
    y = bn(g, conv(g, x, 4, 6, "conv", k=3, pad=1), 6, "bn1", gamma=_gamma(6, (1,)))
    y = bn(g, g.node("maxpool", [y], "pool"), 6, "bn2", gamma=_gamma(6, (3,)))
    g.outputs = [g.node("relu", [bn(g, y, 6, "bn3", gamma=_gamma(6, (3,)))], "relu")]
    report, _ = fold(g, feeds)
    assert [f.norm for f in report.folded] == ["bn1", "bn2", "bn3"] and not report.skipped
    assert g.ops() == ["conv", "maxpool", "relu"]


def test_input_side_through_a_max_pool():
    g = FakeGraph()
    x, feeds = x_input(g, hw=6)
    for negative, name in (((), "ok"), ((0,), "neg")):
        y = g.node("maxpool", [bn(g, g.node("relu", [x], f"r_{name}"), 4, f"bn_{name}", gamma=_gamma(4, negative))])
        g.outputs.append(conv(g, y, 4, 3, f"conv_{name}"))
    report, _ = fold(g, feeds)
    assert [f.norm for f in report.folded] == ["bn_ok"] and report.folded[0].side == "input"
    assert [(s.norm, s.code) for s in report.skipped] == [("bn_neg", Code.NEGATIVE_SCALE)]


def test_fanout_does_not_cross_a_max_pool_unchecked():
    """A BN feeding two convs, one of them through a max-pool: the consumer's own hops must not take
    a maximum (nothing would check the sign there), so the fan-out folds nowhere."""
    g = FakeGraph()
    x, feeds = x_input(g, hw=6)
    y = bn(g, g.node("relu", [x], "r"), 4, "bn", gamma=_gamma(4, (0,)))
    g.outputs = [conv(g, y, 4, 3, "c1"), conv(g, g.node("maxpool", [y], "pool"), 4, 3, "c2")]
    report, _ = fold(g, feeds)
    assert not report.folded and [s.code for s in report.skipped] == [Code.FANOUT_NOT_ALL_LAYERS]


# ------------------------------------------------------------------ input side and fan-out


def test_input_side_folds_into_an_unpadded_conv():
    g = FakeGraph()
    x, feeds = x_input(g)
    g.outputs = [conv(g, bn(g, g.node("relu", [x], "relu"), 4, "bn"), 4, 6, "conv", k=3)]
    report, _ = fold(g, feeds)
    (f,) = report.folded
    assert (f.side, f.rule, f.pattern, f.removed) == ("input", "input", "batch_norm+conv", ["bn"])
    assert g.ops() == ["relu", "conv"]


def test_input_side_retry_keeps_the_shift_before_a_padded_conv():
    g = FakeGraph()
    x, feeds = x_input(g)
    y = g.node("add", [g.node("relu", [x], "relu"), g.const("t", rand(4, 1, 1))], "add")
    y = g.node("mul", [y, g.const("s", rand(4, 1, 1))], "mul")
    g.outputs = [conv(g, y, 4, 6, "conv", k=3, pad=1)]
    report, _ = fold(g, feeds)
    (f,) = report.folded
    assert f.removed == ["mul"] and g.ops() == ["relu", "add", "conv"]
    assert not report.skipped  # an add is no normalization: a note, never a skip
    (k,) = report.kept_ops
    assert (k.op, k.code) == ("add", Code.SHIFT_PADDING)


def test_a_shift_before_a_padded_conv_is_a_skip_with_its_code():
    g = FakeGraph()
    x, feeds = x_input(g)
    g.outputs = [conv(g, bn(g, g.node("relu", [x], "relu"), 4, "bn"), 4, 6, "conv", k=3, pad=1)]
    report, _ = fold(g, feeds)
    assert not report.folded and [s.code for s in report.skipped] == [Code.SHIFT_PADDING]


def test_fanout_folds_into_every_layer_or_none():
    g = FakeGraph()
    x, feeds = x_input(g)
    y = bn(g, g.node("relu", [x], "relu"), 4, "bn")
    g.outputs = [conv(g, y, 4, 6, "conv1"), conv(g, y, 4, 3, "conv2", k=3)]
    report, adapter = fold(g, feeds)
    (f,) = report.folded
    assert (f.rule, f.side, f.layers, f.into_node) == ("fanout", "input", ["conv1", "conv2"], "conv1, conv2")
    assert adapter.writes == ["conv1", "conv2"] and g.ops() == ["relu", "conv", "conv"]


def test_fanout_with_a_padded_consumer_folds_nowhere():
    g = FakeGraph()
    x, feeds = x_input(g)
    y = bn(g, g.node("relu", [x], "relu"), 4, "bn")
    g.outputs = [conv(g, y, 4, 6, "conv1"), conv(g, y, 4, 3, "conv2", k=3, pad=1)]
    report, adapter = fold(g, feeds)
    assert not report.folded and not adapter.writes
    assert [s.code for s in report.skipped] == [Code.SHIFT_PADDING]


def test_fanout_with_a_user_that_is_not_a_layer():
    g = FakeGraph()
    x, feeds = x_input(g)
    y = bn(g, g.node("relu", [x], "relu"), 4, "bn")
    g.outputs = [conv(g, y, 4, 6, "conv1"), g.node("relu", [y], "relu2")]
    report, _ = fold(g, feeds)
    assert [s.code for s in report.skipped] == [Code.FANOUT_NOT_ALL_LAYERS]


def test_residual_add_of_two_values_is_neither_a_skip_nor_a_note():
    g = FakeGraph()
    x, feeds = x_input(g)
    c = bn(g, conv(g, x, 4, 4, "conv"), 4, "bn")
    g.outputs = [g.node("add", [c, x], "residual")]
    report, _ = fold(g, feeds)
    assert len(report.folded) == 1 and not report.skipped and not report.kept_ops


# ------------------------------------------------------------------ the fold-math error path


@pytest.mark.parametrize("where", ["after", "before"])
def test_a_layer_reporting_impossible_groups_is_a_skip_not_an_exception(where):
    g = FakeGraph()
    x, feeds = x_input(g, c=8)
    if where == "after":
        g.outputs = [bn(g, conv(g, x, 8, 8, "conv"), 8, "bn")]
    else:
        g.outputs = [conv(g, bn(g, g.node("relu", [x], "relu"), 8, "bn"), 8, 8, "conv")]
    report, adapter = fold(g, feeds, groups={"conv": 3})  # 8 channels are not divisible by 3 groups
    assert not report.folded and not adapter.writes
    (s,) = report.skipped
    assert s.code == Code.LAYER_SHAPE and "groups=3" in s.reason


def test_fanout_with_impossible_groups_is_a_skip():
    g = FakeGraph()
    x, feeds = x_input(g, c=8)
    y = bn(g, g.node("relu", [x], "relu"), 8, "bn")
    g.outputs = [conv(g, y, 8, 8, "conv1"), conv(g, y, 8, 8, "conv2")]
    report, _ = fold(g, feeds, groups={"conv2": 3})
    assert not report.folded and [s.code for s in report.skipped] == [Code.LAYER_SHAPE]


# ------------------------------------------------------------------ exclude, only, lowering


def test_exclude_a_normalization_or_a_layer():
    def graph():
        g = FakeGraph()
        x, feeds = x_input(g)
        g.outputs = [bn(g, conv(g, x, 4, 6, "conv"), 6, "bn")]
        return g, feeds

    for pattern, reason in (("b?", "excluded by --exclude b?"), ("co*", "excluded by --exclude co* (layer conv)")):
        g, feeds = graph()
        report, _ = fold(g, feeds, exclude=pattern)
        assert [(s.code, s.reason) for s in report.skipped] == [(Code.EXCLUDED, reason)]
        assert g.ops() == ["conv", "bn"]


def test_only_is_validated_and_restricts_the_kinds():
    g = FakeGraph()
    x, feeds = x_input(g)
    g.outputs = [bn(g, conv(g, x, 4, 6, "conv"), 6, "bn")]
    report, _ = fold(g, feeds, only="linear")
    assert not report.folded and [s.code for s in report.skipped] == [Code.NOT_REQUESTED]
    report, _ = fold(g, feeds, only={"batch_norm"})
    assert len(report.folded) == 1
    with pytest.raises(ValueError, match="unknown kind"):
        fold_graph(FakeAdapter(g), only={"convolution"})


def test_lowering_a_batch_norm_that_cannot_fold():
    g = FakeGraph()
    x, feeds = x_input(g)
    g.outputs = [g.node("relu", [bn(g, g.node("relu", [x], "r1"), 4, "bn")], "r2")]
    report, _ = fold(g, feeds, lower=True)
    assert g.ops() == ["relu", "mul", "add", "relu"] and not report.skipped
    (low,) = report.lowered
    assert (low.norm, low.code) == ("bn", Code.NO_LAYER)
    assert list(g.consts["bn_scale"].shape) == [1, 4, 1, 1]


def test_broadcast_shapes():
    assert broadcast_shape(6, 1, 4, True) == [1, 6, 1, 1]
    assert broadcast_shape(6, 1, 4, False) == [6, 1, 1]
    assert broadcast_shape(6, -1, 3, False) == [6]
    assert broadcast_shape(6, 1, None, True) == [6]
