"""``main(argv)``: parse, run the command, turn every failure into an exit status and one line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..errors import BnfoldError
from ..io import one_line, quiet
from .args import opt
from .constants import EXIT_ERROR, EXIT_INTERNAL, EXIT_INTERRUPTED
from .errors import fail, print_hint, stdout_gone
from .parser import build_parser


def _run(args: argparse.Namespace) -> int:
    """The command, its output flushed (so that a closed pipe shows up here, not at exit)."""
    from ..io.cost import max_work
    from ..io.run_checks import watch

    # --max-work: the budget of the cost model; the watchdog (address-space cap for the audit, CPU-time
    # bound, allocator failures named by op): SECURITY.md
    with max_work(opt(args, "max_work")), watch(address_cap=getattr(args, "command", None) == "audit"):
        code = args.func(args)
    sys.stdout.flush()
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, usage errors
        return e.code if isinstance(e.code, int) else (0 if e.code is None else EXIT_ERROR)
    if getattr(args, "func", None) is None:
        # no command: the help, on stderr, and exit 2 -- argparse's convention for a missing required
        # argument, which is what onnxsim, onnxslim and torchrun do when run bare
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    debug = opt(args, "debug")
    try:
        with quiet(not debug):  # library warnings only with --debug
            return _run(args)
    except BrokenPipeError:
        return stdout_gone()
    except BnfoldError as e:
        if debug:
            import traceback

            traceback.print_exc()
        code = fail(str(e), args, EXIT_ERROR)
        print_hint(e)
        return code
    except KeyboardInterrupt:
        print("bnfold: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001 - any other failure is a bug: report it as one line, exit 3
        if debug:
            import traceback

            traceback.print_exc()
        detail = f": {one_line(e)}" if str(e).strip() else ""
        return fail(
            f"internal error: {type(e).__name__}{detail} (rerun with --debug for the traceback)",
            args,
            EXIT_INTERNAL,
        )
