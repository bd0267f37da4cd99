"""Plain normalizations and the affine spelled out after them (``bnfold.engine.spelled``), through the fake
adapter: a ``group_norm`` node with no affine of its own, then ``* w + b`` by per-channel constants.  The rules
fold the ops; the report names the normalization and its kind, or lists it as skipped when they stay."""

from __future__ import annotations

import pytest
from fake_graph import FakeGraph
from test_engine_rules import conv, fold, rand, x_input

from bnfold.report import Code


def spelled_norm(g: FakeGraph, x: str, c: int, name: str = "gn", bias: bool = True) -> str:
    """``group_norm(x, 2) * w + b``, the affine per channel ([C, 1, 1] constants)."""
    y = g.node("group_norm", [x], name, groups=2)
    y = g.node("mul", [y, g.const(f"{name}.w", rand(c, 1, 1, lo=0.5, hi=1.5))], f"{name}_mul")
    return g.node("add", [y, g.const(f"{name}.b", rand(c, 1, 1))], f"{name}_add") if bias else y


@pytest.mark.parametrize("bias", [True, False])
def test_spelled_affine_folds_as_its_normalization(bias):
    g = FakeGraph()
    x, feeds = x_input(g)
    g.outputs = [conv(g, spelled_norm(g, x, 4, bias=bias), 4, 6, "conv")]
    report, _ = fold(g, feeds)
    assert g.ops() == ["group_norm", "conv"] and not report.skipped and not report.kept_ops
    (f,) = report.folded
    assert (f.norm, f.node, f.kind, f.rule) == ("gn", "gn", "group_norm", "input")
    assert f.removed == ["gn_mul", "gn_add"][: 2 if bias else 1]


def test_spelled_affine_into_two_layers_is_one_entry():
    g = FakeGraph()
    x, feeds = x_input(g)
    y = spelled_norm(g, x, 4)
    g.outputs = [conv(g, y, 4, 6, "c1"), conv(g, y, 4, 3, "c2")]
    report, _ = fold(g, feeds)
    (f,) = report.folded
    assert (f.norm, f.kind, f.rule, f.layers) == ("gn", "group_norm", "fanout", ["c1", "c2"])


@pytest.mark.parametrize(
    ("after", "code"),
    [("relu", Code.NO_LAYER), ("padded", Code.SHIFT_PADDING)],
)
def test_spelled_affine_that_stays_is_a_skipped_normalization(after, code):
    g = FakeGraph()
    x, feeds = x_input(g)
    y = spelled_norm(g, conv(g, x, 4, 4, "c0"), 4)
    g.outputs = [g.node("relu", [y], "relu") if after == "relu" else conv(g, y, 4, 6, "conv", k=3, pad=1)]
    report, _ = fold(g, feeds)
    assert "gn_mul" in [n.name for n in g.live()] and not report.folded and not report.kept_ops
    (s,) = report.skipped
    assert (s.norm, s.node, s.code, s.producer) == ("gn", "gn", code, "c0")


@pytest.mark.parametrize(
    ("kw", "code"), [({"only": "batch_norm"}, Code.NOT_REQUESTED), ({"exclude": "g*"}, Code.EXCLUDED)]
)
def test_spelled_normalization_left_alone_keeps_its_affine(kw, code):
    g = FakeGraph()
    x, feeds = x_input(g)
    g.outputs = [conv(g, spelled_norm(g, x, 4), 4, 6, "conv")]
    report, _ = fold(g, feeds, **kw)
    assert g.ops() == ["group_norm", "mul", "add", "conv"] and not report.folded
    assert [(s.norm, s.code) for s in report.skipped] == [("gn", code)]


def test_plain_norm_without_an_affine_is_no_entry():
    g = FakeGraph()
    x, feeds = x_input(g)
    y = g.node("group_norm", [x], "gn", groups=2)
    g.outputs = [conv(g, g.node("mul", [g.node("relu", [y], "relu"), g.const("s", rand(4, 1, 1))], "m"), 4, 6, "c")]
    report, _ = fold(g, feeds)
    (f,) = report.folded  # the mul after the relu is no affine of the norm
    assert (f.kind, f.norm) == ("", "affine m") and not report.skipped
