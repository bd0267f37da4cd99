"""``-q/--quiet`` (the summary only) and ``-v/--verbose`` (every entry in full)."""

from __future__ import annotations

import argparse

from .args import opt

QUIET, NORMAL, VERBOSE = -1, 0, 1


def level(args: argparse.Namespace) -> int:
    if opt(args, "quiet"):
        return QUIET
    return VERBOSE if opt(args, "verbose") else NORMAL


def entry_details(report) -> list[str]:
    """``-v``: the graph nodes behind each entry of a fold report (what the table leaves out)."""
    lines = []
    for f in report.folded:
        lines.append(f"  folded   {f.norm}: node {f.node} into node {f.into_node}")
    for s in report.skipped:
        producer = f", after {s.producer}" if getattr(s, "producer", None) else ""
        lines.append(f"  skipped  {s.norm}: node {s.node}{producer}")
    for x in report.lowered:
        lines.append(f"  lowered  {x.norm}: node {x.node}")
    return lines
