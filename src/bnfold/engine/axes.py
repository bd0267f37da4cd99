"""Following a channel axis through a reshape: one rule for every graph kind.

A reshape keeps the channel axis when some axis of its result has the
channel axis's size and as many elements before it (equivalently, when the
dims before are unknown, as many after it).  Dims are ints, symbols or None
(unknown); an adapter passes ``product``/``equal`` for the symbols of its
format (ONNX dim names, torch SymInts).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from math import prod
from typing import Any


def channel_axis(axis: int, rank: int | None) -> int:
    """``axis`` as an index from the start (a negative axis counts from the end); as is for an unknown rank."""
    return axis % rank if rank else axis


def dims_product(dims: Sequence) -> tuple | None:
    """A comparable product of dims: (the product of the ints, the sorted symbols), or None if a dim is unknown."""
    if any(d is None for d in dims):
        return None
    return prod(d for d in dims if isinstance(d, int)), tuple(sorted(str(d) for d in dims if not isinstance(d, int)))


def same_place(
    src: Sequence,
    dst: Sequence,
    axis: int,
    product: Callable[[Sequence], Any] = dims_product,
    equal: Callable[[Any, Any], bool] = operator.eq,
) -> int | None:
    """The axis of ``dst`` holding ``src[axis]`` (the first with its size and as many elements before
    it, or after it), or None when the reshape moves or merges it."""
    if not 0 <= axis < len(src) or src[axis] is None:
        return None
    size = src[axis]
    before, after = product(src[:axis]), product(src[axis + 1 :])
    for k, d in enumerate(dst):
        if d is None or not equal(d, size):
            continue
        pre, post = product(dst[:k]), product(dst[k + 1 :])
        if (before is not None and pre is not None and equal(before, pre)) or (
            after is not None and post is not None and equal(after, post)
        ):
            return k
    return None
