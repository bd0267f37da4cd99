"""The public surface: what callers catch and read is exported from ``bnfold``; reports are JSON data
with codes; the frontends come from one registry."""

from __future__ import annotations

import json
import typing

import pytest
import torch

import bnfold
from bnfold import frontends
from bnfold.engine import GraphAdapter
from bnfold_testutil import Pair, onnx_conv_bn, randomize_bn


def test_errors_and_kinds_are_exported():
    for name in ("BnfoldError", "ModelFileError", "UnsafeModelError", "TrainingModeError", "NeedsExportError"):
        assert issubclass(getattr(bnfold, name), Exception) and name in bnfold.__all__
    assert issubclass(bnfold.TrainingModeError, bnfold.BnfoldError)
    assert issubclass(bnfold.NeedsExportError, bnfold.ModelFileError)
    assert bnfold.LAYER_KINDS == ("conv", "conv_transpose", "linear") and "batch_norm" in bnfold.NORM_KINDS
    assert bnfold.Lowered and bnfold.Code and not hasattr(bnfold, "PRODUCER_KINDS")
    from bnfold.checks import NeedsExportError, TrainingModeError  # the old home still works

    assert (NeedsExportError, TrainingModeError) == (bnfold.NeedsExportError, bnfold.TrainingModeError)


def test_report_is_json_with_codes():
    report = bnfold.fold(onnx_conv_bn(), exclude="bn").report
    data = json.loads(json.dumps(report.to_dict()))
    assert data["skipped"][0]["code"] == "excluded" == bnfold.Code.EXCLUDED
    assert data["kept_ops"] == []
    folded = bnfold.fold(onnx_conv_bn()).report.to_dict()["folded"][0]
    assert (folded["rule"], folded["layers"], [s["node"] for s in folded["steps"]]) == ("output", ["conv"], ["bn"])
    check = json.loads(json.dumps(bnfold.check(onnx_conv_bn(), exclude="bn").to_dict()))
    assert check["unfoldable"][0]["code"] == "excluded" and not check["strict_ok"]


def test_frontends_come_from_the_registry():
    assert [f.name for f in frontends.FRONTENDS] == ["onnx", "exported_program", "nn_module"]
    assert frontends.frontend_for(onnx_conv_bn()).name == "onnx"
    module = randomize_bn(Pair(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))).eval()
    assert frontends.frontend_for(module).name == "nn_module" and frontends.frontend_for(3) is None
    with pytest.raises(TypeError, match="cannot fold a int"):
        bnfold.fold(3)
    x = torch.randn(1, 3, 8, 8)
    result = bnfold.fold(module, (x,))
    assert isinstance(result.model, torch.fx.GraphModule)  # what FoldResult's docstring says
    assert "GraphModule" in bnfold.FoldResult.__doc__
    assert result.report.stats.params_saved > 0 and bnfold.measure(result.model)[1] > 0


def test_graph_adapter_is_generic_over_node_and_value_handles():
    assert typing.Protocol in GraphAdapter.__mro__ and len(GraphAdapter.__parameters__) == 2
    hints = typing.get_type_hints(GraphAdapter.users)
    assert "value" in hints and "return" in hints


def test_only_and_exclude_are_validated_on_every_entry_point():
    from bnfold.onnx import fold_onnx
    from bnfold.torch_export import fold_program

    model = onnx_conv_bn()
    assert len(fold_onnx(model, only="conv").report.folded) == 1  # a string is a comma-separated list
    for bad in ("convolution", ["conv", 3]):
        with pytest.raises((ValueError, TypeError)):
            fold_onnx(model, only=bad)
    with pytest.raises(TypeError):
        fold_onnx(model, exclude=[1])
    ep = torch.export.export(
        randomize_bn(Pair(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))).eval(), (torch.randn(1, 3, 8, 8),)
    )
    assert fold_program(ep, only="linear").report.skipped[0].code == bnfold.Code.NOT_REQUESTED
    with pytest.raises(ValueError, match="unknown kind"):
        fold_program(ep, only="convolution")


def test_the_registry_loads_saves_and_audits_each_file_format(tmp_path):
    """Each file kind's frontend loads, cost-checks and saves its files (``bnfold.io.models`` goes through
    them), finds the training-mode norms and gives the audit's hooks: one switch for the formats."""
    from bnfold.io import files, models

    module = randomize_bn(Pair(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))).eval()
    ep = torch.export.export(module, (torch.randn(1, 3, 8, 8),))
    for model, name in ((ep, "m.pt2"), (onnx_conv_bn(), "m.onnx")):
        fe = frontends.frontend_for(model)
        assert frontends.for_kind(files.model_kind(name)) is fe and fe.files.kind == files.model_kind(name)
        path = str(tmp_path / name)
        fe.files.save(model, path, None)
        loaded = models.load_model(path)
        assert frontends.frontend_for(loaded.model) is fe and fe.training_norms(loaded.model) == []
        assert fe.numerics().output_rank(loaded.model) == 4
    assert frontends.MODULE.files is None and frontends.MODULE.numerics().output_rank(module) is None
