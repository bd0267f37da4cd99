"""``bnfold demo``: fold and audit the bundled demo network."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from ..errors import BnfoldError
from ..io import quiet
from .args import opt
from .constants import EXIT_OK
from .jsonout import print_json, versioned


def run(args: argparse.Namespace) -> int:
    try:
        from ..demo import run_demo
    except ImportError as e:
        raise BnfoldError(f"the demo is not available in this installation ({e})") from None
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise BnfoldError(f"{args.out}: not a folder; give a folder for the demo's files")
    with quiet(not opt(args, "debug")):  # library warnings only with --debug, as for the other commands
        if opt(args, "json"):
            with contextlib.redirect_stdout(sys.stderr):
                result = run_demo(out_dir=args.out, quick=args.quick)
            print_json(versioned(**(result or {})))
        else:
            run_demo(out_dir=args.out, quick=args.quick)
    return EXIT_OK
