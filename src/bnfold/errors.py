"""Errors bnfold raises for bad input; each message is one line that says what to do."""

from __future__ import annotations

from .report import Code


class BnfoldError(Exception):
    """Base class; the CLI prints ``str(err)`` and exits with code 2."""


class ModelFileError(BnfoldError):
    """A model file is missing, unreadable, of the wrong format, or unsafe to load.  ``names_file``: the message
    starts with the file at fault, another than the one being written (the input a streamed save copies from), so
    :func:`bnfold.io.errors.naming` puts no other in front."""

    names_file: bool = False


class UnsafeModelError(ModelFileError):
    """A model file would run code on load (pickle) and ``trust`` was not given."""


class TrainingModeError(BnfoldError):
    """The model holds normalizations in training mode: nothing can be folded until it is exported in eval mode."""

    @classmethod
    def naming(cls, name: str, norms: list[str]) -> TrainingModeError:
        """The one-line error for model ``name`` whose normalizations ``norms`` run in training mode."""
        shown = ", ".join(norms[:3]) + (f" and {len(norms) - 3} more" if len(norms) > 3 else "")
        n = len(norms)
        return cls(
            f"{name}: {n} normalization{'s' if n != 1 else ''} in training mode ({shown}); "
            "call model.eval() before export and export again"
        )


#: What to run to make a .pt2 from a checkpoint: printed under the error for a .pth file.
EXPORT_RECIPE = (
    "ep = torch.export.export(model.eval(), example_inputs)",
    'torch.export.save(ep, "model.pt2")',
)


class NeedsExportError(ModelFileError):
    """A checkpoint was given where an exported program is expected; ``hint`` holds the recipe lines."""

    def __init__(self, message: str, hint: tuple[str, ...] = EXPORT_RECIPE):
        super().__init__(message)
        self.hint = hint


class FoldError(ValueError):
    """A fold that cannot be done exactly; the message is the reason and ``code`` its
    :class:`~bnfold.report.Code` (both end up in the report)."""

    def __init__(self, message: str, code: Code = Code.FOLD_MATH):
        super().__init__(message)
        self.code = code
