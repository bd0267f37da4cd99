"""The checks every entry point shares.

* :func:`training_norms` / :func:`refuse_training`: normalizations in training
  mode (found by their :class:`~bnfold.report.Code`, never by words); ``bnfold fold``,
  ``bnfold check`` and ``bnfold audit`` refuse such a program.
* :func:`check_model_path`: a one-line error for a folder or a checkpoint
  (``.pth``) given where a model file is expected, with the export recipe.

``bnfold.check`` itself lives beside ``bnfold.fold`` (``bnfold.api``) and its
result type with the report types (``bnfold.report.CheckResult``, also importable
from here); the errors live in ``bnfold.errors`` (re-exported here).
"""

from __future__ import annotations

import os
from typing import Any

from .errors import EXPORT_RECIPE, ModelFileError, NeedsExportError, TrainingModeError
from .frontends import frontend_for
from .report import CheckResult, FoldReport

__all__ = [
    "CHECKPOINT_EXTENSIONS",
    "EXPORT_RECIPE",
    "CheckResult",
    "NeedsExportError",
    "TrainingModeError",
    "check_model_path",
    "refuse_training",
    "training_norms",
]

#: Files that hold weights, not a program: they get the export recipe.
CHECKPOINT_EXTENSIONS = (".pth", ".pt", ".ckpt", ".bin", ".safetensors", ".pkl")


def check_model_path(path: str | os.PathLike) -> str:
    """``path`` as a string; a one-line error for a folder, a missing file or a checkpoint (.pth)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ModelFileError(f"{path}: is a directory; pass the path of a .pt2 or .onnx model file")
    if path.lower().endswith(CHECKPOINT_EXTENSIONS):
        ext = os.path.splitext(path)[1]
        raise NeedsExportError(
            f"{path}: a {ext} file holds weights, not a program; export the model to a .pt2 first (two lines below)"
        )
    return path


# ----------------------------------------------------------------------------- training mode


def training_norms(model: Any, report: FoldReport | None = None) -> list[str]:
    """The names of the normalizations of ``model`` that run in training mode (module paths where known),
    as its frontend (:mod:`bnfold.frontends`) finds them: a ``torch.export.ExportedProgram`` from its
    nodes, an ONNX model from its fold report (pass ``report`` when you already have one, else the model
    is folded to get it).  Anything else holds none."""
    fe = frontend_for(model)
    return fe.training_norms(model, report) if fe is not None else []


def refuse_training(model: Any, name: str, report: FoldReport | None = None) -> None:
    """Raise a one-line :class:`TrainingModeError` naming ``name`` when ``model`` has training-mode norms."""
    names = training_norms(model, report)
    if names:
        raise TrainingModeError.naming(name, names)
