"""``bnfold.fold`` and ``bnfold.check``: one entry point for every model kind."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

from .checks import CheckResult, check_model_path
from .checks import check as _check
from .kinds import LAYER_KINDS, NORM_KINDS
from .report import FoldResult, FoldStats

#: The former name of ``LAYER_KINDS``.
PRODUCER_KINDS = LAYER_KINDS


def _names(value: str | Iterable[str] | None, what: str) -> tuple[str, ...]:
    """A string (comma-separated) or an iterable of strings, as a tuple of non-empty names."""
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    items = tuple(value)
    bad = [v for v in items if not isinstance(v, str)]
    if bad:
        raise TypeError(f"{what} takes a string or an iterable of strings, got {type(bad[0]).__name__} {bad[0]!r}")
    return items


def check_only(only: str | Iterable[str] | None) -> frozenset[str] | None:
    """``only`` ("conv", "conv,linear", "layer_norm" or an iterable) as a set of kinds; None: every kind.

    Layer kinds restrict the layers folded into; normalization kinds restrict the normalizations
    folded (``bnfold.kinds``)."""
    if only is None:
        return None
    kinds = frozenset(_names(only, "only"))
    known = (*LAYER_KINDS, *NORM_KINDS)
    unknown = kinds - set(known)
    if unknown or not kinds:
        raise ValueError(f"unknown kind(s) {sorted(unknown) or repr(only)}; choose from {', '.join(known)}")
    return kinds


def check_exclude(exclude: str | Iterable[str] | None) -> tuple[str, ...]:
    """``exclude`` (a pattern, comma-separated patterns, or an iterable) as a tuple of fnmatch patterns."""
    return _names(exclude, "exclude")


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
) -> FoldResult:
    """Fold normalizations into neighbouring conv / transposed conv / linear layers.

    ``model`` is a ``torch.export.ExportedProgram`` (any ATen IR or an
    ExecuTorch edge program), a ``torch.nn.Module`` (then ``example_inputs``,
    a tuple, is required; a module in training mode is folded as an eval-mode
    copy, and ``report.notes`` says so), an ONNX model (``onnx.ModelProto``),
    or the path of a ``.pt2`` (read with the safe loader) or ``.onnx`` file.
    ``only`` restricts the layers folded into (``"conv"``, ``"conv,linear"`` or
    ``{"conv", "linear"}``); ``exclude`` holds fnmatch patterns on module paths
    (node names for ONNX) of layers and normalizations to leave alone.
    ``lower_unfoldable`` rewrites each eval batch norm that cannot fold as a
    multiply and an add by per-channel constants computed in float64 with the
    model's eps (``report.lowered``), so no backend can recompute it with its
    own eps.  The input is never mutated.
    """
    kinds, patterns = check_only(only), check_exclude(exclude)
    if isinstance(model, (str, os.PathLike)):
        model = _load_path(model)
    if type(model).__name__ == "ModelProto":
        from .onnx import fold_onnx

        _no_inputs(example_inputs, "an ONNX model")
        return _measured(
            model, lambda: fold_onnx(model, only=kinds, exclude=patterns, lower_unfoldable=lower_unfoldable)
        )
    import torch

    if isinstance(model, torch.export.ExportedProgram):
        from .torch_export import fold_program

        _no_inputs(example_inputs, "an ExportedProgram")
        return _measured(
            model, lambda: fold_program(model, only=kinds, exclude=patterns, lower_unfoldable=lower_unfoldable)
        )
    if isinstance(model, torch.nn.Module):
        from .module import fold_module

        if example_inputs is None:
            raise TypeError("fold(module, example_inputs): an nn.Module needs example inputs (a tuple) to export")
        return fold_module(
            model, _check_inputs(example_inputs), only=kinds, exclude=patterns, lower_unfoldable=lower_unfoldable
        )
    raise TypeError(
        f"cannot fold a {type(model).__name__}: pass a torch.export.ExportedProgram, "
        "an nn.Module with example inputs, an ONNX model, or a .pt2 / .onnx path"
    )


def check(
    model: Any,
    example_inputs: tuple | None = None,
    *,
    only: str | Iterable[str] | None = None,
    exclude: str | Iterable[str] | None = None,
) -> CheckResult:
    """What is left to fold in ``model`` (which is not modified): ``CheckResult(foldable, unfoldable)``.

    ``result.ok`` is true when nothing foldable is left; ``result.strict_ok``
    also requires that no normalization is left at all.  Takes what
    :func:`fold` takes.
    """
    return _check(model, example_inputs, only=only, exclude=exclude)


def _no_inputs(example_inputs: Any, what: str) -> None:
    if example_inputs is not None:
        raise TypeError(f"example_inputs is only for nn.Module input; {what} carries its own")


def _load_path(path: str | os.PathLike) -> Any:
    """The model in a ``.pt2`` (safe loader) or ``.onnx`` file; one-line errors for anything else."""
    from .io import load_model

    return load_model(check_model_path(path)).model


def _measured(before: Any, run) -> FoldResult:
    """``run()``'s result with ``report.stats``: the sizes of ``before`` and of the folded model, and the time."""
    start = time.perf_counter()
    result = run()
    seconds = time.perf_counter() - start
    nodes_b, params_b, bytes_b = measure(before)
    nodes_a, params_a, bytes_a = measure(result.model)
    result.report.stats = FoldStats(nodes_b, nodes_a, params_b, params_a, bytes_b, bytes_a, seconds)
    return result


def measure(model: Any) -> tuple[int, int, int]:
    """``(graph nodes, parameter elements, parameter bytes)`` of a program, a GraphModule or an ONNX model.

    Parameters are the program's parameters, buffers and constants (ONNX:
    the main graph's initializers).
    """
    if type(model).__name__ == "ModelProto":
        return _measure_onnx(model)
    graph = model.graph
    if hasattr(model, "graph_signature"):  # an ExportedProgram
        tensors = [*model.state_dict.values(), *model.constants.values()]
    else:
        tensors = [*model.state_dict().values()]
    tensors = [t for t in tensors if hasattr(t, "numel")]
    return len(graph.nodes), sum(t.numel() for t in tensors), sum(t.numel() * t.element_size() for t in tensors)


def _measure_onnx(model: Any) -> tuple[int, int, int]:
    import math

    from onnx import helper

    params = nbytes = 0
    for init in model.graph.initializer:
        n = math.prod(init.dims)
        params += n
        nbytes += n * helper.tensor_dtype_to_np_dtype(init.data_type).itemsize
    return len(model.graph.node), params, nbytes
