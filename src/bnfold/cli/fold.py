"""``bnfold fold``: fold a model file and write the folded model (and the report)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..checks import check_model_path, refuse_training
from ..errors import BnfoldError
from ..frontends import frontend_for
from ..io import atomic, models, quiet
from . import shapes, verbosity
from .args import comma_list, opt
from .constants import EXIT_OK
from .jsonout import json_text, print_json, versioned
from .progress import Heartbeat


def fold_quietly(
    model: Any,
    only=None,
    debug: bool = False,
    exclude=None,
    label: str = "",
    lower_unfoldable=False,
    inplace=False,
    **fp16_range,
):
    """``bnfold.fold`` with library warnings silenced (unless ``debug``) and a heartbeat on stderr; ``fp16_range``:
    ``fold``'s ``fp16_range`` / ``fp16_margin`` / ``profile`` arguments."""
    from .. import fold

    with quiet(not debug), Heartbeat(f"folding {label}" if label else "folding"):
        return fold(model, only=only, exclude=exclude, lower_unfoldable=lower_unfoldable, inplace=inplace, **fp16_range)


def range_arguments(model: Any, args: argparse.Namespace) -> dict:
    """``fold``'s fp16 range arguments from ``--fp16-range INPUTS.npz`` (read as ``audit --inputs`` reads it),
    ``--fp16-margin`` and ``--profile``; empty without ``--fp16-range``."""
    path = opt(args, "fp16_range")
    if not path:
        return {}
    batches = frontend_for(model).batches(model, path, 0, 0, None)
    return {
        "fp16_range": batches,
        "fp16_margin": opt(args, "fp16_margin") or 16.0,
        "profile": opt(args, "range_profile") or None,
    }


def load(path: str, args: argparse.Namespace):
    """The model file at ``path`` through the safe loader, with the loading options of ``args``
    (``--low-memory``: an ONNX file's external data stays on disk, read one tensor at a time)."""
    return models.load_model(
        path,
        trust=opt(args, "trust"),
        debug=opt(args, "debug"),
        max_bytes=opt(args, "max_bytes"),
        stream=bool(opt(args, "low_memory")),
    )


def report_payload(input_path: str, output: str | None, report) -> dict[str, Any]:
    payload = versioned(input=input_path)
    if output is not None:
        payload["output"] = output
    payload.update(report.to_dict())
    return payload


def refuse_unmatched(report, consequence: str = "nothing was written") -> None:
    """An ``--exclude`` pattern that matches nothing or an ``--only`` kind the model lacks is an error (exit 2, no
    file written): a typo would otherwise fold what was meant to stay.  ``consequence`` ends the message."""
    if report.unmatched:
        more = f" (and {len(report.unmatched) - 1} more)" if len(report.unmatched) > 1 else ""
        raise BnfoldError(f"{report.unmatched[0]}{more}; {consequence}")


def run(args: argparse.Namespace) -> int:
    from ..io.output import check_outputs, check_side_file, plan_output

    debug = opt(args, "debug")
    check_model_path(args.input)
    plan = plan_output(args.input, args.output, force=args.force, in_place=args.in_place)
    check_outputs({"output": plan.path, "report": args.report}, inputs=[args.input, opt(args, "fp16_range")])
    if args.report:
        check_side_file(args.report, not_same_as=[args.input, plan.path], what="report", force=args.force)
    loaded = load(args.input, args)
    with models.reading(loaded):  # a streamed ONNX model's tensors are read and written in here
        layout = loaded.layout
        model = shapes.apply(loaded, args)  # --input-shape: the ONNX model with these dims fixed, and written so
        ranged = range_arguments(model, args)
        # --low-memory: a .pt2 program folds in place; an ONNX model was loaded streamed (its external data stays
        # on disk, read one tensor at a time, and its new parameters are spilled to a scratch file)
        frontend = frontend_for(model)
        inplace = bool(args.low_memory) and frontend is not None and frontend.folds_in_place
        if args.low_memory and frontend is None:
            raise BnfoldError("--low-memory folds a .pt2 program in place or an .onnx model streamed")
        if inplace:
            refuse_training(model, args.input)  # before: the in-place fold consumes the program
        exclude = comma_list(args.exclude)
        try:
            result = fold_quietly(
                model, args.only, debug, exclude, args.input, args.lower_unfoldable, inplace, **ranged
            )
        except ValueError as e:  # inputs that do not fit the model
            if not ranged:
                raise
            raise BnfoldError(f"{args.input}: --fp16-range {args.fp16_range}: {e}") from None
        if inplace:
            del loaded, model  # the folded program is what is left of it
        else:
            refuse_training(model, args.input, result.report)
        refuse_unmatched(result.report)
        payload = report_payload(args.input, plan.path, result.report)
        texts = {args.report: json_text(payload) + "\n"} if args.report else None
        with atomic.modes_like(args.input):  # new files get the input's permission bits
            models.save_model(result.model, plan, layout=layout, texts=texts, debug=debug)
    if opt(args, "json"):
        print_json(payload)
    elif verbosity.level(args) > verbosity.QUIET:
        print(result.report.table())
        if verbosity.level(args) == verbosity.VERBOSE:
            print("\n".join(verbosity.entry_details(result.report)))
        if not result.report.folded and not result.report.lowered and not result.report.rescaled:
            print(f"nothing to fold in {args.input}: no normalization could be folded; wrote an unchanged copy")
        extra = f" (report: {args.report})" if args.report else ""
        print(f"wrote {plan.path}{extra}")
    sys.stdout.flush()
    print(f"bnfold: {result.report.summary_line()}", file=sys.stderr)
    return EXIT_OK
