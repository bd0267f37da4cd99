"""bnfold: fold BatchNorm and per-channel affines into neighbouring layers."""

from .api import PRODUCER_KINDS, fold
from .errors import FoldError
from .report import Folded, FoldReport, FoldResult, Skipped

__version__ = "0.1.0"

__all__ = ["fold", "FoldResult", "FoldReport", "Folded", "Skipped", "FoldError", "PRODUCER_KINDS", "__version__"]


def __getattr__(name):
    # The numerics tools import matplotlib lazily; keep `import bnfold` light.
    if name == "audit":
        from .numerics import audit

        return audit
    raise AttributeError(f"module 'bnfold' has no attribute {name!r}")
