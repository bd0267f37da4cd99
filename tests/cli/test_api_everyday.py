"""The Python API of issue 13: bnfold.check, paths through the safe loader, ``only`` as a string,
``exclude`` patterns (torch and ONNX), report names, and ``import bnfold`` staying light."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import bnfold
import cli_helpers as h
from bnfold.errors import ModelFileError, UnsafeModelError
from bnfold.report import Code


def test_check_returns_data(models):
    ep = torch.export.load(str(models["conv_bn"]))
    result = bnfold.check(ep)
    assert isinstance(result, bnfold.CheckResult)
    assert not result.ok and not result.strict_ok
    assert [f.norm for f in result.foldable] == ["bn"] and result.unfoldable == []
    assert json.loads(json.dumps(result.to_dict()))["foldable"][0]["into"] == "conv"
    left = bnfold.check(models["bn_only"])  # a path goes through the safe loader
    assert left.ok and not left.strict_ok and [s.norm for s in left.unfoldable] == ["bn"]
    assert bnfold.check(str(models["conv"])).strict_ok


def test_fold_accepts_a_pt2_path(models):
    result = bnfold.fold(models["conv_bn"])
    assert isinstance(result.model, torch.export.ExportedProgram) and len(result.report.folded) == 1


def test_a_path_is_loaded_safely(models, tmp_path):
    marker = tmp_path / "PWNED"
    bad = h.hostile_sample_inputs(models["conv_bn"], tmp_path / "bad.pt2", marker)
    with pytest.raises(UnsafeModelError):
        bnfold.fold(bad)
    assert not marker.exists()


@pytest.mark.parametrize("name", ["folder", "weights.pth", "model.txt"])
def test_a_path_that_is_not_a_model_file_is_a_one_line_error(tmp_path, name):
    path = tmp_path / name
    path.mkdir() if name == "folder" else path.write_bytes(b"x")
    with pytest.raises(ModelFileError) as info:
        bnfold.check(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


@pytest.mark.parametrize("only", ["conv", "conv,linear", ["conv"], ("linear", "conv"), {"conv"}])
def test_only_takes_a_string_or_an_iterable(models, only):
    assert len(bnfold.fold(models["conv_bn"], only=only).report.folded) == 1


@pytest.mark.parametrize("only", ["linear", ["linear"]])
def test_only_limits_the_kinds(models, only):
    assert bnfold.fold(models["conv_bn"], only=only).report.folded == []


@pytest.mark.parametrize("only", ["convv", "", ["conv", 3]])
def test_only_rejects_what_is_not_a_kind(models, only):
    with pytest.raises((ValueError, TypeError)):
        bnfold.fold(models["conv_bn"], only=only)


def test_exclude_on_module_paths(models):
    ep = torch.export.load(str(models["conv_bn"]))
    assert [(s.code, s.reason) for s in bnfold.fold(ep, exclude="conv").report.skipped] == [
        (Code.EXCLUDED, "excluded by --exclude conv (layer conv)")
    ]
    skipped = bnfold.fold(ep, exclude=["nothing", "b?"]).report.skipped
    assert [(s.code, s.reason) for s in skipped] == [(Code.EXCLUDED, "excluded by --exclude b?")]
    assert len(bnfold.fold(ep, exclude=["convolution"]).report.folded) == 1  # fnmatch, not a prefix
    check = bnfold.check(ep, exclude="bn")
    assert check.ok and not check.strict_ok


def test_exclude_on_onnx_node_names():
    model = h.onnx_conv_bn()
    assert [(s.code, s.reason) for s in bnfold.fold(model, exclude="conv").report.skipped] == [
        (Code.EXCLUDED, "excluded by --exclude conv (layer conv)")
    ]
    skipped = bnfold.fold(model, exclude="bn").report.skipped
    assert [(s.code, s.reason) for s in skipped] == [(Code.EXCLUDED, "excluded by --exclude bn")]
    folded = bnfold.fold(model).report.folded
    assert [(f.norm, f.into, f.into_node) for f in folded] == [("bn", "conv", "conv")]


def test_exclude_is_generic_in_the_engine():
    import inspect

    from bnfold.engine import fold_graph

    assert "exclude" in inspect.signature(fold_graph).parameters


def test_import_bnfold_does_not_import_torch():
    code = "import sys, bnfold; print('torch' in sys.modules, bnfold.__version__)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=600)
    out = run.stdout.split()
    from importlib.metadata import version

    assert out == ["False", version("bnfold")]
