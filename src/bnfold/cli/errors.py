"""How ``bnfold`` reports a failure: one line on stderr (and a JSON object with ``--json``)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from ..io import one_line
from .args import opt
from .constants import EXIT_PIPE
from .jsonout import print_json


def fail(message: str, args: argparse.Namespace | None, code: int) -> int:
    message = one_line(message)
    if args is not None and opt(args, "json"):
        print_json({"error": message, "exit_code": code})
    print(f"bnfold: error: {message}", file=sys.stderr)
    return code


def print_error(err: BaseException, debug: bool) -> str:
    """``err`` as one line on stderr (with its traceback before it under ``--debug``) and its hint."""
    if debug:
        import traceback

        traceback.print_exc()
    message = one_line(str(err))
    print(f"bnfold: error: {message}", file=sys.stderr)
    print_hint(err)
    return message


def print_hint(err: BaseException) -> None:
    """The lines an error carries to show what to run (the export recipe for a .pth), indented, on stderr."""
    for line in getattr(err, "hint", ()):
        print(f"    {line}", file=sys.stderr)


def stdout_gone() -> int:
    """The reader of stdout went away (``| head -1``): end quietly, and let nothing be flushed at exit."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return EXIT_PIPE
