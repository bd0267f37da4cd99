"""The nn.Module frontend: export, fold the program, hand back a module."""

from __future__ import annotations

import torch

from .report import FoldResult
from .torch_export import fold_program


def fold_module(module: torch.nn.Module, example_inputs, only=None) -> FoldResult:
    """Fold ``module`` through ``torch.export``; ``module`` itself is not modified.

    ``.model`` of the result is the ``torch.fx.GraphModule`` that
    ``ExportedProgram.module()`` returns for the folded program: it computes
    the same function as ``module`` on inputs shaped like ``example_inputs``
    (shapes are static, as ``torch.export.export`` makes them by default), its
    parameters keep their state_dict names, and it holds no batch norm that
    could be folded.  Export a model in eval mode: a batch norm in training
    mode is reported, not folded.
    """
    if not isinstance(example_inputs, tuple):
        example_inputs = tuple(example_inputs) if isinstance(example_inputs, list) else (example_inputs,)
    ep = torch.export.export(module, example_inputs)
    result = fold_program(ep, only=only)
    return FoldResult(result.model.module(), result.report)
