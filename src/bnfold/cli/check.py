"""``bnfold check``: the CI gate. Lists the normalizations left in each file and why; exit 1 while one
could be folded (with ``--strict``, while any is left)."""

from __future__ import annotations

import argparse
from typing import Any

from ..checks import check_model_path, refuse_training
from ..errors import BnfoldError
from ..report import CheckResult
from . import shapes, verbosity
from .args import comma_list, opt
from .constants import EXIT_ERROR, EXIT_OK, EXIT_SURVIVORS, FOLDABLE
from .errors import print_error
from .fold import fold_quietly, load, refuse_unmatched
from .jsonout import print_json, versioned


def survivors(report) -> list[dict[str, Any]]:
    """Normalizations still in a model, from a fold report of it: foldable ones and skipped ones.
    Elementwise ops (folded alone or kept) are not normalizations: they never count here
    (``bnfold.CheckResult``)."""
    result = CheckResult.from_report(report)
    out: list[dict[str, Any]] = []
    for f in result.foldable:
        out.append(
            {
                "norm": f.norm,
                "node": f.node,
                "status": "foldable",
                "reason": FOLDABLE,
                "into": f.into,
                "into_node": f.into_node,
                "pattern": f.pattern,
            }
        )
    for s in result.unfoldable:
        out.append(
            {
                "norm": s.norm,
                "node": s.node,
                "status": "skipped",
                "reason": s.reason,
                "code": str(s.code.value if hasattr(s.code, "value") else s.code),
                "producer": s.producer,
            }
        )
    return out


def check_one(path: str, args: argparse.Namespace) -> dict[str, Any]:
    """One file's check: its survivors and its exit status (1 when it fails the gate)."""
    check_model_path(path)
    loaded = load(path, args)
    model = shapes.apply(loaded, args)
    # --only / --exclude: the gate judges what `bnfold fold` with the same options would fold; what they keep is
    # listed as left (code ``excluded``), and a pattern or kind that matches nothing is an error, as in `fold`
    exclude = comma_list(opt(args, "exclude"))
    report = fold_quietly(model, opt(args, "only"), opt(args, "debug"), exclude, label=path).report
    refuse_training(model, path, report)
    refuse_unmatched(report, "nothing was checked")
    left = survivors(report)
    foldable = sum(s["status"] == "foldable" for s in left)
    failed = foldable > 0 or (args.strict and bool(left))
    return {
        "input": path,
        "ok": not failed,
        "foldable": foldable,
        "unfoldable": len(left) - foldable,
        "survivors": left,
        "exit_code": EXIT_SURVIVORS if failed else EXIT_OK,
    }


def lines(result: dict[str, Any], strict: bool, level: int = verbosity.NORMAL) -> list[str]:
    """The text ``check`` prints for one file: a headline, then one line per normalization left
    (none with ``-q``; with ``-v`` also its graph node and, when foldable, the layer it folds into)."""
    path, left = result["input"], result["survivors"]
    if not left:
        return [f"{path}: ok, no normalization left"]
    n, foldable, unfoldable = len(left), result["foldable"], result["unfoldable"]
    plural = "s" if n != 1 else ""
    if foldable:
        head = f"{path}: {n} normalization{plural} left, {foldable} foldable"
    elif strict:
        head = f"{path}: {n} normalization{plural} left that bnfold cannot fold (failing: --strict)"
    else:
        head = f"{path}: ok, {unfoldable} normalization{plural} left that bnfold cannot fold"
    if level == verbosity.QUIET:
        return [head]
    width = max(len(s["norm"]) for s in left)
    out = [head]
    for s in left:
        out.append(f"  {s['norm']:<{width}}  {s['reason']}")
        if level == verbosity.VERBOSE:
            into = f", folds into {s['into']} (node {s['into_node']}, {s['pattern']})" if s.get("into") else ""
            out.append(f"  {'':<{width}}  node {s['node']}{into}")
    return out


def run(args: argparse.Namespace) -> int:
    results = []
    for path in args.inputs:
        try:
            results.append(check_one(path, args))
        except BnfoldError as e:
            message = print_error(e, opt(args, "debug"))
            results.append({"input": path, "ok": False, "error": message, "exit_code": EXIT_ERROR})
            continue
        if not opt(args, "json"):
            print("\n".join(lines(results[-1], args.strict, verbosity.level(args))), flush=True)
    code = max(r["exit_code"] for r in results)
    if opt(args, "json"):
        print_json(versioned(ok=code == EXIT_OK, strict=args.strict, files=results))
    return code
