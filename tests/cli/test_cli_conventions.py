"""The conventions of the tools users know: help with no command, -q / -v, --input-shape for ONNX
models with open dims (onnxsim's --overwrite-input-shape), outputs with the input's permission bits."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import onnx
import pytest

import cli_helpers as h


def test_no_command_prints_the_help_and_exits_2(run):
    code, out, err = run()
    assert code == 2 and out == ""  # argparse's status for a missing required argument (onnxsim, torchrun)
    assert err.startswith("usage: bnfold") and "fold" in err and "examples:" in err and "exit status" in err


def test_python_dash_m_with_no_command_prints_the_help():
    proc = subprocess.run([sys.executable, "-m", "bnfold"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "usage: bnfold" in proc.stderr and "Traceback" not in proc.stderr


def test_quiet_and_verbose_are_exclusive(run, models):
    code, _, err = run("check", "-q", "-v", models["conv_bn"])
    assert code == 2 and "not allowed with" in err


def test_fold_quiet_prints_the_summary_only(run, models, tmp_path):
    code, out, err = run("fold", "-q", models["conv_bn"], "-o", tmp_path / "q.pt2")
    assert code == 0 and out == ""
    assert [ln for ln in err.splitlines() if ln] == [err.strip()] and err.startswith("bnfold: folded 1, skipped 0")
    code, normal, _ = run("fold", models["conv_bn"], "-o", tmp_path / "n.pt2")
    code, verbose, _ = run("fold", "--verbose", models["conv_bn"], "-o", tmp_path / "v.pt2")
    assert code == 0
    assert normal.splitlines()[0] == "folded 1, skipped 0" and "  folded   bn" in normal
    assert set(normal.splitlines()[:-1]) <= set(verbose.splitlines())  # all but "wrote n.pt2"
    assert any(ln.startswith("  folded   bn: node ") and " into node " in ln for ln in verbose.splitlines())
    code, _, err = run("-q", "fold", models["conv_bn"], "-o", tmp_path / "q2.pt2")  # before the command too
    assert code == 0 and err.startswith("bnfold: folded 1")


def test_check_quiet_and_verbose(run, models):
    code, out, _ = run("check", "-q", models["conv_bn"], models["conv"])
    assert code == 1
    assert out.splitlines() == [
        f"{models['conv_bn']}: 1 normalization left, 1 foldable",
        f"{models['conv']}: ok, no normalization left",
    ]
    code, out, _ = run("check", "-v", models["conv_bn"])
    assert code == 1
    assert any("node " in ln and "folds into conv" in ln for ln in out.splitlines())


def test_audit_quiet_keeps_the_end_to_end_numbers_and_the_advice(run, models):
    code, full, _ = run("audit", models["conv_bn"], "--random", "1")
    assert code == 0
    code, quiet, _ = run("audit", "-q", models["conv_bn"], "--random", "1")
    assert code == 0
    assert "output SQNR (dB)" in quiet and "what to do:" in quiet
    assert "normalizations (" in full and "normalizations (" not in quiet
    assert "layers (" in full and "layers (" not in quiet
    code, verbose, _ = run("audit", "-v", models["conv_bn"], "--random", "1")
    assert code == 0 and "fold report:" in verbose and "layers (" in verbose


# ----------------------------------------------------------------------------- --input-shape


@pytest.fixture
def dynamic_onnx(tmp_path):
    """Conv -> BatchNormalization with input X[N, 3, H, W]: every dim but the channels left open."""
    model = h.onnx_conv_bn()
    dims = model.graph.input[0].type.tensor_type.shape.dim
    for d, name in zip(dims, ("N", None, "H", "W")):
        if name:
            d.dim_param = name
    for d in model.graph.output[0].type.tensor_type.shape.dim:
        d.dim_param = "open"
    path = tmp_path / "dyn.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def test_audit_takes_input_shapes_for_open_dims(run, dynamic_onnx):
    code, out, err = run("audit", dynamic_onnx, "--input-shape", "X:2,3,16,20", "--random", "2", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["samples"] == 4 and data["batches"] == 2  # batches of 2, as --input-shape says
    assert data["end_to_end"]["folded"] is not None and data["fold_report"]["summary"]["folded"] == 1


def test_check_takes_input_shapes(run, dynamic_onnx):
    code, out, err = run("check", dynamic_onnx, "--input-shape", "X:1,3,8,8")
    assert code == 1, err  # loaded, fixed, and the batch norm is foldable
    assert "1 foldable" in out


def test_fold_takes_input_shapes_and_writes_them(run, dynamic_onnx, tmp_path):
    out = tmp_path / "fixed.onnx"
    code, _, err = run("fold", dynamic_onnx, "-o", out, "--input-shape", "X:2,3,16,20", "-q")
    assert code == 0, err
    folded = onnx.load(str(out))
    assert [d.dim_value for d in folded.graph.input[0].type.tensor_type.shape.dim] == [2, 3, 16, 20]
    assert "BatchNormalization" not in [n.op_type for n in folded.graph.node]
    code, _, err = run("fold", dynamic_onnx, "-o", tmp_path / "bad.onnx", "--input-shape", "X:2,4,16,20")
    assert code == 2 and "dim 1 is 4, but the model fixes it to 3" in err and "Traceback" not in err
    assert not (tmp_path / "bad.onnx").exists()


@pytest.mark.parametrize(
    "spec, words",
    [
        ("X:1,3,x,8", "expected NAME:D0,D1,..."),
        ("1,3,8,8", "expected NAME:D0,D1,..."),
        ("X:0,3,8,8", "expected NAME:D0,D1,..."),
        ("Y:1,3,8,8", "not an input of the model"),
        ("X:1,3,8", "gives 3 dims, the model's input has 4"),
        ("X:1,4,8,8", "dim 1 is 4, but the model fixes it to 3"),
    ],
)
def test_bad_input_shapes_are_one_line_errors(run, dynamic_onnx, spec, words):
    code, out, err = run("check", dynamic_onnx, "--input-shape", spec)
    assert code == 2
    assert words in err and "Traceback" not in err


def test_input_shape_is_for_onnx_models_when_folding(run, models, tmp_path):
    """(``audit`` shapes a program's random batches with it: tests/cli/test_cli_pt2_shapes.py.)"""
    code, _, err = run("fold", models["conv_bn"], "-o", tmp_path / "out.pt2", "--input-shape", "x:1,3,8,8")
    assert code == 2 and "--input-shape is for ONNX models" in err


# ----------------------------------------------------------------------------- permissions


def test_outputs_get_the_input_permission_bits(run, models, tmp_path):
    src = h.copy_to(models["conv_bn"], tmp_path)
    os.chmod(src, 0o600)
    out, report = tmp_path / "out.pt2", tmp_path / "report.json"
    assert run("fold", src, "-o", out, "--report", report)[0] == 0
    umask = os.umask(0)
    os.umask(umask)
    assert h.mode_of(out) == 0o600 & ~umask and h.mode_of(report) == 0o600 & ~umask
    onnx_src = h.save_onnx_external(h.onnx_conv_bn(), tmp_path / "ext.onnx", "weights.bin")
    os.chmod(onnx_src, 0o640)
    assert run("fold", onnx_src, "-o", tmp_path / "ext_out.onnx")[0] == 0
    written = [p for p in tmp_path.iterdir() if p.name.startswith("ext_out")]
    assert len(written) == 2 and all(h.mode_of(p) == 0o640 & ~umask for p in written)  # model and its data
