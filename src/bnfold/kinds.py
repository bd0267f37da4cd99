"""The layer kinds a normalization folds into and the normalization kinds: the one list of each,
torch-free so that ``import bnfold`` stays light.  ``bnfold.fold_math`` gives each layer kind its
weight layout.  :func:`check_only` and :func:`check_exclude` validate the ``only`` / ``exclude``
arguments of every entry point (``bnfold.fold``, the frontends, the engine, the ExecuTorch passes).
"""

from __future__ import annotations

from collections.abc import Iterable

#: ``conv`` weight ``[out, in/groups, *k]``; ``conv_transpose`` ``[in, out/groups, *k]``; ``linear`` ``[out, in]``.
LAYER_KINDS = ("conv", "conv_transpose", "linear")

#: The normalization kinds bnfold folds; ``only=`` may name these too (then other kinds stay).
NORM_KINDS = ("batch_norm", "layer_norm", "rms_norm", "group_norm")


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
    folded.  An unknown kind (or an empty selection) is a ValueError."""
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
