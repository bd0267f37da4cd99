"""Element counts and concrete dims: the arithmetic every size check shares (the cost model, the recomputed
shapes of :mod:`bnfold.io.fx_shapes`, the file readers)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

MAX_ELEMENTS = 1 << 62  # no tensor may have more elements than this (a count past it is refused, never wrapped)


def elements(dims: Iterable[int]) -> int:
    """The element count of ``dims`` in Python integers (capped just over 2**62, never wrapping)."""
    n = 1
    for d in dims:
        if type(d) is not int:  # a SymInt, a numpy integer: converted (a call per int dim would cost more)
            d = int(d)
        n *= d if d > 0 else 0  # a negative dim counts 0
        if n > MAX_ELEMENTS:
            return MAX_ELEMENTS + 1
    return n


def concrete_dim(d: Any, subs: dict) -> int | None:
    """A concrete size for ``d``: an int, a symbol bound by ``subs`` or its hint, else its upper bound."""
    import torch

    if not isinstance(d, torch.SymInt):
        return int(d)
    node = d.node
    expr = getattr(node, "expr", None)
    if expr is not None and subs:
        try:
            v = expr.xreplace(subs)  # a bare symbol becomes its bound value itself (a Python int)
            if isinstance(v, int) or v.is_number:
                return int(v)
        except (TypeError, ValueError, AttributeError):
            pass
    hint = getattr(node, "hint", None)
    if hint is not None:
        return int(hint)
    try:
        upper = node.shape_env.bound_sympy(expr).upper
        if upper.is_finite:
            return int(upper)
    except Exception:  # noqa: BLE001 - no shape environment: unknown
        pass
    return None
