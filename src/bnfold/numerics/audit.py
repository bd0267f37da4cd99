"""``bnfold.audit``: what fp16 does to a model's normalizations, unfolded and folded.

Per normalization: its scale range, ``kappa = max_c |mean_c| / sqrt(var_c + eps)``
(the cancellation factor that multiplies the fp16 rounding error of its input),
the fp16 overflow headroom of its input on the given batches, and whether
``bnfold.fold`` folds it.  Per layer: SQNR against the reference run (float64; float32
under the profiles that store fp16: :func:`.runner.reference_dtype`) and NaN/inf counts,
unfolded and folded side by side.  End to end: output SQNR, top-1 agreement
with the reference run and accuracy against labels (classifiers), NaN/inf counts.

One pipeline for every format: the model's frontend (:mod:`bnfold.frontends`) gives its audit hooks
(:class:`~.runner.AuditFormat`: the inputs it takes and the runner's :class:`~.runner.Program` of a
model); ``bnfold.fold`` folds it; both programs run in the lockstep :class:`~.runner.Runner`, the
folded one measured against the unfolded one's reference values (:func:`.rows.ref_names`).  The pieces:
:mod:`.audit_report` (the report's data), :mod:`.rows` (which value each layer row measures, from the
fold report), :mod:`.norm_rows` (the normalization rows and their risk), :mod:`.end_to_end`.
:func:`.execute.execute` is the one place where a program executes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from ..io.budget import inputs_chosen
from ..module import AUDIT_EVAL_COPY_NOTE, in_training
from ..report import FoldResult
from .audit_memory import AuditHold
from .audit_report import AuditReport, EndToEnd, LayerAudit, NormAudit, RuntimeRun  # noqa: F401 (re-exported)
from .batches import as_batches
from .diagnose import diagnose
from .end_to_end import EndToEndSum, FloatAccuracy, check_class_axis, output_index, split_labels, task
from .execute import execute, execute_pair
from .norm_rows import norm_audits
from .prescribe import Search
from .profiles import get_profile
from .rows import Graph, layers, ref_names, rows, segments
from .runner import EmulationResult, Runner, reference_dtype
from .verdict import Floor


def _stage(progress, name: str) -> None:
    """Tell ``progress`` that a stage begins, when it understands stages (``progress.stage(name)``)."""
    if callable(stage := getattr(progress, "stage", None)):
        stage(name)


def audit(
    model,
    inputs=None,
    profile: str = "fp16",
    bn_eps: float | None = None,
    progress: Callable[[int, int], None] | None = None,
    labels=None,
    fold: bool | FoldResult = True,
    name: str | None = None,
    random_inputs: bool = False,
    input_shapes: dict[str, tuple] | None = None,
    runtime: str | None = None,
    class_axis: int | None = None,
    threshold: float | None = None,
    metric: Callable | None = None,
    output: int | str | None = None,
    tensors: bool = True,
    local: bool = True,
    min_agreement: float = 0.99,
    min_sqnr_db: float = 20.0,
    prescribe: bool = True,
    max_runs: int = 8,
) -> AuditReport:
    """Audit ``model`` (an ExportedProgram, an nn.Module exported here in eval mode, or an ONNX ModelProto)
    under ``profile``.

    ``inputs`` is a list of batches, each a tuple of forward arguments (a single tuple or tensor is one
    batch).  ``bn_eps`` replaces the eps of every standalone batch norm in the emulated runs (not in the
    reference run, not in folding).  ``progress(done, total)`` is called after each batch of a stage (emulated
    unfolded and folded, batch by batch; ``progress.stage(name)`` before folding and the emulation, when it has
    one).  ``labels``
    (one tensor for all samples, or one per batch) adds accuracy to the end-to-end numbers of
    classifiers.  With ``fold=False`` only the unfolded program is audited; ``fold`` may also be what
    ``bnfold.fold`` returned for ``model`` (a program or an ONNX model), audited as it is instead of
    folding again.  ``name`` names the model in the table and plot; ``random_inputs`` marks the batches
    as random (top-1 agreement on them is then flagged as weak evidence).

    An ONNX model may come without ``inputs``: then ``input_shapes`` (``{input name: shape}``, fixing
    the dims the model leaves open) shapes random batches; ``runtime`` (``"torch"`` /
    ``"onnxruntime"``) also runs that real runtime in half precision and reports it next to the emulation.

    ``class_axis``, ``threshold`` in (0, 1) and ``metric`` add the outputs' agreement with the float model
    (the unfolded model's reference run, as float32) on the task: top-1 along that axis of the first output
    (default: axis 1 of an ``[N, classes]`` output), the IoU of the above-threshold masks, and
    ``metric(output, reference) -> float`` per batch (:class:`bnfold.numerics.end_to_end.Task` says how).
    ``output`` (an index or the output's name): the output those read instead of the first, and whose SQNR the
    end-to-end numbers and the verdict judge (default: every float output together); each output's own numbers
    are in ``to_dict()``'s ``end_to_end.*.outputs``.

    ``tensors``: measure every floating value of both programs against its reference (the report's
    ``tensors``); with False, only the values the report's rows read (layer outputs and the normalizations'
    outputs; a normalization's input range comes from its probe), 5-15% of the audit's time less on the
    suite's models (BENCHMARKS.md part I): ``bnfold audit`` without ``--json``.  ``local``: also run each layer's
    segment from its emulated inputs (the error it adds by itself, a fold's measured loss): 16-35% more time after the
    fold there; False (``bnfold audit`` without ``--local``): verdicts on the predicted loss.

    The verdict (``report.deploy``, the first line of ``what_to_do``): the model the user would ship (the folded one
    where the fold changed it) keeps the task under the profile: no NaN/inf, top-1 agreement and mask IoU at least
    ``min_agreement``, output SQNR at least ``min_sqnr_db`` (:class:`~.verdict.Floor`).  ``report.ops``: per op, its
    peak against the profile's limit, NaN/inf and SQNR jump; ``report.cause``: the op where damage starts.  A rejected
    model gets ``report.prescription`` when ``prescribe``: a verified rewrite, else the nodes to keep in float32,
    found in at most ``max_runs`` island emulations, shared between the searches on rewritten models and the
    fallback on the model as shipped, plus the cause run and one verification per rewrite tried (:mod:`.prescribe`);
    ``max_runs=0``: the rewrites are verified, the island is not searched (its starting set, the ops past the limit
    and the cause, is listed as not verified).

    ``model`` may also be the path of a ``.pt2`` or ``.onnx`` file (read with the safe loader, as ``bnfold.fold``
    reads it).  Without ``inputs``, random batches shaped like the model's example inputs are drawn (8, as
    ``bnfold audit`` draws them; an nn.Module needs inputs) and the report flags them (``random_inputs``: weak
    evidence).  A program whose batch norms run in training mode is refused (:class:`bnfold.TrainingModeError`):
    its numbers would change from run to run and nothing in it folds; an nn.Module in training mode is audited
    as an eval-mode copy, and ``report.notes`` says so.
    """
    from ..frontends import frontend_for

    spec = task(class_axis, threshold, metric)
    if isinstance(max_runs, bool) or not isinstance(max_runs, int) or max_runs < 0:
        raise ValueError(f"max_runs must be a whole number of runs, 0 or more, got {max_runs!r}")
    # the work the inputs justify (bnfold.io.budget.input_flops) when the user chose their sizes: tensors passed
    # in, or shapes given; random batches shaped like the file's own inputs get the content's budget only (the
    # prescription's folds and runs on the same batches too)
    chosen = (inputs is not None and not random_inputs) or bool(input_shapes)
    most = chosen_elements(inputs, input_shapes) if chosen else None  # what the user chose bounds what it buys
    if isinstance(model, (str, os.PathLike)):  # a .pt2 or .onnx file, read as fold and check read it
        from ..api import load_path

        name = name or os.path.basename(model)
        with inputs_chosen(chosen, elements=most):  # its one run at its shapes
            model = load_path(model)
    floor = Floor(float(min_agreement), float(min_sqnr_db))
    fe = frontend_for(model)
    if fe is None or fe.numerics is None:
        raise TypeError(
            f"cannot audit a {type(model).__name__}: pass an ExportedProgram, an nn.Module, an ONNX ModelProto "
            "or the path of a .pt2 / .onnx file"
        )
    notes = [AUDIT_EVAL_COPY_NOTE] if fe.name == "nn_module" and in_training(model) else []
    fmt = fe.numerics()
    if output is None:
        check_class_axis(spec.class_axis, fmt.output_rank(model))
    prof = get_profile(profile)
    with inputs_chosen(chosen, elements=most):
        model, batches, name, random_inputs, _ = fmt.prepare(
            model,
            inputs,
            input_shapes=input_shapes,
            name=name,
            random_inputs=random_inputs,
            runtime=runtime,
            fold=isinstance(fold, FoldResult) or bool(fold),
            hold=AuditHold.of(3, reference_dtype(prof), local),  # what this audit's runs hold of each value
        )
    folded_model = report = None
    if isinstance(fold, FoldResult):
        folded_model, report = fold.model, fold.report
    elif fold:
        from ..api import fold as bnfold_fold

        _stage(progress, "fold")
        folded_model, report = (result := bnfold_fold(model)).model, result.report
    prog = fmt.program(model)
    spec = replace(spec, output=output_index(output, prog.outputs))
    fprog = fmt.program(folded_model, prog) if folded_model is not None else None
    g, fg = Graph(prog), Graph(fprog) if fprog is not None else None
    row_list = rows(g, fg, report)
    seg = segments(g, [(r.name, r.name, r.output) for r in row_list]) if local else {}
    names = ref_names(g, fg, row_list, report) if fg is not None else {}
    outs = {r.output for r in row_list}
    norm_outs = {st.norm.output for st in prog.steps if st.norm is not None and st.norm.output}
    rounded: dict = {}  # the constants both programs hold (a weight the fold left as it was) are rounded once
    runner = Runner(prog, prof, bn_eps, seg, outs, None if tensors else outs | norm_outs, planned=True, shared=rounded)
    unfolded = EmulationResult(prof.name, not_emulated=runner.not_emulated)
    label_batches = split_labels(labels, batches)
    # the end-to-end numbers, summed as the batches run: no batch's outputs are kept past its run
    sums = {"unfolded": EndToEndSum(spec, label_batches), "folded": EndToEndSum(spec, label_batches)}
    accuracy = FloatAccuracy(spec, label_batches)

    def judge(which: str, outs: list, refs: list) -> None:
        sums[which].add(outs, refs)
        if which == "unfolded":
            accuracy.add(refs)

    folded = frunner = None
    if fprog is None:
        _stage(progress, "emulate unfolded")
        execute(runner, batches, unfolded, progress, judge)
    else:  # batch by batch: one batch's references held at a time (execute_pair)
        fseg = segments(fg, [(r.name, r.name, r.folded) for r in row_list if r.folded is not None]) if local else {}
        fouts = {r.folded for r in row_list if r.folded is not None}
        frunner = Runner(fprog, prof, bn_eps, fseg, fouts, None if tensors else fouts, shared=rounded)
        folded = EmulationResult(prof.name, not_emulated=frunner.not_emulated)
        if not tensors:  # the folded run reads the references of what it measures, its inputs and its norms' inputs
            need = fouts | set(fprog.inputs) | {st.norm.input for st in fprog.steps if st.norm is not None}
            names = {f: u for f, u in names.items() if f in need}
        _stage(progress, "emulate unfolded and folded")
        execute_pair(runner, frunner, batches, (unfolded, folded), progress, names, judge)
    constants = sum(r.held_constants for r in (runner, frunner) if r is not None)

    def reference(i: int, holding: int) -> list:
        """The float model's outputs of batch ``i``, computed again (the unfolded run's reference, bit for bit);
        ``holding``: what the caller holds besides the audit's runners, whose constants are counted here (the
        unfolded runner's by ``reference_outputs`` itself)."""
        return runner.reference_outputs(*batches[i], holding=holding + constants - runner.held_constants)

    layer_rows = layers(row_list, unfolded, folded)
    rep = AuditReport(
        profile=prof.name,
        bn_eps=bn_eps,
        samples=sum(int(b[0].shape[0]) if b and torch.as_tensor(b[0]).dim() else 1 for b in batches),
        batches=len(batches),
        norms=norm_audits(prog, unfolded, report, bn_eps, prof, layer_rows),
        layers=layer_rows,
        unfolded=sums["unfolded"].result(),
        folded=None if folded is None else sums["folded"].result(),
        fp32_accuracy=accuracy.result(),
        fold_report=report,
        errors={k: r.errors for k, r in (("unfolded", unfolded), ("folded", folded)) if r is not None},
        all_tensors=tensors,
        local_runs=local,
        name=name or "model",
        random_inputs=random_inputs,
        reference=str(reference_dtype(prof)).removeprefix("torch."),
        notes=notes,
    )
    rep.floor = floor
    search = Search(prof, bn_eps, batches, lambda: EndToEndSum(spec, label_batches), floor, reference, prog)
    search.shared, search.max_runs, search.holding = rounded, max_runs, constants
    programs, results = {"unfolded": prog, "folded": fprog}, {"unfolded": unfolded, "folded": folded}
    with inputs_chosen(chosen, elements=most):
        diagnose(rep, search, fmt, model, programs, results, tensors, prescribe)
    if runtime is not None:
        from .real_runtimes import runtime_run

        _stage(progress, f"run {runtime}")
        rep.runtime = runtime_run(runtime, model, folded_model, batches, reference, spec)
    return rep


def chosen_elements(inputs: Any, input_shapes: dict | None) -> int:
    """The most input elements the user chose: the largest batch of ``inputs`` (tensors), or the shapes given."""
    from ..io.sizes import elements

    most = sum(elements(dims) for dims in (input_shapes or {}).values())
    if inputs is None:
        return most
    for batch in as_batches(inputs):
        most = max(most, sum(x.numel() for x in batch if isinstance(x, torch.Tensor)))
    return most
