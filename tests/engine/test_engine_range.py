"""The fp16 range rewrite (``bnfold.engine.range``) on the fake graph: format-neutral, exact in float64."""

from __future__ import annotations

import pytest
import torch
from fake_graph import FakeAdapter, FakeGraph

from bnfold.engine import range_planner
from bnfold.engine.range import Limits, Planner, rescale_graph
from bnfold.engine.range_apply import apply
from bnfold.report import Code

LIMITS = Limits(65504 / 16, 1e4)


def _peaks(g: FakeGraph, x: torch.Tensor) -> dict:
    env = {"x": x.double(), **{k: v.double() for k, v in g.consts.items()}}
    out = {"x": float(x.abs().max())}
    for n in g.live():
        env[n.output] = g._eval(n, {v: env.get(v) for v in n.inputs})
        out[n.output] = float(env[n.output].abs().max())
    return out


def _hot_conv(tail: str = "conv") -> FakeGraph:
    """conv (4 of 8 channels hot) -> relu -> maxpool -> conv (compensating) or a softmax."""
    torch.manual_seed(0)
    g = FakeGraph()
    x = g.input("x", 2, 3, 8, 8)
    w = torch.randn(8, 3, 3, 3) * 8
    w[:4] *= 4096
    y = g.node("conv", [x, g.const("w1", w), g.const("b1", torch.randn(8))], name="conv1", pad=1)
    y = g.node("maxpool", [g.node("relu", [y], name="relu")], name="pool")
    if tail == "conv":
        w2 = torch.randn(4, 8, 3, 3)
        w2[:, :4] /= 4096
        y = g.node("conv", [y, g.const("w2", w2), g.const("b2", torch.randn(4))], name="conv2", pad=1)
    else:
        y = g.node("softmax", [y], name="softmax")
    g.outputs = [y]
    return g


def test_hot_channels_move_across_relu_and_pool_into_the_next_conv_exactly():
    g = _hot_conv()
    x = torch.randn(2, 3, 8, 8)
    before = g.run({"x": x})[0]
    peaks = _peaks(g, x)
    assert peaks["conv1_out"] > 65504
    entries = rescale_graph(FakeAdapter(g), peaks, LIMITS)
    assert [e.code for e in entries] == [Code.RESCALED]
    assert entries[0].kind == "cross_layer" and entries[0].muls == 0
    assert set(entries[0].nodes) == {"conv1", "conv2"}
    after = g.run({"x": x})[0]
    assert torch.equal(before, after)  # powers of two: not one bit differs in float64
    assert max(_peaks(g, x)[v] for v in ("conv1_out", "relu_out", "pool_out")) <= LIMITS.value


def test_a_reader_with_no_scale_rule_refuses_and_leaves_the_graph():
    g = _hot_conv("softmax")
    x = torch.randn(2, 3, 8, 8)
    before = g.run({"x": x})[0]
    entries = rescale_graph(FakeAdapter(g), _peaks(g, x), LIMITS)
    assert {e.value for e in entries} == {"conv1_out", "relu_out", "pool_out"}  # each too large, none movable
    assert all(e.code is Code.NONLINEAR_READER and e.factor == 1.0 and not e.nodes for e in entries)
    assert torch.equal(before, g.run({"x": x})[0])


def test_a_norm_absorbs_the_scale_with_its_eps_times_s_squared():
    torch.manual_seed(1)
    g = FakeGraph()
    x = g.input("x", 2, 4, 5, 5)
    y = g.node("conv", [x, g.const("w", torch.randn(4, 4, 1, 1) * 3e5)], name="conv")
    g.outputs = [g.node("group_norm", [y], name="norm", groups=2, eps=1e-3)]
    xs = torch.randn(2, 4, 5, 5)
    before = g.run({"x": xs})[0]
    entries = rescale_graph(FakeAdapter(g), _peaks(g, xs), LIMITS)
    assert [e.code for e in entries] == [Code.RESCALED] and entries[0].kind == "norm"
    k = -round(torch.log2(torch.tensor(entries[0].factor)).item())
    assert g.by_name("norm").attrs["eps"] == 1e-3 * 2.0 ** (-2 * k)
    assert torch.allclose(before, g.run({"x": xs})[0], rtol=1e-12, atol=1e-12)


def test_a_constant_factor_takes_the_scale_and_the_reading_layer_the_inverse():
    """A hot product of a graph input and a constant: the constant takes the scale, the next layer its inverse."""
    g = FakeGraph()
    x = g.input("x", 2, 4)
    big = g.node("mul", [x, g.const("c", torch.tensor(4096.0))], name="big")  # the constant takes it
    g.outputs = [g.node("linear", [big, g.const("w", torch.randn(3, 4) / 4096)], name="head")]
    xs = torch.randn(2, 4) * 8
    before = g.run({"x": xs})[0]
    entries = rescale_graph(FakeAdapter(g), _peaks(g, xs), LIMITS)
    assert [e.code for e in entries] == [Code.RESCALED] and entries[0].muls == 0
    assert torch.equal(before, g.run({"x": xs})[0])


def test_applying_a_plan_does_not_read_a_constant_operand_again_for_its_check(monkeypatch):
    """``choose_k`` refused a NaN or infinity in every constant the plan rescales (its span), so ``apply`` reads a
    constant operand only where the adapter scales it (``scaled_operand``), not once more to look for them."""
    g = FakeGraph()
    x = g.input("x", 2, 4)
    big = g.node("mul", [x, g.const("c", torch.tensor(4096.0))], name="big")
    g.outputs = [g.node("linear", [big, g.const("w", torch.randn(3, 4) / 4096)], name="head")]
    adapter, reads = FakeAdapter(g), []
    planner = Planner(adapter, _peaks(g, torch.randn(2, 4) * 8), LIMITS)
    p = planner.plan("big_out")
    k, met = planner.choose_k(p)
    assert met and k > 0 and list(p.operands) == [(g.nodes[0], 1)]
    constant = adapter.constant
    monkeypatch.setattr(adapter, "constant", lambda value: reads.append(value) or constant(value))
    assert apply(planner, p, k, "range_big_out") == ["big", "head"]
    assert "c" not in reads


@pytest.mark.parametrize("held", [True, False])
def test_the_planner_reads_a_layer_it_wrote_again_its_weights_and_spans(held, monkeypatch):
    """One planner serves every rewrite: a layer's weights (held, or read again where large) and their spans are
    those written, not the ones read before (conv2 takes the inverse scale in its weight)."""
    if not held:
        monkeypatch.setattr(range_planner, "LARGE_BYTES", 0)  # every weight counts as large: read at use
    g = _hot_conv()
    x = torch.randn(2, 3, 8, 8)
    planner = Planner(FakeAdapter(g), _peaks(g, x), LIMITS)
    conv1, conv2 = planner.written["conv1_out"], planner.written["conv2_out"]
    assert (planner.layer(conv2)[1] is not None) is held
    spans = {node: planner.spans(node) for node in (conv1, conv2)}
    p = planner.plan("conv1_out")
    k, met = planner.choose_k(p)
    assert met and k > 0
    assert apply(planner, p, k, "range_conv1_out") == ["conv1", "conv2"]
    for node, name, e in ((conv1, "w1", -k), (conv2, "w2", k)):
        assert torch.equal(planner.weights(node).weight, g.consts[name])
        assert planner.spans(node) == (range_planner.span(g.consts[name]), planner.spans(node)[1])
        assert planner.spans(node)[0] == tuple(v * 2.0**e for v in spans[node][0])  # powers of two: exact


def _mul_chain(blocks: int) -> FakeGraph:
    """``blocks`` times: a conv whose output passes the limit, summed with a softmax of the block's input (no scale
    rule: a multiply goes after it), and a conv that takes the inverse scale: every rewrite inserts a multiply."""
    torch.manual_seed(0)
    g = FakeGraph()
    h = g.input("x", 1, 4, 4, 4)
    for i in range(blocks):
        y = g.node("conv", [h, g.const(f"w{i}", torch.randn(4, 4, 1, 1) * 4096), g.const(f"b{i}", torch.randn(4))])
        z = g.node("add", [y, g.node("softmax", [h])])
        h = g.node("conv", [z, g.const(f"v{i}", torch.randn(4, 4, 1, 1) / 4096), g.const(f"c{i}", torch.randn(4))])
    g.outputs = [h]
    return g


@pytest.mark.parametrize("held", [True, False])
def test_rewrites_that_insert_multiplies_read_each_weight_once_and_again_where_edited(held, monkeypatch):
    """A rewrite that inserts a multiply adds nodes: the planner reads again the nodes around it, not every layer's
    weights (a disk read each for a streamed model's large ones).  Weight reads stay within a bound linear in the
    layers and the layers the rewrites edit (on the whole-graph re-read: 3280 held / 3600 not, for 80 layers).  A
    large weight is read with its values only for its span, once, and for each write (its span after a write is the
    old one scaled: 480 reads before, for 80 layers each edited once, 160 now); asking whether a node is a layer,
    and the check of a scale its span shows exact, ask for its shape only (``values=False``)."""
    if not held:
        monkeypatch.setattr(range_planner, "LARGE_BYTES", 0)  # every weight counts as large: read at use
    g = _mul_chain(40)
    x = torch.randn(1, 4, 4, 4)
    before = g.run({"x": x})[0]
    adapter, reads = FakeAdapter(g), []
    weights = adapter.weights

    def counted(layer, values=True):  # held: every call is a read (this adapter gives values either way)
        if values or held:
            reads.append(layer.node)
        return weights(layer, values)

    monkeypatch.setattr(adapter, "weights", counted)
    entries = rescale_graph(adapter, _peaks(g, x), LIMITS)
    rewritten = [e for e in entries if e.factor != 1.0]
    assert len(rewritten) >= 40 and all(e.muls >= 1 for e in rewritten)
    layers, edited = 80, sum(len(e.nodes) for e in entries)
    # held: each layer read once, and again where a rewrite edits it; large: its span once, and each write
    assert len(reads) <= layers + edited, (len(reads), layers, edited)
    assert torch.equal(before, g.run({"x": x})[0])  # powers of two: not one bit differs in float64


@pytest.mark.parametrize("far_first", [True, False])
def test_a_region_limit_backtracked_does_not_code_a_later_refusal(far_first, monkeypatch):
    """``out = (relu^6(a) * b) + g``: the walk back tries ``a``'s relu chain first (past a region of 4 values:
    backtracked, the product takes the scale through ``b`` instead), then the hot graph input ``g`` refuses: nothing
    before it takes a scale (no_absorber), whichever operand the sum reads first."""
    monkeypatch.setattr(range_planner, "MAX_REGION", 4)
    g = FakeGraph()
    h = g.input("a", 2, 4)
    for _ in range(6):
        h = g.node("relu", [h])
    prod = g.node("mul", [h, g.input("b", 2, 4)])
    hot_in = g.input("g", 2, 4)
    out = g.node("add", [prod, hot_in] if far_first else [hot_in, prod], name="out")
    g.outputs = [out]
    peaks = {v: 1.0 for v in g.shapes}
    peaks.update({v: 1e6 for v in g.shapes if v not in ("b",)})
    planner = Planner(FakeAdapter(g), peaks, LIMITS)
    with pytest.raises(range_planner.Refused) as refused:
        planner.plan(out)
    assert refused.value.code is Code.NO_ABSORBER, refused.value.reason


def _hot_chain(blocks: int) -> FakeGraph:
    """``blocks`` times the same block: a conv whose output passes the limit, a relu, a conv that brings it back (its
    inverse: the chain's scale does not drift with depth, one hot value per block)."""
    torch.manual_seed(0)
    g = FakeGraph()
    h = g.input("x", 1, 4, 4, 4)
    for i in range(blocks):
        d = torch.rand(4) + 1
        w, v = (torch.diag(s).reshape(4, 4, 1, 1) for s in (d * 4096, 1 / (d * 4096)))
        y = g.node("conv", [h, g.const(f"w{i}", w), g.const(f"b{i}", torch.randn(4))])
        z = g.node("relu", [y])
        h = g.node("conv", [z, g.const(f"v{i}", v), g.const(f"c{i}", torch.randn(4))])
    g.outputs = [h]
    return g


class _Counting:
    """``adapter`` with every question counted: one per call, plus one per item of a whole-graph list (a walk)."""

    WALKS = ("ordered_nodes", "values", "layers", "norms", "plain_norms")

    def __init__(self, adapter):
        self._adapter, self.calls, self.walked = adapter, 0, 0

    def __getattr__(self, name):
        got = getattr(self._adapter, name)
        if not callable(got):
            return got

        def counted(*args, **kwargs):
            self.calls += 1
            out = got(*args, **kwargs)
            if name in self.WALKS:
                self.walked += len(out)
            return out

        return counted


def _range_work(blocks: int, monkeypatch, chain=_hot_chain) -> tuple[dict, list]:
    g = chain(blocks)
    x = torch.randn(1, 4, 4, 4)
    adapter, steps = _Counting(FakeAdapter(g)), []
    step = Planner.step
    monkeypatch.setattr(Planner, "step", lambda self: steps.append(1) or step(self))
    entries = rescale_graph(adapter, _peaks(g, x), LIMITS)
    monkeypatch.undo()
    return {"questions": adapter.calls, "nodes walked": adapter.walked, "plan steps": len(steps)}, entries


def test_the_range_planners_work_grows_as_the_blocks_do(monkeypatch):
    """The same block 4x as many times: the planner's questions to the graph, the nodes its whole-graph walks read and
    its plans' steps grow 4x, not faster (a planner per value, or a whole-graph walk per rewrite, is quadratic)."""
    (small, few), (large, many) = _range_work(10, monkeypatch), _range_work(40, monkeypatch)
    for entries, blocks in ((few, 10), (many, 40)):
        assert sum(e.code is Code.RESCALED for e in entries) == blocks  # each block's hot value, once
    for what in small:
        assert 3 * small[what] < large[what] <= 4 * small[what], (what, small[what], large[what])


def test_rewrites_that_insert_multiplies_walk_the_graph_a_bounded_number_of_times(monkeypatch):
    """Every rewrite on ``_mul_chain`` inserts a multiply: the planner places it in the graph order from the node
    the adapter says it follows (``mul_placed``), not by numbering the whole order again.  The nodes its whole-graph
    walks read grow 4x for 4x the blocks (numbering the order again per rewrite: 556 -> 7621, 13.7x)."""
    (small, few), (large, many) = _range_work(10, monkeypatch, _mul_chain), _range_work(40, monkeypatch, _mul_chain)
    for entries, blocks in ((few, 10), (many, 40)):
        assert sum(e.muls for e in entries if e.factor != 1.0) == blocks  # a multiply per block
    assert 3 * small["nodes walked"] < large["nodes walked"] <= 4 * small["nodes walked"], (small, large)


def test_a_placed_multiply_sorts_where_the_adapter_put_it():
    """Multiplies after a graph input (first in the order), twice after one node (the later one first), and after a
    multiply itself: the keys :meth:`Planner.place` gives them sort the graph as ``ordered_nodes`` lists it."""
    g = _hot_conv()
    adapter = FakeAdapter(g)
    planner = Planner(adapter, {}, LIMITS)
    relisted = planner.relisted
    for value in ("x", "x", "relu_out", "conv1_out", "conv1_out", "conv2_out"):
        made = adapter.producer(adapter.insert_mul(value, 2.0, None))
        assert planner.place(made) == [made]
    made = adapter.producer(adapter.insert_mul(adapter.inputs(made)[0], 2.0, None))  # after a placed multiply
    assert planner.place(made) == [made]
    nodes = adapter.ordered_nodes()
    assert len(nodes) == 4 + 7 and set(planner.order) == set(nodes)
    assert planner.in_order(reversed(nodes)) == nodes
    assert planner.relisted == relisted  # not numbered again
