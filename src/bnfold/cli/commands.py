"""The commands of ``bnfold`` as data: name, help texts, the options each takes (names in
:data:`bnfold.cli.options.OPTIONS`) and the function that runs it."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from . import audit, check, demo, fold, texts
from .options import COMMON, LOADING


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    description: str
    options: tuple[str, ...]
    run: Callable[[argparse.Namespace], int]
    epilog: str | None = None


COMMANDS: tuple[Command, ...] = (
    Command(
        "fold",
        help="fold normalizations and write the folded model",
        description="Fold the normalizations of IN into their conv / transposed conv / linear and\n"
        "write OUT (.pt2 -> .pt2, .onnx -> .onnx); prints what was folded and skipped.",
        options=(
            *COMMON,
            *LOADING,
            "input",
            "output",
            "report",
            "only",
            "exclude",
            "lower_unfoldable",
            "input_shape",
            "fp16_range",
            "fp16_margin",
            "range_profile",
            "force",
            "in_place",
            "low_memory",
        ),
        run=fold.run,
        epilog=texts.FOLD_EPILOG,
    ),
    Command(
        "check",
        help="CI gate: fail while something foldable is left",
        description="List the normalizations left in each IN and why; exit 1 when one could be folded.",
        options=(*COMMON, *LOADING, "inputs", "strict", "only", "exclude", "input_shape"),
        run=check.run,
        epilog=texts.CHECK_EPILOG,
    ),
    Command(
        "audit",
        help="measure the fp16 / HTP numerics of a program before and after folding",
        description="Run IN under a precision profile next to a reference run (float64; float32\n"
        "under the profiles that store fp16), unfolded and folded, and summarize the error per layer.",
        options=(
            *COMMON,
            *LOADING,
            "input",
            "profile",
            "bn_eps",
            "batches",
            "random",
            "seed",
            "input_shape",
            "runtime",
            "class_axis",
            "threshold",
            "plot",
            "local",
            "task_output",
            "min_agreement",
            "min_sqnr",
            "block_list",
            "block_list_format",
        ),
        run=audit.run,
        epilog=texts.AUDIT_EPILOG,
    ),
    Command(
        "demo",
        help="fold and audit the bundled demo network",
        description="Fold the bundled demo network, audit it under fp16 and write the results to DIR.",
        options=(*COMMON, "out", "quick"),
        run=demo.run,
    ),
)
