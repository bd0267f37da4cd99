"""The nn.Module frontend: export, fold the program, hand back a module."""

from __future__ import annotations

import copy

import torch

from .measure import fx_sizes, timed
from .report import FoldResult
from .torch_export import fold_program

#: The note a report carries when the module was folded as an eval-mode copy.
EVAL_COPY_NOTE = (
    "the module was in training mode: bnfold folded an eval-mode copy (model.eval()); "
    "the module you passed is unchanged"
)


#: The note an audit report carries when the module was audited as an eval-mode copy.
AUDIT_EVAL_COPY_NOTE = (
    "the module was in training mode: bnfold audited an eval-mode copy (model.eval()); "
    "the module you passed is unchanged"
)


def in_training(module: torch.nn.Module) -> bool:
    return any(m.training for m in module.modules())


def fold_module(
    module: torch.nn.Module,
    example_inputs: tuple,
    only=None,
    exclude=(),
    lower_unfoldable: bool = False,
    rescale=None,
) -> FoldResult:
    """Fold ``module`` through ``torch.export``; ``module`` itself is not modified.

    ``.model`` of the result is the ``torch.fx.GraphModule`` that
    ``ExportedProgram.module()`` returns for the folded program: it computes
    the same function as ``module.eval()`` on inputs shaped like
    ``example_inputs`` (shapes are static, as ``torch.export.export`` makes
    them by default), its parameters keep their state_dict names, and it holds
    no batch norm that could be folded.  A module in training mode (any of its
    submodules) is copied and the copy put in eval mode before export; the
    report's ``notes`` says so.  ``rescale(result) -> result``: a rewrite of the folded program (the fp16 range
    rewrite, ``bnfold.frontends``) before it becomes a module.
    """
    if not isinstance(example_inputs, tuple):
        raise TypeError(f"example_inputs must be a tuple of inputs, got {type(example_inputs).__name__}")
    notes = []
    if in_training(module):
        module = copy.deepcopy(module).eval()
        notes.append(EVAL_COPY_NOTE)
    ep = torch.export.export(module, example_inputs)
    result = timed(
        ep, lambda: fold_program(ep, only=only, exclude=exclude, lower_unfoldable=lower_unfoldable), fx_sizes
    )
    result.report.notes.extend(notes)
    if rescale is not None:  # the fp16 range rewrite of the folded program (``bnfold.rescale``)
        result = rescale(result)
    return FoldResult(result.model.module(), result.report)
