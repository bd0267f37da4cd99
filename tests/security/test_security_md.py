"""SECURITY.md names the code that enforces each rule: every bnfold file and name it cites (in backticks) exists.

A file path (``io/pt2/ops.py``: under ``src/bnfold``; ``src/...``, ``tests/...``: under the repository; a bare
``npz.py``: somewhere in the package) and a dotted name (``bnfold.io.cost.max_work``, or one that starts with a
bnfold module's own name, ``fx_cost._fx_flops``, ``engine.chain.MAX_CHAIN``) resolve.  Names of other packages
(``torch.load``, ``onnx.reference``, a ``numpy.py`` beside a model) and of classes (``AuditHold.of``) are left out.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "src" / "bnfold"


def _cited() -> tuple[set[str], set[str]]:
    spans = re.findall(r"`([^`\n]+)`", (ROOT / "SECURITY.md").read_text())
    paths = {p for s in spans for p in re.findall(r"[\w/.-]*\w\.py\b", s)}
    names = {n for s in spans for n in re.findall(r"\b[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+\b", s) if not n.endswith(".py")}
    return paths, names


def _modules() -> dict[str, list[str]]:
    """Each bnfold module's last name -> its dotted paths (``cost`` -> ``bnfold.io.cost``)."""
    out: dict[str, list[str]] = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        out.setdefault(parts[-1], []).append(".".join(parts))
    return out


def _resolves(module: str, rest: list[str]) -> bool:
    obj = importlib.import_module(module)
    for part in rest:
        if hasattr(obj, part):
            obj = getattr(obj, part)
        elif hasattr(obj, "__path__") and importlib.util.find_spec(f"{obj.__name__}.{part}") is not None:
            obj = importlib.import_module(f"{obj.__name__}.{part}")
        else:
            return False
    return True


def _foreign(name: str) -> bool:
    """A top-level module other than bnfold (``torch``, ``onnx``, ``contextlib``)."""
    return name != "bnfold" and importlib.util.find_spec(name) is not None


def test_every_file_security_md_cites_exists():
    paths, _ = _cited()
    here = {p.name for p in PKG.rglob("*.py")}
    missing = []
    for p in sorted(paths):
        if "/" in p:
            found = (ROOT / p if p.startswith(("src/", "tests/")) else PKG / p).is_file()
        else:
            found = p in here or _foreign(p[: -len(".py")])
        if not found:
            missing.append(p)
    assert len(paths) > 10 and not missing, missing


def test_every_bnfold_name_security_md_cites_resolves():
    _, names = _cited()
    modules = _modules()
    checked, missing = 0, []
    for name in sorted(names):
        first, *rest = name.split(".")
        if first == "bnfold":
            candidates = ["bnfold"]
        elif first in modules and not _foreign(first):
            candidates = modules[first]
        else:
            continue
        checked += 1
        if not any(_resolves(c, rest) for c in candidates):
            missing.append(name)
    assert checked > 10 and not missing, missing


def test_the_json_value_limit_security_md_states_is_the_codes():
    """The limits table's row for a ``.pt2``'s JSON values states the code's constant and a small file's limit."""
    from bnfold.io.budget import JSON_VALUE_BYTES, json_values_allowed

    rows = [r for r in (ROOT / "SECURITY.md").read_text().splitlines() if "`budget.JSON_VALUE_BYTES`" in r]
    assert len(rows) == 1 and rows[0].startswith("|"), rows
    row = rows[0]
    assert f"at {JSON_VALUE_BYTES >> 10} KiB a value" in row, row
    assert f"{json_values_allowed(0):,} values for a file under 16 MiB" in row, row
    assert json_values_allowed(16 << 20) == json_values_allowed(0) < json_values_allowed((16 << 20) + 1024)
    assert "`--max-work N`" in row, row
