"""``bnfold audit``: the fp16 / HTP numerics of a model, unfolded and folded, against float64."""

from __future__ import annotations

import argparse
import gc
import os

from ..checks import refuse_training
from ..errors import BnfoldError
from ..io import files, quiet
from . import inputs, shapes, verbosity
from .args import opt
from .constants import DEFAULT_RANDOM_BATCHES, EXIT_OK
from .fold import load
from .jsonout import print_json, versioned


def run(args: argparse.Namespace) -> int:
    from ..io.output import check_outputs
    from ..numerics.progress import Progress

    debug = opt(args, "debug")
    check_outputs({"plot": args.plot}, inputs=[args.input, args.batches])
    if args.plot:
        files.check_side_file(args.plot, not_same_as=[args.input], what="plot")
    progress = Progress(enabled=True)
    frozen = False
    try:
        progress.stage("load")
        loaded = load(args.input, args)
        ep = shapes.apply(loaded, args)  # --input-shape: the ONNX model with these dims fixed
        refuse_training(ep, args.input)
        # what is loaded by now (torch, onnx, the model: ~180k objects) stays until the audit ends: the full
        # collections its allocations set off (two or three) need not walk it again (~0.1 s each); a caller's
        # own frozen objects (a process that froze before) are left as they are
        frozen = gc.get_freeze_count() == 0
        if frozen:
            gc.freeze()
        report = _audit(ep, args, progress, debug, onnx=files.model_kind(args.input) == files.ONNX)
        if args.plot:
            progress.stage("plot")
            with quiet(not debug):
                report.plot(args.plot)  # written atomically
    finally:
        if frozen:
            gc.unfreeze()  # a caller in the same process (tests) gets its collector back as it was
        progress.close()
    if opt(args, "json"):
        payload = versioned(input=args.input)
        if args.plot:
            payload["plot"] = args.plot
        payload.update(report.to_dict())
        print_json(payload)
    else:
        level = verbosity.level(args)
        print(report.table() if level > verbosity.QUIET else summary(report.table()))
        if level == verbosity.VERBOSE and report.fold_report is not None:
            print(f"\nfold report:\n{report.fold_report.table()}")
            print("\n".join(verbosity.entry_details(report.fold_report)))
        if args.plot:
            print(f"wrote {args.plot}")
    return EXIT_OK


def _audit(model, args: argparse.Namespace, progress, debug: bool, onnx: bool):
    """The audit of the loaded model on ``--inputs`` or ``--random`` batches.  An ONNX model is audited
    with the ONNX ``fold`` writes, both emulated (``numerics.audit``); ``--runtime`` is ONNX only."""
    from ..numerics import audit
    from ..numerics.end_to_end import check_class_axis, first_output_rank, task

    # before anything runs: a bad --threshold / --class-axis is a one-line error
    for flag, check in (
        ("--threshold", lambda: task(threshold=args.threshold)),
        ("--class-axis", lambda: check_class_axis(args.class_axis, first_output_rank(model))),
    ):
        try:
            check()
        except ValueError as e:
            raise BnfoldError(f"{flag}: {e}") from None
    extra: dict = {"class_axis": args.class_axis, "threshold": args.threshold}
    if onnx:
        from ..numerics.onnx_program import random_batches

        extra["input_shapes"] = shapes.input_shapes(getattr(args, "input_shape", None))
        extra["runtime"] = args.runtime
        if args.batches:
            batches = inputs.onnx_npz_batches(model, args.batches)
        else:
            n = args.random or DEFAULT_RANDOM_BATCHES
            try:
                batches = random_batches(model, extra["input_shapes"], n, seed=args.seed)
            except ValueError as e:  # open dims that no --input-shape fixes
                raise BnfoldError(f"{args.input}: cannot audit this ONNX model: {e}") from None
    elif args.runtime:
        raise BnfoldError("--runtime is for ONNX models")
    elif args.batches:
        batches = inputs.npz_batches(model, args.batches)
    else:
        batches = inputs.random_batches(model, args.random or DEFAULT_RANDOM_BATCHES, seed=args.seed)
    try:
        with quiet(not debug):
            return audit(
                model,
                batches,
                profile=args.profile,
                bn_eps=args.bn_eps,
                progress=progress,
                name=os.path.basename(args.input),
                random_inputs=not args.batches,
                tensors=bool(opt(args, "json")),  # every value's error: only the JSON lists them
                local=bool(opt(args, "local")),  # the local runs: only when asked (--local)
                **extra,
            )
    except (NotImplementedError, ValueError) as e:  # an op the audit cannot run, inputs that do not fit
        if not onnx:
            raise
        raise BnfoldError(f"{args.input}: cannot audit this ONNX model: {e}") from None


def summary(table: str) -> str:
    """``-q``: the audit table's headline, its end-to-end block and what to do (no per-norm, per-layer rows)."""
    blocks = table.split("\n\n")
    advice = [b for b in blocks[2:] if b.lstrip().startswith("what to do")]
    return "\n\n".join(blocks[:2] + advice)
