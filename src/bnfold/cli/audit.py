"""``bnfold audit``: the fp16 / HTP numerics of a model, unfolded and folded, against a reference run (float64;
float32 under the profiles that store fp16)."""

from __future__ import annotations

import argparse
import gc
import os

from ..checks import refuse_training
from ..errors import BnfoldError
from ..io import quiet
from ..io.budget import inputs_chosen
from . import shapes, verbosity
from .args import opt
from .constants import DEFAULT_RANDOM_BATCHES, EXIT_OK
from .fold import load
from .jsonout import print_json, versioned
from .progress import Progress


def run(args: argparse.Namespace) -> int:
    from ..io.files import ONNX, model_kind
    from ..io.npz import read_npz
    from ..io.output import check_outputs, check_side_file
    from ..numerics import block_list

    debug = opt(args, "debug")
    check_outputs({"plot": args.plot, "block list": args.block_list}, inputs=[args.input, args.batches])
    for what, path in (("plot", args.plot), ("block list", args.block_list)):
        if path:
            check_side_file(path, not_same_as=[args.input], what=what)
    onnx = model_kind(args.input) == ONNX
    fmt = args.block_list_format or ("onnxconverter-common" if onnx else "torch")
    if args.block_list_format and not args.block_list:
        raise BnfoldError("--block-list-format needs --block-list FILE")
    if args.block_list and onnx != (fmt in block_list.ONNX_FORMATS):
        raise BnfoldError(f"--block-list-format {fmt} is not for {'an ONNX model' if onnx else 'a torch program'}")
    progress = Progress(enabled=True)
    frozen = False
    try:
        progress.stage("load")
        arrays = read_npz(args.batches) if args.batches else None  # read once: the allowance and the batches
        chosen, elements = chosen_inputs(args, arrays)
        with inputs_chosen(chosen, elements=elements):  # the inputs' sizes are the user's: their work is too
            loaded = load(args.input, args)
        model = shapes.apply(loaded, args, batches_only=True)  # --input-shape: an ONNX model's dims fixed
        # what is loaded by now (torch, onnx, the model: ~180k objects) stays until the audit ends: the full
        # collections its allocations set off (two or three) need not walk it again (~0.1 s each); a caller's
        # own frozen objects (a process that froze before) are left as they are
        frozen = gc.get_freeze_count() == 0
        if frozen:
            gc.freeze()
        report = _audit(model, args, progress, debug, arrays)
        if args.plot:
            progress.stage("plot")
            with quiet(not debug):
                report.plot(args.plot)  # written atomically
        if args.block_list:
            try:
                block_list.write(args.block_list, report.prescription, fmt, onnx)
            except ValueError as e:
                raise BnfoldError(f"--block-list: {e}") from None
    finally:
        if frozen:
            gc.unfreeze()  # a caller in the same process (tests) gets its collector back as it was
        progress.close()
    if opt(args, "json"):
        payload = versioned(input=args.input)
        for key, path in (("plot", args.plot), ("block_list", args.block_list)):
            if path:
                payload[key] = path
        payload.update(report.to_dict())
        print_json(payload)
    else:
        level = verbosity.level(args)
        print(report.table(level == verbosity.VERBOSE) if level > verbosity.QUIET else summary(report.table()))
        if level == verbosity.VERBOSE and report.fold_report is not None:
            print(f"\nfold report:\n{report.fold_report.table()}")
            print("\n".join(verbosity.entry_details(report.fold_report)))
        for path in (args.plot, args.block_list):
            if path:
                print(f"wrote {path}")
    return EXIT_OK


def chosen_inputs(args: argparse.Namespace, arrays: dict | None) -> tuple[bool, int | None]:
    """:func:`bnfold.io.budget.inputs_chosen`'s arguments for loading the model: whether the user chose the inputs'
    sizes (``--inputs``, ``--input-shape``), and how many elements they hold at most (every array of the ``.npz``
    file, ``arrays`` as read; the shapes given), so that a file's one run at its own example shapes, checked at
    load, is granted those shapes' work up to what the user chose (a file alone, with ``--random``, gets none)."""
    from ..io.npz import npz_elements
    from ..io.sizes import elements

    given = shapes.input_shapes(getattr(args, "input_shape", None))
    if arrays is None and not given:
        return False, None
    n = npz_elements(arrays) if arrays is not None else 0
    return True, max(n, sum(elements(dims) for dims in given.values()))


def _audit(model, args: argparse.Namespace, progress, debug: bool, arrays: dict | None):
    """The audit of the loaded model on ``--inputs`` (``arrays``, read; emptied once the batches are made, so the
    file's arrays are not held beside them) or ``--random`` batches, folded once: the fold's report also tells the
    normalizations in training mode (refused).  The model's frontend
    (:mod:`bnfold.frontends`) makes the batches and says which real runtimes (``--runtime``) it has; an
    ONNX model is audited with the ONNX ``fold`` writes, both emulated (``numerics.audit``)."""
    from .. import fold
    from ..frontends import FRONTENDS, frontend_for
    from ..numerics import audit
    from ..numerics.end_to_end import TaskError
    from ..numerics.verdict import Floor

    fe = frontend_for(model)
    if args.runtime and args.runtime not in fe.runtimes:
        raise BnfoldError(f"--runtime is for {' and '.join(f'{f.noun}s' for f in FRONTENDS if f.runtimes)}")
    cannot_run = fe.numerics().cannot_run
    input_shapes = shapes.input_shapes(getattr(args, "input_shape", None)) or None  # a program's: its batches
    try:
        Floor(args.min_agreement, args.min_sqnr)
    except ValueError as e:
        raise BnfoldError(f"--min-agreement/--min-sqnr: {e}") from None
    progress.stage("fold")
    with quiet(not debug):
        folded = fold(model)
    refuse_training(model, args.input, folded.report)
    try:
        n = args.random or DEFAULT_RANDOM_BATCHES
        batches = fe.batches(model, args.batches, n, args.seed, input_shapes, arrays)
        if arrays is not None:
            arrays.clear()  # the batches are made (copies, or views that hold their arrays): the file's go
        with quiet(not debug):
            return audit(
                model,
                batches,
                profile=args.profile,
                bn_eps=args.bn_eps,
                progress=progress,
                fold=folded,
                name=os.path.basename(args.input),
                random_inputs=not args.batches,
                input_shapes=input_shapes,
                runtime=args.runtime,
                class_axis=args.class_axis,
                threshold=args.threshold,
                tensors=bool(opt(args, "json")),  # every value's error: only the JSON lists them
                local=bool(opt(args, "local")),  # the local runs: only when asked (--local)
                min_agreement=args.min_agreement,
                min_sqnr_db=args.min_sqnr,
                output=args.task_output,
            )
    except TaskError as e:  # a bad --threshold / --class-axis / --output: one line naming the option
        raise BnfoldError(f"--{e.option.replace('_', '-')}: {e}") from None
    except cannot_run as e:  # an op the audit cannot run, inputs that do not fit
        raise BnfoldError(f"{args.input}: cannot audit this {fe.noun}: {e}") from None


def summary(table: str) -> str:
    """``-q``: the audit table's headline, its end-to-end block and what to do (no per-norm, per-layer rows)."""
    blocks = table.split("\n\n")
    advice = [b for b in blocks[2:] if b.lstrip().startswith("what to do")]
    return "\n\n".join(blocks[:2] + advice)
