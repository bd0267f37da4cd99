"""torchvision- and timm-style models (in-place activations, ``+=`` residuals) load without ``--trust``:
``bnfold fold``, ``check --strict`` on the folded file and ``audit`` exit 0, and the folded program
computes what the float64 model computes."""

from __future__ import annotations

import copy
import json

import inplace_models as im
import pytest
import torch

import cli_helpers as h

#: the in-place spellings each model must show in the default IR (so the test covers them)
SPELLINGS = {
    "resnet18": {"aten.relu_.default", "aten.add_.Tensor"},
    "mobilenet_v2": {"aten.hardtanh_.default"},
    "timm_style": {
        "aten.silu_.default",
        "aten.hardswish_.default",
        "aten.add_.Tensor",
        "aten.mul_.Tensor",
        "aten.div_.Tensor",
        "aten.relu6_.default",
    },
}


@pytest.fixture(scope="module", params=sorted(im.MODELS))
def exported(request, tmp_path_factory):
    name = request.param
    model = im.build(name)
    x = torch.randn(*im.INPUT_SHAPE, generator=torch.Generator().manual_seed(1))
    ep = torch.export.export(model, (x,))
    path = tmp_path_factory.mktemp(name) / f"{name}.pt2"
    torch.export.save(ep, str(path))
    with torch.no_grad():
        reference = copy.deepcopy(model).double()(x.double())
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    norms = sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    return {"name": name, "path": path, "x": x, "reference": reference, "targets": targets, "norms": norms}


def test_the_models_use_the_in_place_spellings(exported):
    assert SPELLINGS[exported["name"]] <= exported["targets"]


def test_fold_and_check_strict_without_trust(run, exported, tmp_path):
    folded = tmp_path / "folded.pt2"
    code, out, err = run("fold", exported["path"], "-o", folded, "--json")
    assert code == 0, err
    data = json.loads(out)
    # every batch norm; an in-place add of a constant after a conv (timm's ``gate.add_(3)``) folds besides
    assert sum(1 for f in data["folded"] if f["kind"] == "batch_norm") == exported["norms"], data["folded"]
    ep = torch.export.load(str(folded))
    assert h.norm_count(ep) == 0  # on the graph: no batch norm left
    with torch.no_grad():
        y = ep.module()(exported["x"]).double()
    ref = exported["reference"]
    scale = float(ref.abs().max())
    torch.testing.assert_close(y, ref, rtol=0, atol=1e-4 * scale)
    code, out, err = run("check", "--strict", folded)
    assert code == 0, out + err
    assert "ok, no normalization left" in out


def test_audit_without_trust(run, exported):
    code, out, err = run("audit", exported["path"], "--random", "1", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["input"] == str(exported["path"])
