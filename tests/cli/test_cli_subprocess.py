"""End to end through ``python -m bnfold``: exit codes, stdout/stderr, no tracebacks."""

from __future__ import annotations

import subprocess
import sys

import cli_helpers as h


def bnfold(*argv, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "bnfold", *map(str, argv)], capture_output=True, text=True, timeout=300, cwd=cwd
    )


def test_fold_then_check(models, tmp_path):
    out = tmp_path / "folded.pt2"
    proc = bnfold("fold", models["conv_bn"], "-o", out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "folded 1, skipped 0" in proc.stdout and out.is_file()
    assert "Traceback" not in proc.stderr
    proc = bnfold("check", models["conv_bn"], cwd=tmp_path)
    assert proc.returncode == 1
    assert "foldable: run bnfold fold" in proc.stdout


def test_missing_file(tmp_path):
    proc = bnfold("fold", tmp_path / "missing.pt2", "-o", tmp_path / "out.pt2")
    assert proc.returncode == 2
    assert proc.stdout == ""
    h.one_error_line(proc.stderr, "missing.pt2", "no such file")
    assert h.listing(tmp_path) == set()


def test_hostile_archive(models, tmp_path):
    marker = tmp_path / "PWNED"
    bad = h.hostile_sample_inputs(models["conv_bn"], tmp_path / "bad.pt2", marker)
    proc = bnfold("fold", bad, "-o", tmp_path / "out.pt2", cwd=tmp_path)
    assert proc.returncode == 2
    h.one_error_line(proc.stderr, "bad.pt2", "refusing to load")
    assert not marker.exists()
    assert h.listing(tmp_path) == {"bad.pt2"}
