"""bnfold: fold BatchNorm and per-channel affines into neighbouring layers.

``import bnfold`` does not import torch: the fold functions import it when
called.  The version comes from the installed package's metadata (pyproject's
``version`` is the one source).
"""

from importlib import metadata as _metadata

from .api import check, fold, measure
from .errors import BnfoldError, FoldError, ModelFileError, NeedsExportError, TrainingModeError, UnsafeModelError
from .kinds import LAYER_KINDS, NORM_KINDS
from .report import (
    CheckResult,
    Code,
    Folded,
    FoldReport,
    FoldResult,
    FoldStats,
    FoldStep,
    KeptOp,
    Lowered,
    Skipped,
)

try:
    __version__ = _metadata.version("bnfold")
except _metadata.PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "BnfoldError",
    "CheckResult",
    "Code",
    "FoldError",
    "FoldReport",
    "FoldResult",
    "FoldStats",
    "FoldStep",
    "Folded",
    "KeptOp",
    "LAYER_KINDS",
    "Lowered",
    "ModelFileError",
    "NORM_KINDS",
    "NeedsExportError",
    "Skipped",
    "TrainingModeError",
    "UnsafeModelError",
    "__version__",
    "audit",
    "check",
    "fold",
    "measure",
]


def __getattr__(name):
    # The numerics tools import matplotlib lazily; keep `import bnfold` light.
    if name == "audit":
        from .numerics import audit

        return audit
    raise AttributeError(f"module 'bnfold' has no attribute {name!r}")
