"""Spellings torchvision's own models export, accepted by the safe loader without ``--trust``.

* ``nn.Dropout(inplace=True)`` (MobileNetV3, EfficientNet, MNASNet) is ``aten.dropout_`` in the
  default IR: an in-place op whose functional form (``dropout``) names its argument ``input``, not
  ``self``.  It is accepted on an intermediate and refused on a graph input or a parameter.
* ``ModuleDict`` keys such as ``block1-0`` (RegNet) reach the parameter paths and module FQNs.
  torch.fx pastes a path part that is not an identifier into a string literal, so ``-`` is
  accepted and a quote still is not.
"""

from __future__ import annotations

import crafted as c
import pytest
import torch
from torch import nn

from bnfold.io.pt2 import inspection


class DropoutNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.2, inplace=True)
        self.head = nn.Conv2d(4, 2, 1)

    def forward(self, x):
        return self.head(self.drop(torch.relu(self.bn(self.conv(x)))))


class DropsInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.2, inplace=True)

    def forward(self, x):
        return self.drop(x) * 2


class DashNet(nn.Module):
    """A ModuleDict keyed like torchvision's RegNet stages."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleDict({"block1-0": nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))})

    def forward(self, x):
        return self.blocks["block1-0"](x).relu()


def _dropout_writes_parameter(doc):
    node = next(n for n in doc["graph_module"]["graph"]["nodes"] if n["target"] == "torch.ops.aten.dropout_.default")
    spec = next(s for s in doc["graph_module"]["signature"]["input_specs"] if "parameter" in s)
    node["inputs"][0]["arg"] = {"as_tensor": {"name": spec["parameter"]["arg"]["name"]}}


def _quote_in_path(doc):
    for spec in doc["graph_module"]["signature"]["input_specs"]:
        if "parameter" in spec:
            spec["parameter"]["parameter_name"] = spec["parameter"]["parameter_name"].replace("-", '"-')


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("spellings")
    x = torch.randn(1, 3, 8, 8)
    dash = torch.export.export(DashNet().eval(), (x,))
    torch.export.save(dash.run_decompositions(), str(d / "dash_decomposed.pt2"))
    return {
        "dropout": c.export(d / "dropout.pt2", DropoutNet(), (x,)),
        "drops input": c.export(d / "drops_input.pt2", DropsInput(), (torch.randn(3, 4),)),
        "dash": c.export(d / "dash.pt2", DashNet(), (x,)),
        "dash decomposed": d / "dash_decomposed.pt2",
    }


def test_in_place_dropout_and_dashed_module_names_fold_without_trust(files, tmp_path):
    ep = torch.export.load(str(files["dropout"]))
    assert "aten.dropout_.default" in {str(n.target) for n in ep.graph.nodes}
    assert any("block1-0" in s.target for s in torch.export.load(str(files["dash"])).graph_signature.input_specs)
    argvs = []
    for name in ("dropout", "dash", "dash decomposed"):
        out = tmp_path / f"{name.replace(' ', '_')}_folded.pt2"
        argvs += [["check", files[name]], ["fold", files[name], "-o", out], ["check", "--strict", out]]
    runs = c.run_bnfold(tmp_path, *argvs)
    for i in range(0, len(runs), 3):
        unfolded, fold, folded = runs[i : i + 3]
        assert unfolded["code"] == 1, unfolded  # loaded without --trust, and the batch norm is foldable
        assert fold["code"] == 0, fold
        assert folded["code"] == 0, folded
    for name in ("dropout", "dash", "dash decomposed"):
        folded = torch.export.load(str(tmp_path / f"{name.replace(' ', '_')}_folded.pt2"))
        assert not any("batch_norm" in str(n.target) for n in folded.graph.nodes), name


def test_in_place_dropout_of_state_and_quoted_names_are_still_refused(files, tmp_path):
    problems = inspection.inspect_pt2_bytes(files["drops input"].read_bytes(), "drops input").unsafe
    assert len(problems) == 1 and "dropout_" in problems[0] and "in place on graph input" in problems[0], problems
    bad = c.edit_program(files["dropout"], tmp_path / "bad_dropout.pt2", _dropout_writes_parameter)
    problems = inspection.inspect_pt2_bytes(bad.read_bytes(), "bad").unsafe
    assert len(problems) == 1 and "in place on parameter" in problems[0], problems
    quoted = c.edit_program(files["dash"], tmp_path / "quoted.pt2", _quote_in_path)
    problems = inspection.inspect_pt2_bytes(quoted.read_bytes(), "quoted").unsafe
    assert len(problems) == 1 and "not an identifier" in problems[0], problems
