"""Where the channel axis goes through a shape-only op, static or symbolic shapes alike.

Each hop's row in ``ops.HOPS`` names its rule here; a new kind of reshape is a
new rule in ``AXIS_RULES``, a new spelling of a known kind is only a row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.fx import Node

from ..engine.axes import same_place
from .ops import HOPS, node_key, transpose_dims


def follow_axis(node: Node, before: tuple | None, after: tuple | None, axis: int, forward: bool) -> int | None:
    """The channel axis after the hop ``node`` (``forward``) or before it, or None if the
    hop moves or merges it.  ``before``/``after`` are the shapes of its input and output."""
    rule = AXIS_RULES[HOPS[node_key(node)]]
    if rule is None:  # the identity
        return axis
    if before is None or after is None:
        return None
    return rule(node, before, after, axis, forward)


def _unsqueeze(node: Node, before: tuple, after: tuple, axis: int, forward: bool) -> int | None:
    d = int(node.args[1])
    d = d + len(after) if d < 0 else d
    if forward:
        return axis + 1 if d <= axis else axis
    return None if d == axis else (axis - 1 if d < axis else axis)


def _transpose(node: Node, before: tuple, after: tuple, axis: int, forward: bool) -> int | None:
    d0, d1 = (int(d) % len(before) for d in transpose_dims(node))  # its own inverse
    return d1 if axis == d0 else d0 if axis == d1 else axis


def _permute(node: Node, before: tuple, after: tuple, axis: int, forward: bool) -> int | None:
    perm = [int(d) % len(before) for d in node.args[1]]
    return perm.index(axis) if forward else perm[axis]


def _movedim(node: Node, before: tuple, after: tuple, axis: int, forward: bool) -> int | None:
    # movedim(x, source, destination): dims ``source`` go to ``destination``, the others keep their order
    n = len(before)
    src, dst = ([int(d) % n for d in (a if isinstance(a, (list, tuple)) else [a])] for a in node.args[1:3])
    perm: list = [None] * n  # output position -> input dim
    for s, d in zip(src, dst, strict=True):
        perm[d] = s
    rest = iter(i for i in range(n) if i not in src)
    perm = [p if p is not None else next(rest) for p in perm]
    return perm.index(axis) if forward else perm[axis]


def _along_other_axes(removed_axes: Callable) -> Callable:
    """The rule of a hop that picks, slices, averages or pools along axes other than the channel's
    (a per-channel affine commutes with it; with a maximum, only a non-negative scale does):
    ``removed_axes(node, rank)`` gives the axes it acts on (of its input, of rank ``rank``) and
    whether they stay in the result; None: not known."""

    def follow(node: Node, before: tuple, after: tuple, axis: int, forward: bool) -> int | None:
        rank = len(before)
        found = removed_axes(node, rank)
        if found is None:
            return None
        removed, keep = found
        kept = list(range(rank)) if keep else [i for i in range(rank) if i not in removed]
        if forward:
            return None if axis in removed else kept.index(axis)
        source = kept[axis] if axis < len(kept) else None
        return None if source is None or source in removed else source

    return follow


def _selected(node: Node, rank: int) -> tuple[set, bool] | None:
    # select(x, dim, index)
    return {int(node.args[1]) % rank}, False


def _sliced(node: Node, rank: int) -> tuple[set, bool] | None:
    # slice(x, dim=0, start=None, end=None, step=1)
    return {int(node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % rank}, True


def _index_selected(node: Node, rank: int) -> tuple[set, bool] | None:
    # index_select(x, dim, index): the dim stays, with len(index) entries
    return {int(node.args[1]) % rank}, True


def _indexed(node: Node, rank: int) -> tuple[set, bool] | None:
    # index.Tensor(x, [None, ..., idx]): one 1-D index (ops.hop_is_exact) at its position
    (pos,) = [i for i, index in enumerate(node.args[1]) if index is not None]
    return {pos}, True


def _reduced(node: Node, rank: int) -> tuple[set, bool] | None:
    # mean.dim(x, dim, keepdim=False, *, dtype=None), amax(x, dim=[], keepdim=False); no dims: all of them
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if node.kwargs.get("dtype") is not None or not dims:
        return None
    keep = bool(node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False))
    return {int(d) % rank for d in dims}, keep


def _pooled(spatial: int) -> Callable:
    """A pool over the last ``spatial`` axes (batched or not), which keeps every axis."""

    def axes(node: Node, rank: int) -> tuple[set, bool] | None:
        return set(range(rank - spatial, rank)), True

    return axes


def _reshape(node: Node, before: tuple, after: tuple, axis: int, forward: bool) -> int | None:
    src, dst = (before, after) if forward else (after, before)
    if all(isinstance(s, int) for s in src + dst):
        return same_place(src, dst, axis)
    return same_place([_expr(s) for s in src], [_expr(d) for d in dst], axis, _product, _equal)


#: How the channel axis passes each kind of hop (the value of its row in ``ops.HOPS``):
#: ``rule(node, shape before, shape after, axis, forward) -> axis | None (lost)``; None: the identity.
AXIS_RULES: dict[str, Callable | None] = {
    "identity": None,
    "reshape": _reshape,
    "expand": _reshape,
    "unsqueeze": _unsqueeze,
    "transpose": _transpose,
    "permute": _permute,
    "movedim": _movedim,
    "select": _along_other_axes(_selected),
    "slice": _along_other_axes(_sliced),
    "index_select": _along_other_axes(_index_selected),
    "index": _along_other_axes(_indexed),
    "reduce": _along_other_axes(_reduced),
    "pool1d": _along_other_axes(_pooled(1)),
    "pool2d": _along_other_axes(_pooled(2)),
    "pool3d": _along_other_axes(_pooled(3)),
}


def _expr(size: Any):
    import sympy

    node = getattr(size, "node", None)
    return node.expr if node is not None else sympy.Integer(int(size))


def _product(sizes):
    import sympy

    return sympy.Mul(*sizes) if sizes else sympy.Integer(1)


def _equal(a, b) -> bool:
    import sympy

    return a == b or sympy.expand(a - b) == 0
