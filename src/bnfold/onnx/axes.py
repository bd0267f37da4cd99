"""Where the channel axis goes through a shape-only hop (Identity, Dropout,
Unsqueeze, Squeeze, Transpose, Reshape, Flatten), forward or backward, and
what the producer and the readers of a value imply about a shape that ONNX
shape inference left unknown (a Reshape to a computed shape, dynamic dims).
"""

from __future__ import annotations

from math import prod
from typing import Any

import numpy as np

from ..engine.graph import Hop
from .nodes import attr
from .ops import IDENTITY_HOPS, NORMS


def follow_axis(graph: Any, hop: Hop, axis: int, forward: bool) -> int | str:
    """The channel axis after ``hop`` (``forward``) or before it (the inverse map), or why it is lost."""
    p = hop.node.proto
    if p.op_type in IDENTITY_HOPS:
        return axis
    what = graph.describe_node(hop.node)
    r_in, r_out = graph.shape_info(hop.input).rank, graph.shape_info(hop.output).rank
    rank = r_in if forward else r_out
    if rank is None:
        side = "before" if forward else "after"
        return f"the rank {side} {what} is unknown, so the channel axis cannot be followed"
    if rank == 0:
        return f"{what} reads or writes a scalar, which has no channel axis"
    a = axis % rank
    if p.op_type == "Transpose":
        perm = attr(p, "perm")
        perm = list(range(rank - 1, -1, -1)) if perm is None else [int(x) % rank for x in perm]
        if sorted(perm) != list(range(rank)):
            return f"{what} has a perm that does not match the rank {rank}"
        return perm.index(a) if forward else perm[a]
    if p.op_type in ("Unsqueeze", "Squeeze"):
        return _squeeze(graph, hop, a, rank, forward, what)
    if p.op_type in NON_CHANNEL_HOPS:
        return _non_channel(graph, hop, a, forward, what)
    before, after = graph.shape_info(hop.input).shape, _shape_after(graph, hop)
    if before is None or after is None:
        return (
            f"the shape {'before' if before is None else 'after'} {what} is unknown, so the channel axis "
            "cannot be followed"
        )
    found = _same_place(before, after, a) if forward else _same_place(after, before, a)
    if found is None:
        return (
            f"{what} does not keep the channel axis (shape {_fmt(before)} -> {_fmt(after)}, channels on axis "
            f"{a} {'before' if forward else 'after'} it)"
        )
    return found


def axes_of(graph: Any, hop: Hop) -> list[int] | None | str:
    """The ``axes`` of Squeeze/Unsqueeze (an attribute before opset 13, an input after); None: absent."""
    p = hop.node.proto
    if len(p.input) > 1 and p.input[1]:
        c = graph.const(graph.value(hop.node.gi, p.input[1]))
        if c is None:
            return f"{graph.describe_node(hop.node)} has axes that are not a constant"
        return [int(a) for a in np.asarray(c.value).reshape(-1)]
    a = attr(p, "axes")
    return None if a is None else [int(x) for x in a]


def _squeeze(graph: Any, hop: Hop, a: int, rank: int, forward: bool, what: str) -> int | str:
    """Unsqueeze maps the narrow input to the wide output, Squeeze the wide input to the narrow output."""
    axes = axes_of(graph, hop)
    if isinstance(axes, str):
        return axes
    unsqueeze = hop.node.proto.op_type == "Unsqueeze"
    if axes is None:
        dims = graph.shape_info(hop.input).shape
        if unsqueeze:
            return f"{what} has no axes"
        if dims is None or any(not isinstance(d, int) for d in dims):
            return f"{what} squeezes every size-1 axis and the shape before it is not static"
        axes = [i for i, d in enumerate(dims) if d == 1]
    from_wide = forward != unsqueeze  # the source side is the wide one
    wide = rank if from_wide else rank + len(axes)
    changed = {x % wide for x in axes}
    kept = [i for i in range(wide) if i not in changed]
    if not from_wide:
        return kept[a] if a < len(kept) else f"{what} does not match the rank {rank}"
    if a in changed:
        return f"{what} removes the channel axis" if not unsqueeze else f"the channel axis is one {what} inserts"
    return kept.index(a)


def _shape_after(graph: Any, hop: Hop) -> list | None:
    """The output dims of a Reshape or Flatten: inferred, completed from a constant target shape."""
    p = hop.node.proto
    before = graph.shape_info(hop.input).shape
    after = graph.shape_info(hop.output).shape
    if p.op_type == "Flatten":
        if after is None and before is not None and all(isinstance(d, int) for d in before):
            k = int(attr(p, "axis", 1)) % (len(before) or 1)
            return [prod(before[:k]), prod(before[k:])]
        return None if after is None else list(after)
    target = graph.const(graph.value(hop.node.gi, p.input[1])) if len(p.input) > 1 and p.input[1] else None
    if target is None or before is None:
        return None if after is None else list(after)
    built = []
    for i, s in enumerate(int(x) for x in np.asarray(target.value).reshape(-1)):
        if s == 0 and not attr(p, "allowzero", 0):
            built.append(before[i] if i < len(before) else None)
        else:
            built.append(None if s == -1 else s)
    if after is not None and len(after) == len(built):
        built = [b if b is not None else d for b, d in zip(built, after, strict=True)]
    return built


def _product(dims) -> tuple | None:
    """A comparable product of dims: (int part, sorted symbols), or None if a dim is unknown."""
    if any(d is None for d in dims):
        return None
    return prod(d for d in dims if isinstance(d, int)), tuple(sorted(d for d in dims if isinstance(d, str)))


def _same_place(src, dst, axis: int) -> int | None:
    """The axis of ``dst`` with the size of ``src[axis]`` and as many elements before it (or after it)."""
    if not 0 <= axis < len(src):
        return None
    size = src[axis]
    if size is None:
        return None
    for k, d in enumerate(dst):
        if d != size:
            continue
        pre_src, pre_dst = _product(src[:axis]), _product(dst[:k])
        post_src, post_dst = _product(src[axis + 1 :]), _product(dst[k + 1 :])
        if (pre_src is not None and pre_src == pre_dst) or (post_src is not None and post_src == post_dst):
            return k
    return None


def _fmt(dims) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


# --------------------------------------------------------------------------- what inference left unknown

_SAME_RANK = ("Identity", "Dropout", "Transpose", "Mul", "Div", "Add", "Sub", *NORMS)
_SAME_SHAPE = ("Identity", "Dropout", "Relu", *NORMS)
_BINARY = ("Mul", "Div", "Add", "Sub")


def consumer_dims(graph: Any, value: Any) -> list | None:
    """The dims of ``value`` that its readers imply (None where they say nothing), or None.

    A layer fixes the size of the axis it reduces over (a MatMul's last, a Gemm's
    K, a Conv's channels); an op that keeps the shape passes its output's dims
    back; a binary op whose other operand has a lower rank passes its rank back.
    """
    for node in graph.users(value):
        if node is None:
            continue
        p, gi, op = node.proto, node.gi, node.proto.op_type
        if not p.output or (p.input[0] != value.name and op not in _BINARY):
            continue  # only a binary op's operands are interchangeable
        result = graph.value(gi, p.output[0])
        weight = graph.dims(graph.value(gi, p.input[1])) if len(p.input) > 1 and p.input[1] else None
        if op == "MatMul" and weight is not None and len(weight) == 2:  # x [..., K] @ w [K, N]: same rank out
            rank = graph.shape_info(result).rank
            if rank is not None:
                return [None] * (rank - 1) + [weight[0]] if rank >= 2 else [weight[0]]
        if op == "Gemm" and weight is not None and len(weight) == 2:
            k = weight[1] if int(attr(p, "transB", 0)) else weight[0]
            return [k, None] if int(attr(p, "transA", 0)) else [None, k]
        if op in ("Conv", "ConvTranspose") and weight is not None and len(weight) >= 3:
            c = weight[1] * int(attr(p, "group", 1)) if op == "Conv" else weight[0]
            return [None, c] + [None] * (len(weight) - 2)
        if op in _SAME_SHAPE and (shape := graph.shape_info(result).shape) is not None:
            return list(shape)
        if op in _BINARY and len(p.input) == 2 and (rank := graph.shape_info(result).rank) is not None:
            other = p.input[1] if p.input[0] == value.name else p.input[0]
            other_rank = graph.shape_info(graph.value(gi, other)).rank
            if other_rank is not None and other_rank < rank:
                return [None] * rank
    return None


def merge_dims(known: list | None, implied: list | None) -> list | None:
    """``known`` dims completed by ``implied`` ones: a number wins over a symbol or None."""
    if known is None:
        return implied
    if implied is None or len(implied) != len(known):
        return known
    return [k if isinstance(k, int) or not isinstance(i, int) else i for k, i in zip(known, implied, strict=True)]


def producer_rank(graph: Any, node: Any) -> int | None:
    """The rank of ``node``'s first output as its op type implies it, or None."""
    p = node.proto

    def rank(i: int) -> int | None:
        return graph.shape_info(graph.value(node.gi, p.input[i])).rank if len(p.input) > i and p.input[i] else None

    op = p.op_type
    if op in ("Conv", "ConvTranspose"):
        return rank(1)
    if op == "Gemm" or op == "Flatten":
        return 2
    if op == "MatMul":
        ranks = [rank(0), rank(1)]
        return None if None in ranks or min(ranks) < 2 else max(ranks)
    if op in _SAME_RANK:
        ranks = [rank(i) for i in range(len(p.input) if op in ("Mul", "Div", "Add", "Sub") else 1)]
        return None if None in ranks else max(ranks)
    if op in ("Unsqueeze", "Squeeze"):
        axes = axes_of(graph, Hop(node, None, None, op))
        if not isinstance(axes, list) or rank(0) is None:
            return None
        return rank(0) + len(axes) if op == "Unsqueeze" else rank(0) - len(axes)
    if op == "Reshape" and len(p.input) > 1:
        target = graph.const(graph.value(node.gi, p.input[1]))
        return None if target is None else int(np.asarray(target.value).size)
    return None


#: Hops that pick or average along axes other than the channel's (issue 21): a per-channel affine
#: commutes with a Gather of one index, a Slice and a ReduceMean there.
NON_CHANNEL_HOPS = ("Gather", "Slice", "ReduceMean")


def _const_ints(graph: Any, hop: Hop, slot: int) -> list[int] | None | str:
    p = hop.node.proto
    if len(p.input) <= slot or not p.input[slot]:
        return None
    c = graph.const(graph.value(hop.node.gi, p.input[slot]))
    if c is None:
        return f"{graph.describe_node(hop.node)} has an input {slot} that is not a constant"
    return [int(v) for v in np.asarray(c.value).reshape(-1)]


def _non_channel(graph: Any, hop: Hop, a: int, forward: bool, what: str) -> int | str:
    """The channel axis through a Gather of one index, a Slice or a ReduceMean along other axes."""
    p = hop.node.proto
    rank = graph.shape_info(hop.input).rank
    if rank is None:
        return f"the rank before {what} is unknown, so the channel axis cannot be followed"
    if p.op_type == "Gather":
        index = graph.const(graph.value(hop.node.gi, p.input[1])) if len(p.input) > 1 else None
        if index is None or np.asarray(index.value).ndim != 0:
            return f"{what} does not pick one constant index"
        removed, keep = {int(attr(p, "axis", 0)) % rank}, False
    elif p.op_type == "Slice":
        axes = _const_ints(graph, hop, 3)
        starts = _const_ints(graph, hop, 1)
        if isinstance(axes, str) or isinstance(starts, str) or (axes is None and starts is None):
            return axes if isinstance(axes, str) else f"{what} has starts that are not a constant"
        removed, keep = {x % rank for x in (axes if axes is not None else range(len(starts)))}, True
    else:
        axes = attr(p, "axes")
        axes = [int(x) for x in axes] if axes is not None else _const_ints(graph, hop, 1)
        if isinstance(axes, str) or not axes:
            return axes if isinstance(axes, str) else f"{what} averages every axis"
        removed, keep = {x % rank for x in axes}, bool(int(attr(p, "keepdims", 1)))
    kept = list(range(rank)) if keep else [i for i in range(rank) if i not in removed]
    source = a if forward else (kept[a] if a < len(kept) else None)
    if source is None or source in removed:
        return f"{what} picks, slices or averages along the channel axis"
    return kept.index(source) if forward else source
