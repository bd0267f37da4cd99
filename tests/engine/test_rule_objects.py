"""The engine's rules are data (:class:`bnfold.engine.rule.Rule`, onnxscript's rewriter style): each has a name,
what it folds and the function that applies it; ``driver.RULES`` runs them in order, and every ``Folded.rule`` in a
report is the name of the rule object that made the entry.  One case per rule module (``rules.py``: output and
input, ``fanout.py``, ``reparam.py``, ``constant_weight.py``), each folding what only that rule folds."""

from __future__ import annotations

import pytest
import torch
from fake_graph import FakeGraph
from test_engine_merge import _repvgg
from test_engine_rules import bn, conv, fold, x_input

import bnfold
from bnfold.engine import driver
from bnfold.engine.constant_weight import CONSTANT
from bnfold.engine.fanout import FANOUT
from bnfold.engine.reparam import MERGE
from bnfold.engine.rule import Rule
from bnfold.engine.rules import INPUT, OUTPUT


def test_the_driver_runs_named_rule_objects():
    assert driver.RULES == (OUTPUT, FANOUT, INPUT, MERGE, CONSTANT)
    assert all(isinstance(r, Rule) and r.folds for r in driver.RULES)
    assert len({r.name for r in driver.RULES}) == len(driver.RULES)


def _output(g: FakeGraph, x: str) -> str:
    return bn(g, conv(g, x, 4, 4, "conv"), 4, "bn")


def _input(g: FakeGraph, x: str) -> str:
    return conv(g, bn(g, x, 4, "bn"), 4, 4, "conv")


def _fanout(g: FakeGraph, x: str) -> str:
    y = bn(g, x, 4, "bn")
    return g.node("add", [conv(g, y, 4, 4, "conv1"), conv(g, y, 4, 4, "conv2")], "add")


@pytest.mark.parametrize(
    ("rule", "build", "norms"),
    [(OUTPUT, _output, ["bn"]), (INPUT, _input, ["bn"]), (FANOUT, _fanout, ["bn"]), (MERGE, _repvgg, ["bn_id"])],
    ids=lambda v: v.name if isinstance(v, Rule) else None,
)
def test_each_rule_names_its_entries(rule, build, norms):
    g = FakeGraph()
    x, feeds = x_input(g)
    g.outputs = [build(g, x)]
    report, _ = fold(g, feeds)
    assert [f.norm for f in report.folded if f.rule == rule.name] == norms, report
    assert {f.rule for f in report.folded} <= {r.name for r in driver.RULES}


class _StandardizedConv(torch.nn.Conv2d):
    """A conv whose weight is standardized in the graph (a batch norm of the constant weight)."""

    def forward(self, x):
        flat = self.weight.reshape(1, self.out_channels, -1)
        w = torch.nn.functional.batch_norm(flat, None, None, training=True, momentum=0.0, eps=1e-5)
        return torch.nn.functional.conv2d(x, w.reshape_as(self.weight), self.bias)


def test_the_constant_rule_names_its_entries():
    x = torch.randn(1, 3, 8, 8)
    ep = torch.export.export(_StandardizedConv(3, 4, 3).eval(), (x,))
    report = bnfold.fold(ep).report
    assert [(f.rule, f.side) for f in report.folded] == [(CONSTANT.name, "weight")], report


def test_a_rule_left_out_folds_nothing_of_its_own(monkeypatch):
    """The rules are the tuple's objects: without OUTPUT a conv -> bn stays (nothing else folds it)."""
    monkeypatch.setattr(driver, "RULES", tuple(r for r in driver.RULES if r is not OUTPUT))
    g = FakeGraph()
    x, feeds = x_input(g)
    g.outputs = [_output(g, x)]
    report, _ = fold(g, feeds)
    assert not report.folded and [s.norm for s in report.skipped] == ["bn"], report
