"""``bnfold.audit``: what fp16 does to a model's normalizations, unfolded and folded.

Per normalization: its scale range, ``kappa = max_c |mean_c| / sqrt(var_c + eps)``
(the cancellation factor that multiplies the fp16 rounding error of its input),
the fp16 overflow headroom of its input on the given batches, and whether
``bnfold.fold`` folds it.  Per layer: SQNR against float64 and NaN/inf counts,
unfolded and folded side by side.  End to end: output SQNR, top-1 agreement
with the float32 model (classifiers) and NaN/inf counts.

The pieces, one module each: :mod:`.audit_report` (the report's data), :mod:`.norm_rows` (the
normalization rows and their risk), :mod:`.fold_walk` (which tensor each layer row measures in
the unfolded and folded torch program), :mod:`.end_to_end` (output numbers),
:mod:`.onnx_audit` (the ONNX audit: the ONNX model and the ONNX that ``bnfold fold`` writes,
each emulated by :mod:`.onnx_emulator`).  This module runs them: :func:`_execute` is the one
place where a program executes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .audit_report import AuditReport, EndToEnd, LayerAudit, NormAudit, RuntimeRun  # noqa: F401 (re-exported)
from .batches import as_batches as _as_batches
from .emulator import EmulationResult, Emulator
from .end_to_end import _end_to_end, _fp32_accuracy, _split_labels, check_class_axis, first_output_rank, task
from .fold_walk import _FoldMap, _layers, _rows, _segments
from .norm_rows import _norms
from .profiles import get_profile

# -- running it ------------------------------------------------------------------------------------


def _export(module: torch.nn.Module, batches: list[tuple]) -> torch.export.ExportedProgram:
    """Export ``module`` in eval mode; the batch dimension is dynamic when batch sizes differ."""
    sizes = {b[0].shape[0] for b in batches if b and isinstance(b[0], torch.Tensor)}
    dynamic = None
    if len(sizes) > 1:
        dim = torch.export.Dim("batch")
        dynamic = tuple({0: dim} if isinstance(a, torch.Tensor) else None for a in batches[0])
    was_training = module.training
    module.eval()
    try:
        return torch.export.export(module, batches[0], dynamic_shapes=dynamic)
    finally:
        module.train(was_training)


def _stage(progress, name: str) -> None:
    """Tell ``progress`` that a stage begins, when it understands stages (``progress.stage(name)``)."""
    stage = getattr(progress, "stage", None)
    if callable(stage):
        stage(name)


def _execute(emu: Emulator, batches: list[tuple], result: EmulationResult, progress, forward=None) -> list:
    """Run ``emu`` on every batch into ``result`` (the one place where the audit executes a program);
    with ``forward`` also the float32 program, returning its top-1 predictions per batch (classifiers)."""
    on_node = getattr(progress, "node", None)
    top1 = []
    for done, batch in enumerate(batches, 1):
        result.add(emu.run(*batch, on_node=on_node))
        if forward is not None:
            with torch.no_grad():
                out = forward(*batch)
            first = out[0] if isinstance(out, (tuple, list)) else out
            if isinstance(first, torch.Tensor) and first.dim() == 2 and first.shape[1] > 1:
                top1.append(first.argmax(1))
        if progress is not None:
            progress(done, len(batches))
    return top1


def audit(
    model,
    inputs=None,
    profile: str = "fp16",
    bn_eps: float | None = None,
    progress: Callable[[int, int], None] | None = None,
    labels=None,
    fold: bool = True,
    name: str | None = None,
    random_inputs: bool = False,
    input_shapes: dict[str, tuple] | None = None,
    runtime: str | None = None,
    class_axis: int | None = None,
    threshold: float | None = None,
    metric: Callable | None = None,
) -> AuditReport:
    """Audit ``model`` (an ExportedProgram, an nn.Module exported here in eval mode, or an ONNX ModelProto)
    under ``profile``.

    ``inputs`` is a list of batches, each a tuple of forward arguments (a
    single tuple or tensor is one batch).  ``bn_eps`` replaces the eps of
    every standalone batch norm in the emulated runs (not in the float64
    reference, not in folding).  ``progress(done, total)`` is called after
    each emulated batch of a stage (``progress.stage(name)`` before folding and each
    emulation, when it has one).  ``labels`` (one tensor for all samples, or
    one per batch) adds accuracy to the end-to-end numbers of classifiers.
    With ``fold=False`` only the unfolded program is audited.  ``name`` names
    the model in the table and plot; ``random_inputs`` marks the batches as
    random (top-1 agreement on them is then flagged as weak evidence).

    An ONNX model is audited by :func:`bnfold.numerics.onnx_audit.audit_onnx`: the model and the
    folded ONNX that ``bnfold.fold`` writes, each emulated.  There ``inputs`` may be None: then
    ``input_shapes`` (``{input name: shape}``, fixing the dims the model leaves open) shapes
    random batches; ``runtime`` (``"torch"`` / ``"onnxruntime"``) also runs that real runtime in
    half precision and reports it next to the emulation.

    Beside the SQNR, the end-to-end numbers give the outputs' agreement with the float model (the
    unfolded model in float64, as float32) on the task (see :class:`bnfold.numerics.end_to_end.Task`):
    ``class_axis`` (top-1 agreement along that axis of the first output; default: axis 1 of an
    ``[N, classes]`` output), ``threshold`` in (0, 1) (``mask_iou``: the IoU of the first output's
    above-threshold mask with the float model's; 1.0 when both are empty) and ``metric``
    (``fn(output, reference) -> float`` per batch, averaged over batches weighted by sample count).

    A program whose batch norms run in training mode is refused (ValueError):
    its numbers would change from run to run and nothing in it folds.
    """
    spec = task(class_axis, threshold, metric)
    check_class_axis(spec.class_axis, first_output_rank(model))
    if type(model).__name__ == "ModelProto":
        from .onnx_audit import audit_onnx

        return audit_onnx(
            model,
            inputs,
            profile=profile,
            bn_eps=bn_eps,
            progress=progress,
            labels=labels,
            fold=fold,
            name=name,
            random_inputs=random_inputs or inputs is None,
            input_shapes=input_shapes,
            runtime=runtime,
            task=spec,
        )
    if inputs is None:
        raise ValueError("audit needs input batches for a torch program or module")
    if runtime is not None:
        raise ValueError("runtime= is available for ONNX models (the torch-half run is the fp16 profile itself)")
    batches = _as_batches(inputs)
    prof = get_profile(profile)
    ep = model if isinstance(model, torch.export.ExportedProgram) else None
    if ep is None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(
                f"cannot audit a {type(model).__name__}: pass an ExportedProgram, an nn.Module or an ONNX ModelProto"
            )
        name = name or type(model).__name__
        ep = _export(model, batches)
    from ..checks import training_norms

    training = training_norms(ep)
    if training:
        raise ValueError(
            f"the program has batch norms in training mode ({', '.join(training[:3])}"
            f"{', ...' if len(training) > 3 else ''}); call model.eval() before torch.export"
        )
    from ..io.cost import audit_plan  # the cost check before anything runs (see bnfold.io.cost)

    audit_plan(ep, batches, runs=3 if fold else 2, name=name)
    fold_result = None
    if fold:
        from ..api import fold as bnfold_fold

        _stage(progress, "fold")
        fold_result = bnfold_fold(ep)
    fmap = _FoldMap.of(fold_result.report, fold_result.model) if fold_result is not None else None
    rows = _rows(ep, fmap)
    unfolded = EmulationResult(prof.name)
    _stage(progress, "emulate unfolded")
    emu = Emulator(ep, prof, bn_eps, _segments(ep.graph_module.graph, [(r.name, r.name, r.output) for r in rows]))
    fp32_top1 = _execute(emu, batches, unfolded, progress, forward=ep.module())
    folded = None
    if fold_result is not None:
        folded = EmulationResult(prof.name)
        _stage(progress, "emulate folded")
        fgraph = fold_result.model.graph_module.graph
        fseg = _segments(fgraph, [(r.name, r.name, r.folded) for r in rows if r.folded is not None])
        _execute(Emulator(fold_result.model, prof, bn_eps, fseg), batches, folded, progress)
    label_batches = _split_labels(labels, batches)
    fp32_accuracy = _fp32_accuracy(unfolded.reference, fp32_top1, label_batches, spec)
    samples = sum(b[0].shape[0] if b and isinstance(b[0], torch.Tensor) and b[0].dim() else 1 for b in batches)
    errors = {"unfolded": unfolded.errors}
    if folded is not None:
        errors["folded"] = folded.errors
    layers = _layers(rows, unfolded, folded)
    return AuditReport(
        profile=prof.name,
        bn_eps=bn_eps,
        samples=samples,
        batches=len(batches),
        norms=_norms(ep, unfolded, fold_result.report if fold_result else None, bn_eps, prof, layers),
        layers=layers,
        unfolded=_end_to_end(unfolded, unfolded.reference, fp32_top1, label_batches, spec),
        folded=None if folded is None else _end_to_end(folded, unfolded.reference, fp32_top1, label_batches, spec),
        fp32_accuracy=fp32_accuracy,
        fold_report=fold_result.report if fold_result else None,
        errors=errors,
        name=name or "model",
        random_inputs=random_inputs,
    )
