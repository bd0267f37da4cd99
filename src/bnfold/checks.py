"""What is left to fold in a model, and the checks every entry point shares.

* :func:`check` / :class:`CheckResult`: the normalizations a model still holds,
  split into foldable ones (``bnfold fold`` would fold them) and unfoldable ones
  (with the reason).
* :func:`training_norms` / :func:`refuse_training`: normalizations in training
  mode, found through the frontends' public parsers; ``bnfold fold``,
  ``bnfold check`` and ``bnfold audit`` refuse such a program.
* :func:`check_model_path`: a one-line error for a folder or a checkpoint
  (``.pth``) given where a model file is expected, with the export recipe.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import BnfoldError, ModelFileError
from .report import Folded, FoldReport, Skipped

#: What to run to make a .pt2 from a checkpoint: printed under the error for a .pth file.
EXPORT_RECIPE = (
    "ep = torch.export.export(model.eval(), example_inputs)",
    'torch.export.save(ep, "model.pt2")',
)

#: Files that hold weights, not a program: they get the export recipe.
CHECKPOINT_EXTENSIONS = (".pth", ".pt", ".ckpt", ".bin", ".safetensors", ".pkl")

#: Words in a skip reason (torch or ONNX) that say a normalization runs in training mode.
_TRAINING_MARKS = ("training mode", "training_mode=1")


class TrainingModeError(BnfoldError):
    """The model holds normalizations in training mode: nothing can be folded until it is exported in eval mode."""


class NeedsExportError(ModelFileError):
    """A checkpoint was given where an exported program is expected; ``hint`` holds the recipe lines."""

    def __init__(self, message: str, hint: tuple[str, ...] = EXPORT_RECIPE):
        super().__init__(message)
        self.hint = hint


@dataclass
class CheckResult:
    """The normalizations left in a model.

    ``foldable``: what ``bnfold.fold`` would fold (:class:`~bnfold.report.Folded`
    entries); ``unfoldable``: what stays, with the reason
    (:class:`~bnfold.report.Skipped`).  ``ok`` is true when nothing foldable is
    left; ``strict_ok`` also requires that nothing unfoldable is left.
    """

    foldable: list[Folded] = field(default_factory=list)
    unfoldable: list[Skipped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.foldable

    @property
    def strict_ok(self) -> bool:
        return not self.foldable and not self.unfoldable

    @classmethod
    def from_report(cls, report: FoldReport) -> CheckResult:
        return cls(list(report.folded), list(report.skipped), list(report.notes))

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "strict_ok": self.strict_ok,
            "foldable": [asdict(f) for f in self.foldable],
            "unfoldable": [asdict(s) for s in self.unfoldable],
            "notes": list(self.notes),
        }


def check(model: Any, example_inputs: tuple | None = None, *, only=None, exclude=()) -> CheckResult:
    """What ``bnfold.fold`` would fold in ``model`` and what it would leave; ``model`` is not modified.

    Takes what :func:`bnfold.fold` takes (a program, an ``nn.Module`` with
    example inputs, an ONNX model, or a ``.pt2`` / ``.onnx`` path).
    """
    from .api import fold

    return CheckResult.from_report(fold(model, example_inputs, only=only, exclude=exclude).report)


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
    """The names of the normalizations of ``model`` that run in training mode (module paths where known).

    ``model`` is a ``torch.export.ExportedProgram`` (read with
    ``bnfold.torch_export.parse_norm``) or an ONNX model (read from its fold
    report: pass ``report`` when you already have one, else the model is folded
    to get it).  Anything else holds none.
    """
    if type(model).__name__ == "ModelProto":
        if report is None:
            from .onnx import fold_onnx

            report = fold_onnx(model).report
        return [s.norm for s in report.skipped if _says_training(s.reason)]
    if hasattr(model, "graph_module") and hasattr(model, "graph_signature"):
        return _program_training_norms(model)
    return []


def _says_training(reason: str) -> bool:
    return any(mark in reason for mark in _TRAINING_MARKS)


def _program_training_norms(ep: Any) -> list[str]:
    from .torch_export.ops import module_path, parse_norm

    names = []
    for node in ep.graph.nodes:
        norm = parse_norm(node) if node.op == "call_function" else None
        if norm is not None and norm.problem and _says_training(norm.problem):
            names.append(module_path(node))
    return names


def refuse_training(model: Any, name: str, report: FoldReport | None = None) -> None:
    """Raise a one-line :class:`TrainingModeError` naming ``name`` when ``model`` has training-mode norms."""
    names = training_norms(model, report)
    if not names:
        return
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    n = len(names)
    raise TrainingModeError(
        f"{name}: {n} normalization{'s' if n != 1 else ''} in training mode ({shown}); "
        "call model.eval() before export and export again"
    )
