"""Where the channel axis goes through a shape-only op, static or symbolic shapes alike."""

from __future__ import annotations

import math
from typing import Any

from torch.fx import Node

from .ops import IDENTITY_HOPS, node_key


def follow_axis(node: Node, before: tuple | None, after: tuple | None, axis: int, forward: bool) -> int | None:
    """The channel axis after the hop ``node`` (``forward``) or before it, or None if the
    hop moves or merges it.  ``before``/``after`` are the shapes of its input and output."""
    if node_key(node) in IDENTITY_HOPS:
        return axis
    if before is None or after is None:
        return None
    if node_key(node).startswith("aten::unsqueeze"):
        d = int(node.args[1])
        d = d + len(after) if d < 0 else d
        if forward:
            return axis + 1 if d <= axis else axis
        return None if d == axis else (axis - 1 if d < axis else axis)
    key = node_key(node)
    if key.startswith("aten::transpose"):  # its own inverse
        d0, d1 = (int(d) % len(before) for d in node.args[1:3])
        return d1 if axis == d0 else d0 if axis == d1 else axis
    if key.startswith("aten::permute"):
        perm = [int(d) % len(before) for d in node.args[1]]
        return perm.index(axis) if forward else perm[axis]
    if key in NON_CHANNEL_HOPS:
        return _non_channel(node, len(before), axis, forward)
    src, dst = (before, after) if forward else (after, before)
    return _same_place(src, dst, axis)


#: Hops that pick along axes other than the channel's (issue 21): select, slice.  ``mean.dim`` has
#: an axis rule below but is no hop yet (see ops.RESHAPE_HOPS).
NON_CHANNEL_HOPS = {
    "aten::select.int",
    "aten::select_copy.int",
    "aten::slice.Tensor",
    "aten::slice_copy.Tensor",
    "aten::mean.dim",
}


def _non_channel(node: Node, rank: int, axis: int, forward: bool) -> int | None:
    """The channel axis through a select / slice / mean over other axes (``rank``: of its input)."""
    key = node_key(node)
    if key.startswith("aten::slice"):
        d = int(node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % rank
        return None if axis == d else axis
    if key.startswith("aten::select"):
        removed, keep = {int(node.args[1]) % rank}, False
    else:  # mean.dim(x, dim, keepdim=False, *, dtype=None)
        if node.kwargs.get("dtype") is not None or not node.args[1]:
            return None
        removed = {int(d) % rank for d in node.args[1]}
        keep = bool(node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False))
    kept = list(range(rank)) if keep else [i for i in range(rank) if i not in removed]
    if forward:
        return None if axis in removed else kept.index(axis)
    source = kept[axis] if axis < len(kept) else None
    return None if source is None or source in removed else source


def _same_place(src: tuple, dst: tuple, axis: int) -> int | None:
    """The axis of ``dst`` with the size of ``src[axis]`` and the same number of elements before it."""
    if all(isinstance(s, int) for s in src + dst):
        lead, prod = math.prod(src[:axis]), 1
        for j, size in enumerate(dst):
            if prod == lead and size == src[axis]:
                return j
            prod *= size
        return None
    lead, size = _product(src[:axis]), _expr(src[axis])
    prod = _product(())
    for j, d in enumerate(dst):
        if _equal(prod, lead) and _equal(_expr(d), size):
            return j
        prod = prod * _expr(d)
    return None


def _expr(size: Any):
    import sympy

    node = getattr(size, "node", None)
    return node.expr if node is not None else sympy.Integer(int(size))


def _product(sizes: tuple):
    import sympy

    return sympy.Mul(*[_expr(s) for s in sizes]) if sizes else sympy.Integer(1)


def _equal(a, b) -> bool:
    import sympy

    return a == b or sympy.expand(a - b) == 0
