"""bnfold: fold BatchNorm and per-channel affines into neighbouring layers.

``import bnfold`` does not import torch: the fold functions import it when
called.  The version comes from the installed package's metadata (pyproject's
``version`` is the one source).
"""

from importlib import metadata as _metadata

from .api import PRODUCER_KINDS, check, fold
from .checks import CheckResult
from .errors import FoldError
from .report import Folded, FoldReport, FoldResult, FoldStats, Skipped

try:
    __version__ = _metadata.version("bnfold")
except _metadata.PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "CheckResult",
    "FoldError",
    "FoldReport",
    "FoldResult",
    "FoldStats",
    "Folded",
    "PRODUCER_KINDS",
    "Skipped",
    "__version__",
    "audit",
    "check",
    "fold",
]


def __getattr__(name):
    # The numerics tools import matplotlib lazily; keep `import bnfold` light.
    if name == "audit":
        from .numerics import audit

        return audit
    raise AttributeError(f"module 'bnfold' has no attribute {name!r}")
