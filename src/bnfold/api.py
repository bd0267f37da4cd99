"""``bnfold.fold`` and ``bnfold.check``: one entry point for every model kind.

The model kind is found in the registry of frontends (``bnfold.frontends``), never by ``isinstance``
here; ``only`` and ``exclude`` are validated once (``bnfold.kinds``) before any work.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from .checks import check_model_path
from .frontends import frontend_for
from .kinds import check_exclude, check_only
from .measure import Sizes
from .report import CheckResult, FoldResult

__all__ = ["check", "check_exclude", "check_only", "fold", "measure"]


def _check_inputs(example_inputs: Any) -> tuple:
    if not isinstance(example_inputs, tuple):
        raise TypeError(
            f"example_inputs must be a tuple of inputs, got {type(example_inputs).__name__}; for one tensor x pass (x,)"
        )
    return example_inputs


def fold(
    model: Any,
    example_inputs: tuple | None = None,
    *,
    only: str | Iterable[str] | None = None,
    exclude: str | Iterable[str] | None = None,
    lower_unfoldable: bool = False,
    fp16_range: Any = None,
    fp16_margin: float = 16.0,
    profile: str | None = None,
    inplace: bool = False,
) -> FoldResult:
    """Fold normalizations into neighbouring conv / transposed conv / linear layers.

    ``model`` is a ``torch.export.ExportedProgram`` (any ATen IR or an
    ExecuTorch edge program), a ``torch.nn.Module`` (then ``example_inputs``,
    a tuple, is required; a module in training mode is folded as an eval-mode
    copy, and ``report.notes`` says so; the result's model is then the folded
    program's ``GraphModule``), an ONNX model (``onnx.ModelProto``), or the
    path of a ``.pt2`` (read with the safe loader) or ``.onnx`` file.
    ``only`` restricts the layers folded into (``"conv"``, ``"conv,linear"`` or
    ``{"conv", "linear"}``) or the normalization kinds folded; ``exclude`` holds
    fnmatch patterns on module paths (node names for ONNX) of layers and
    normalizations to leave alone.  ``lower_unfoldable`` rewrites each eval
    batch norm that cannot fold as a multiply and an add by per-channel
    constants computed in float64 with the model's eps (``report.lowered``), so
    no backend can recompute it with its own eps.  The input is never mutated, unless ``inplace``.

    ``fp16_range`` (batches, as ``bnfold.audit`` takes them): after folding, run the model in float32 on them
    and rewrite every value whose magnitude passes fp16's 65504 over ``fp16_margin`` (and every constant outside
    the limits of ``profile``; None: of every profile bnfold knows) by powers of two, exactly, proved in float64
    on the batches and fresh inputs (``bnfold.rescale``); ``report.rescaled`` lists each value found, what was
    done and the margin reached, or why nothing was (a code).

    ``inplace=True`` (an ``ExportedProgram`` only) CONSUMES the input: the caller gives it up, its
    graph, state_dict and constants become the result's, and it must not be used again (it is left
    half-edited).  The fold then keeps no second copy of the graph or of the weights: each folded
    tensor replaces the one it was computed from, which is released as soon as nothing else holds it
    (drop the ``nn.Module`` the program was exported from, whose parameters it shares), so the peak
    is the weights plus the largest tensor being folded.  The result is the same as without it.
    A ``.pt2`` path is always folded in place: the program read from it is bnfold's own.  An ``.onnx`` path is
    read streamed (:func:`bnfold.io.onnx.load_onnx` ``stream=True``): its external data stays on disk while the
    fold reads one tensor at a time, and the result's model then holds every tensor, the same model as folding
    the file's loaded model, at a peak of about that model instead of several times its weights (``fp16_range``'s
    calibration runs still hold every weight while they run).
    """
    kinds, patterns = check_only(only), check_exclude(exclude)
    options = dict(only=kinds, exclude=patterns, lower_unfoldable=lower_unfoldable, profile=profile)
    if isinstance(model, (str, os.PathLike)):
        return _fold_file(model, example_inputs, inplace, fp16_range, fp16_margin, options)
    frontend = frontend_for(model)
    if frontend is None:
        raise TypeError(
            f"cannot fold a {type(model).__name__}: pass a torch.export.ExportedProgram, "
            "an nn.Module with example inputs, an ONNX model, or a .pt2 / .onnx path"
        )
    if frontend.needs_inputs:
        if example_inputs is None:
            raise TypeError("fold(module, example_inputs): an nn.Module needs example inputs (a tuple) to export")
        example_inputs = _check_inputs(example_inputs)
    elif example_inputs is not None:
        raise TypeError(f"example_inputs is only for nn.Module input; {frontend.what} carries its own")
    request = None
    if fp16_range is not None:
        from .rescale import RangeRequest

        request = RangeRequest(fp16_range, float(fp16_margin), profile)
        request.limits()  # a bad margin or profile is refused before any work
    if not frontend.folds_in_place:
        if inplace:
            raise TypeError(f"inplace=True folds an ExportedProgram; a {type(model).__name__} is folded into a copy")
        return frontend.fold(model, example_inputs, kinds, patterns, lower_unfoldable, request)
    return frontend.fold(model, example_inputs, kinds, patterns, lower_unfoldable, request, inplace=inplace)


def _fold_file(path, example_inputs, inplace: bool, fp16_range, fp16_margin: float, options: dict) -> FoldResult:
    """:func:`fold` of the model in a file: a ``.pt2`` program in place, an ``.onnx`` model streamed."""
    from .io.models import hold, load_model, reading

    loaded = load_model(check_model_path(path), stream=True)
    frontend = frontend_for(loaded.model)
    inplace = inplace or (frontend is not None and frontend.folds_in_place)
    with reading(loaded):  # a streamed model's tensors are read (and the fold's new ones kept) in here
        result = fold(
            loaded.model, example_inputs, inplace=inplace, fp16_range=fp16_range, fp16_margin=fp16_margin, **options
        )
        hold(loaded, result.model)
    return result


def check(
    model: Any,
    example_inputs: tuple | None = None,
    *,
    only: str | Iterable[str] | None = None,
    exclude: str | Iterable[str] | None = None,
) -> CheckResult:
    """What is left to fold in ``model`` (which is not modified): ``CheckResult(foldable, unfoldable)``.

    ``result.ok`` is true when nothing foldable is left; ``result.strict_ok``
    also requires that no normalization is left at all (an elementwise op that
    stays, ``result.kept_ops``, never fails it).  Takes what :func:`fold` takes.
    """
    return CheckResult.from_report(fold(model, example_inputs, only=only, exclude=exclude).report)


def measure(model: Any) -> Sizes:
    """``(graph nodes, parameter elements, parameter bytes)`` of a program, a GraphModule or an ONNX model.

    Parameters are the program's parameters, buffers and constants (ONNX: the
    main graph's initializers and the tensors of its ``Constant`` nodes).
    """
    frontend = frontend_for(model)
    if frontend is None:
        from .measure import fx_sizes

        return fx_sizes(model)  # a GraphModule (no frontend folds a bare one through bnfold.fold)
    return frontend.measure(model)


def load_path(path: str | os.PathLike) -> Any:
    """The model in a ``.pt2`` (safe loader) or ``.onnx`` file; one-line errors for anything else."""
    from .io import load_model

    return load_model(check_model_path(path)).model
