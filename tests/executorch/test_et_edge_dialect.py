"""``bnfold.fold`` on ExecuTorch edge programs: same patterns, guards and report as on ATen IRs."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn

pytest.importorskip("executorch.exir")

from et_models import build

import bnfold
from bnfold.report import Code
from bnfold_testutil import assert_matches, export, norm_nodes, randomize_bn, reference, run

FOLDED = ["conv1d", "conv2d_depthwise", "conv3d", "conv_transpose2d_grouped", "linear_bn1d"]


def _shape(text: str) -> str:
    """A report reason with node names and op spellings blanked out (they differ between IRs)."""
    return re.sub(r"\([^)]*\)", "(op)", re.sub(r"'[^'\s]*'", "'x'", text))


@pytest.mark.parametrize("name", FOLDED)
def test_edge_program_folds_like_aten(name):
    model, x = build(name)
    edge = export(model, x, "edge")
    before = [n.name for n in edge.graph.nodes]
    assert len(norm_nodes(edge)) == 1

    result = bnfold.fold(edge)

    assert [f.norm for f in result.report.folded] == ["bn"]
    assert not result.report.skipped
    assert norm_nodes(result.model) == []
    assert [n.name for n in edge.graph.nodes] == before, "the input program was modified"
    # Still an edge program: every op in it is an edge op.
    ops = [n.target for n in result.model.graph.nodes if n.op == "call_function"]
    assert all(type(op).__name__ == "EdgeOpOverload" or "getitem" in str(op) for op in ops), ops
    assert_matches(run(result.model, *x), reference(model, *x))
    # Same report as on the ATen program.
    aten = bnfold.fold(export(model, x)).report
    assert [(f.norm, f.side) for f in aten.folded] == [(f.norm, f.side) for f in result.report.folded]


class _TwoUsers(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3)
        self.bn = nn.BatchNorm2d(6)

    def forward(self, x):
        y = self.conv(x)
        return self.bn(y) + y


class _AfterRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3)
        self.bn = nn.BatchNorm2d(6)

    def forward(self, x):
        return self.bn(torch.relu(self.conv(x)))


@pytest.mark.parametrize("cls", [_TwoUsers, _AfterRelu])
def test_edge_program_skips_like_aten(cls):
    model = randomize_bn(cls().eval())
    x = (torch.randn(1, 3, 8, 8),)
    edge = export(model, x, "edge")

    result = bnfold.fold(edge)

    assert not result.report.folded
    assert len(norm_nodes(result.model)) == 1
    aten = bnfold.fold(export(model, x)).report
    assert [(s.norm, _shape(s.reason)) for s in result.report.skipped] == [
        (s.norm, _shape(s.reason)) for s in aten.skipped
    ]
    assert_matches(run(result.model, *x), reference(model, *x))


def test_edge_only_restricts_layer_kinds():
    model, x = build("linear_bn1d")
    result = bnfold.fold(export(model, x, "edge"), only={"conv"})
    assert not result.report.folded
    assert result.report.skipped[0].code == Code.NOT_REQUESTED
