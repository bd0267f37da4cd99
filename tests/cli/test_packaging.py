"""Packaging (issue 13, point 10): pinned tested versions, one version source, ruff configured and
run by `make lint` in CI, `make bench` writing only untracked results, and the pre-commit hook."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import cli_helpers as h

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _make_dry_run(target: str) -> str:
    return subprocess.run(
        ["make", "-n", "-C", str(ROOT), target, "STAMP=/dev/null"], capture_output=True, text=True, check=True
    ).stdout


def test_tested_versions_are_required_and_installed():
    """The core takes the torch releases it is tested with (2.13, 2.14); the ExecuTorch extra its pair."""
    project = PYPROJECT["project"]
    assert "torch>=2.13,<2.15" in project["dependencies"]
    assert project["optional-dependencies"]["executorch"] == ["executorch==1.5.1", "torch==2.13.0"]
    assert version("torch").split("+")[0].rsplit(".", 1)[0] in ("2.13", "2.14")
    if version("torch").startswith("2.13."):
        assert version("executorch") == "1.5.1"


def test_one_version_source():
    import bnfold

    assert bnfold.__version__ == version("bnfold") == PYPROJECT["project"]["version"]
    init = (ROOT / "src/bnfold/__init__.py").read_text()
    assert not re.search(r"__version__\s*=\s*['\"]\d+\.\d+", init), "the version is written only in pyproject.toml"


def test_ruff_is_configured_installed_and_run_in_ci():
    ruff = PYPROJECT["tool"]["ruff"]
    assert ruff["line-length"] == 120 and ruff["target-version"] == "py310"
    assert {"E", "F", "W", "I", "B", "UP"} <= set(ruff["lint"]["select"])
    assert any(dep.startswith("ruff") for dep in PYPROJECT["project"]["optional-dependencies"]["test"])
    lint = _make_dry_run("lint")
    assert "ruff check ." in lint and "ruff format --check ." in lint and "--fix" not in lint
    ci = (ROOT / ".ci/run").read_text().split()
    assert ci.index("lint") > ci.index("test")


def test_new_modules_are_ruff_clean():
    """The files this change added are clean now; the rest of the tree is formatted in one go."""
    files = ["src/bnfold/checks.py", "src/bnfold/api.py", "tests/readme", "tests/cli/test_packaging.py"]
    ruff = [sys.executable, "-m", "ruff"]
    assert subprocess.run([*ruff, "check", *files], cwd=ROOT, capture_output=True).returncode == 0
    assert subprocess.run([*ruff, "format", "--check", *files], cwd=ROOT, capture_output=True).returncode == 0


def test_make_bench_writes_only_ignored_results():
    bench = _make_dry_run("bench")
    out = re.search(r"run_all\.py --out (\S+)", bench)
    assert out, bench
    folder = ROOT / out[1]
    probe = folder / "summary.json"
    ignored = subprocess.run(["git", "check-ignore", "-q", str(probe)], cwd=ROOT)
    assert ignored.returncode == 0, f"{probe} is not ignored by git"
    assert "--out" not in _make_dry_run("bench-update")  # the committed tables, only when asked


def test_pre_commit_hook_runs_bnfold_check_on_model_files(models, tmp_path):
    [hook] = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert hook["id"] == "bnfold-check" and hook["entry"] == "bnfold check"
    files = re.compile(hook["files"])
    assert files.search("a/model.pt2") and files.search("m.onnx") and not files.search("w.pth")
    entry = [str(Path(sys.executable).parent / "bnfold"), *hook["entry"].split()[1:]]
    staged = [h.copy_to(models["conv"], tmp_path), h.copy_to(models["bn_only"], tmp_path)]
    assert subprocess.run([*entry, *map(str, staged)], capture_output=True).returncode == 0
    staged.append(h.copy_to(models["conv_bn"], tmp_path))  # something foldable: the commit is refused
    proc = subprocess.run([*entry, *map(str, staged)], capture_output=True, text=True)
    assert proc.returncode == 1 and "foldable: run bnfold fold" in proc.stdout


def test_the_license_is_an_spdx_expression_for_the_setuptools_that_reads_it():
    """``license = {text = ...}`` is deprecated from setuptools 77, which reads an SPDX expression (PEP 639): the
    build requires that setuptools."""
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    assert PYPROJECT["build-system"]["requires"] == ["setuptools>=77"]
