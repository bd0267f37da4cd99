"""Everyday use of the command line (issue 13): loud failures, the check gate, names, summaries,
pipes, file errors, --exclude and quiet library warnings.  Loud failures, pipes and messages are
checked through a real ``python -m bnfold`` process; the check gate's statuses and the rest in-process
(``main()`` returns the status ``python -m bnfold`` exits with; test_cli_subprocess.py checks that)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import bnfold
import bnfold.cli.progress as cli_progress
import cli_helpers as h

TRAINING_LINE = "in training mode"
EVAL_HINT = "call model.eval() before export"


def bnfold_cli(*argv, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bnfold", *map(str, argv)], capture_output=True, text=True, timeout=300, cwd=cwd
    )


def shell(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """``command`` in bash with ``bnfold`` on PATH (this interpreter's venv) and pipefail off."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


class PreActivation(nn.Module):
    """conv -> BN (foldable) and BN -> ReLU -> conv (never foldable: the ReLU is in between)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.pre = nn.BatchNorm2d(3)
        self.conv2 = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x))) + self.conv2(torch.relu(self.pre(x)))


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("everyday")
    x = torch.randn(h.EXAMPLE_SHAPE)
    out = {
        "train": d / "train.pt2",
        "clean": h.export_to(d / "clean.pt2", h.ConvReLU()),
        "preact": h.export_to(d / "preact.pt2", PreActivation()),
        "foldable": h.export_to(d / "foldable.pt2", h.ConvBN()),
        "onnx": d / "model.onnx",
    }
    torch.export.save(torch.export.export(h.randomize_bn(h.ConvBN()).train(), (x,)), str(out["train"]))
    import onnx

    onnx.save(h.onnx_conv_bn(), str(out["onnx"]))
    return out


# ----------------------------------------------------------------------------- loud failure


def test_fold_refuses_a_training_mode_export(files, tmp_path):
    out = tmp_path / "f.pt2"
    proc = bnfold_cli("fold", files["train"], "-o", out, "--trust")  # a training export has in-place ops
    assert proc.returncode == 2 and proc.stdout == ""
    line = h.one_error_line(proc.stderr, "train.pt2", TRAINING_LINE, EVAL_HINT, "bn")
    assert "1 normalization" in line
    assert not out.exists()


def test_check_refuses_a_training_mode_export(files):
    proc = bnfold_cli("check", files["train"], "--trust")
    assert proc.returncode == 2
    h.one_error_line(proc.stderr, TRAINING_LINE, EVAL_HINT)


def test_training_mode_onnx_is_refused(tmp_path, run):
    import onnx
    from onnx import helper

    model = h.onnx_conv_bn(opset=15)
    bn = next(n for n in model.graph.node if n.op_type == "BatchNormalization")
    bn.attribute.append(helper.make_attribute("training_mode", 1))
    path = tmp_path / "train.onnx"
    onnx.save(model, str(path))
    code, _, err = run("fold", path, "-o", tmp_path / "f.onnx")
    assert code == 2 and EVAL_HINT in err and "(bn)" in err
    assert not (tmp_path / "f.onnx").exists()


def test_shared_training_helper_names_the_norms(files):
    from bnfold.checks import TrainingModeError, refuse_training, training_norms

    ep = torch.export.load(str(files["train"]))
    assert training_norms(ep) == ["bn"]
    assert training_norms(torch.export.load(str(files["foldable"]))) == []
    with pytest.raises(TrainingModeError, match="call model.eval"):
        refuse_training(ep, "x.pt2")


def test_nothing_foldable_exits_0_and_says_so(files, tmp_path):
    out = tmp_path / "f.pt2"
    proc = bnfold_cli("fold", files["clean"], "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert f"nothing to fold in {files['clean']}" in proc.stdout and out.is_file()


# ----------------------------------------------------------------------------- the check gate


def test_check_gate_default_and_strict(run, files, tmp_path):
    # in-process: the exit statuses through `python -m bnfold` are test_cli_subprocess.py's
    folded = tmp_path / "preact_folded.pt2"
    assert run("fold", files["preact"], "-o", folded)[0] == 0
    code, out, _ = run("check", files["preact"])
    assert code == 1 and "1 foldable" in out
    code, out, _ = run("check", folded)  # only the pre-activation BN is left: it can never fold
    assert code == 0, out
    assert "ok, 1 normalization left that bnfold cannot fold" in out
    assert "pre  no conv, transposed conv or linear next to it" in out
    code, out, _ = run("check", "--strict", folded)
    assert code == 1 and "(failing: --strict)" in out
    code, out, err = run("check", files["clean"], folded, files["foldable"])
    assert code == 1  # the worst of 0, 0, 1
    assert out.count("\n") >= 5 and err == ""


# ----------------------------------------------------------------------------- conventions


@pytest.mark.parametrize("command", ["check {a} {b} | head -1", "check {a} {a} {a} {a} | true"])
def test_check_into_a_closed_pipe_ends_quietly(files, tmp_path, command):
    proc = shell(
        "bnfold " + command.format(a=files["foldable"], b=files["onnx"]) + "; echo rc=${PIPESTATUS[0]}", tmp_path
    )
    assert "Error" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    assert proc.stdout.splitlines()[-1] in {"rc=1", "rc=141"}


def test_fold_into_a_closed_pipe_ends_quietly_after_writing(files, tmp_path):
    out = tmp_path / "f.pt2"
    proc = shell(f"bnfold fold {files['preact']} -o {out} | true; echo rc=${{PIPESTATUS[0]}}", tmp_path)
    assert "internal error" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert proc.stdout.strip() in {"rc=0", "rc=141"}
    assert out.is_file()


def test_a_folder_is_a_directory(tmp_path):
    proc = bnfold_cli("check", tmp_path)
    assert proc.returncode == 2
    h.one_error_line(proc.stderr, "is a directory")


def test_a_checkpoint_gets_the_export_recipe(tmp_path):
    pth = tmp_path / "weights.pth"
    torch.save(h.ConvBN().state_dict(), pth)
    proc = bnfold_cli("fold", pth, "-o", tmp_path / "f.pt2")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    first, *recipe = proc.stderr.splitlines()
    assert first.startswith("bnfold: error: ") and "weights.pth" in first and "export" in first
    assert [line.strip() for line in recipe] == [
        "ep = torch.export.export(model.eval(), example_inputs)",
        'torch.export.save(ep, "model.pt2")',
    ]


# ----------------------------------------------------------------------------- summary, progress, quiet


def test_fold_ends_with_one_summary_line_on_stderr(files, tmp_path):
    proc = bnfold_cli("fold", files["foldable"], "-o", tmp_path / "f.pt2")
    assert proc.returncode == 0
    [line] = proc.stderr.splitlines()  # nothing else: library warnings stay quiet
    assert line.startswith("bnfold: folded 1, skipped 0; removed ") and " nodes, saved 17 parameters" in line
    assert line.endswith(" s") and "(72 B)" in line  # 4 x 4 float32 tensors and an int64 counter


def test_debug_lets_library_warnings_through(run, files, tmp_path, monkeypatch):
    import warnings

    real = bnfold.fold

    def noisy(*a, **kw):
        warnings.warn("a library warning", FutureWarning, stacklevel=1)
        return real(*a, **kw)

    monkeypatch.setattr(bnfold, "fold", noisy)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert run("fold", files["foldable"], "-o", tmp_path / "a.pt2")[0] == 0
        assert not [w for w in seen if "a library warning" in str(w.message)]
        assert run("fold", files["foldable"], "-o", tmp_path / "b.pt2", "--debug")[0] == 0
        assert [w for w in seen if "a library warning" in str(w.message)]


def test_long_folds_print_progress_lines(run, files, tmp_path, monkeypatch):
    real = bnfold.fold

    def slow(*a, **kw):
        time.sleep(0.35)
        return real(*a, **kw)

    monkeypatch.setattr(bnfold, "fold", slow)
    monkeypatch.setattr(cli_progress, "PROGRESS_DELAY", 0.05)
    monkeypatch.setattr(cli_progress, "PROGRESS_EVERY", 0.1)
    code, _, err = run("fold", files["foldable"], "-o", tmp_path / "f.pt2")
    assert code == 0
    progress = [
        ln
        for ln in err.splitlines()
        if re.fullmatch(rf"bnfold: folding {re.escape(str(files['foldable']))} \.\.\. \[\d+ s\]", ln)
    ]
    assert len(progress) >= 2, err  # stderr is not a terminal here: one line each time
    assert err.splitlines()[-1].startswith("bnfold: folded 1")


# ----------------------------------------------------------------------------- --exclude and names


def test_exclude_leaves_the_matching_layers_alone(run, files, tmp_path):
    out = tmp_path / "f.pt2"
    code, stdout, _ = run("fold", files["foldable"], "-o", out, "--exclude", "co*", "--json")
    assert code == 0
    data = json.loads(stdout)
    assert data["folded"] == []
    assert data["skipped"][0]["reason"] == "excluded by --exclude co* (layer conv)"
    assert h.norm_count(torch.export.load(str(out))) == 1
    code, stdout, _ = run("fold", files["foldable"], "-o", out, "--force", "--exclude", "bn", "--json")
    assert json.loads(stdout)["skipped"][0]["reason"] == "excluded by --exclude bn"
    code, _, err = run("fold", files["foldable"], "-o", out, "--force", "--exclude", "x,bn")
    assert code == 2  # 'x' matches nothing (tests/cli/test_cli_selection.py)


def test_report_names_layers_by_module_path_and_keeps_the_node(run, files, tmp_path):
    code, stdout, _ = run("fold", files["foldable"], "-o", tmp_path / "f.pt2", "--json")
    [entry] = json.loads(stdout)["folded"]
    assert (entry["norm"], entry["into"]) == ("bn", "conv")
    assert entry["into_node"] == "conv2d" and entry["node"]
