"""The re-parameterization rule (``bnfold.engine.reparam``) through the fake adapter: summed conv
branches of one value become one conv, exact against the unfolded graph in float64; a sum that
does not merge is a ``kept_ops`` note on its add with a ``MERGE_*`` code, never a skipped norm."""

from __future__ import annotations

from fake_graph import FakeGraph
from test_engine_rules import bn, conv, fold, x_input

from bnfold.report import Code


def _repvgg(g: FakeGraph, x: str) -> str:
    """BN(conv3x3 pad 1) + BN(conv1x1) + BN(x)."""
    a = bn(g, conv(g, x, 4, 4, "dense", k=3, pad=1), 4, "bn_dense")
    b = bn(g, conv(g, x, 4, 4, "one", k=1), 4, "bn_one")
    return g.node("add", [g.node("add", [a, b], "add_0"), bn(g, x, 4, "bn_id")], "add_1")


def test_summed_branches_merge_into_the_largest_conv():
    g = FakeGraph()
    x, feeds = x_input(g)
    g.outputs = [_repvgg(g, x)]
    report, adapter = fold(g, feeds)
    assert g.ops() == ["conv"] and not report.skipped and not report.kept_ops, report
    (m,) = report.merged
    assert (m.into, m.pattern, m.node) == ("dense", "conv3x3+conv1x1+identity", "add_1"), m
    assert sorted(f.norm for f in report.folded) == ["bn_dense", "bn_id", "bn_one"], report
    merged = [f for f in report.folded if f.rule == "merge"]
    assert [f.norm for f in merged] == ["bn_id"] and merged[0].kind == "batch_norm", report
    assert {"add_0", "add_1", "one", "bn_id"} <= set(merged[0].removed)
    assert report.to_dict()["merged"][0]["into"] == "dense" and report.to_dict()["summary"]["merged"] == 1


def test_a_refused_merge_is_a_note_on_the_add():
    g = FakeGraph()
    x, feeds = x_input(g)
    relu = g.node("relu", [conv(g, x, 4, 4, "c1", k=1)], "act")
    s_act = g.node("add", [conv(g, x, 4, 4, "c3", k=3, pad=1), relu], "sum_act")
    shared = conv(g, x, 4, 4, "d1", k=1)  # also a graph output
    s_shared = g.node("add", [conv(g, x, 4, 4, "d3", k=3, pad=1), shared], "sum_shared")
    g.outputs = [s_act, s_shared, shared]
    report, _ = fold(g, feeds)
    assert not report.merged and not report.skipped, report
    codes = sorted((k.op, k.code) for k in report.kept_ops)
    assert codes == [("sum_act", Code.MERGE_ACTIVATION), ("sum_shared", Code.MERGE_SHARED)], report
