"""``bnfold.fold``: one entry point for every model kind."""

from __future__ import annotations

import os
from typing import Any, Iterable

from .kinds import LAYER_KINDS
from .report import FoldResult

#: The former name of ``LAYER_KINDS``.
PRODUCER_KINDS = LAYER_KINDS


def check_only(only: Iterable[str] | None) -> frozenset[str] | None:
    if only is None:
        return None
    kinds = frozenset(only)
    unknown = kinds - set(LAYER_KINDS)
    if unknown:
        raise ValueError(f"unknown layer kind(s) {sorted(unknown)}; choose from {', '.join(LAYER_KINDS)}")
    return kinds


def fold(model: Any, example_inputs: tuple | None = None, *, only: Iterable[str] | None = None) -> FoldResult:
    """Fold normalizations into neighbouring conv / transposed conv / linear layers.

    ``model`` is a ``torch.export.ExportedProgram`` (any ATen IR or an
    ExecuTorch edge program), a ``torch.nn.Module`` (then ``example_inputs``,
    a tuple, is required) or an ONNX model (``onnx.ModelProto`` or a path to a
    ``.onnx`` file).  ``only`` restricts the layers folded into, e.g.
    ``{"conv", "linear"}``.  The input is never mutated.
    """
    kinds = check_only(only)
    import torch

    if isinstance(model, torch.export.ExportedProgram):
        from .torch_export import fold_program

        if example_inputs is not None:
            raise TypeError("example_inputs is only for nn.Module input; an ExportedProgram carries its own")
        return fold_program(model, only=kinds)
    if isinstance(model, torch.nn.Module):
        from .module import fold_module

        if example_inputs is None:
            raise TypeError("fold(module, example_inputs): an nn.Module needs example inputs (a tuple) to export")
        return fold_module(model, example_inputs, only=kinds)
    if isinstance(model, (str, os.PathLike)) or type(model).__name__ == "ModelProto":
        from .onnx import fold_onnx

        return fold_onnx(model, only=kinds)
    raise TypeError(
        f"cannot fold a {type(model).__name__}: pass a torch.export.ExportedProgram, "
        "an nn.Module with example inputs, or an ONNX model"
    )
