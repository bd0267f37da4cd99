"""Where the channel axis goes through a hop (Identity, Dropout, Unsqueeze, Squeeze,
Transpose, Reshape, Flatten; Gather / Slice / ReduceMean / ReduceMax / pools along other
axes), forward or backward, and
what the producer and the readers of a value imply about a shape that ONNX
shape inference left unknown (a Reshape to a computed shape, dynamic dims).
"""

from __future__ import annotations

from collections.abc import Callable
from math import prod
from typing import Any

import numpy as np

from ..engine.axes import channel_axis, same_place
from ..engine.graph import Hop
from .nodes import attr
from .ops import HOPS, op_of


def follow_axis(graph: Any, hop: Hop, axis: int, forward: bool) -> int | str:
    """The channel axis after ``hop`` (``forward``) or before it (the inverse map), or why it is lost."""
    rule = AXIS_RULES[HOPS[hop.node.proto.op_type]]
    if rule is None:  # the identity
        return axis
    what = graph.describe_node(hop.node)
    r_in, r_out = graph.shape_info(hop.input).rank, graph.shape_info(hop.output).rank
    rank = r_in if forward else r_out
    if rank is None:
        side = "before" if forward else "after"
        return f"the rank {side} {what} is unknown, so the channel axis cannot be followed"
    if rank == 0:
        return f"{what} reads or writes a scalar, which has no channel axis"
    return rule(graph, hop, channel_axis(axis, rank), rank, forward, what)


def _permute(graph: Any, hop: Hop, a: int, rank: int, forward: bool, what: str) -> int | str:
    perm = attr(hop.node.proto, "perm")
    perm = list(range(rank - 1, -1, -1)) if perm is None else [int(x) % rank for x in perm]
    if sorted(perm) != list(range(rank)):
        return f"{what} has a perm that does not match the rank {rank}"
    return perm.index(a) if forward else perm[a]


def _reshaped(shape_after: Callable) -> Callable:
    """The rule of a reshape whose output dims ``shape_after(graph, hop)`` computes: ``same_place``."""

    def follow(graph: Any, hop: Hop, a: int, rank: int, forward: bool, what: str) -> int | str:
        before, after = graph.shape_info(hop.input).shape, shape_after(graph, hop)
        if before is None or after is None:
            return (
                f"the shape {'before' if before is None else 'after'} {what} is unknown, so the channel axis "
                "cannot be followed"
            )
        found = same_place(before, after, a) if forward else same_place(after, before, a)
        if found is None:
            return (
                f"{what} does not keep the channel axis (shape {_fmt(before)} -> {_fmt(after)}, channels on "
                f"axis {a} {'before' if forward else 'after'} it)"
            )
        return found

    return follow


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
    unsqueeze = HOPS[hop.node.proto.op_type] == "unsqueeze"
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


def _flatten_dims(graph: Any, hop: Hop) -> list | None:
    """The output dims of a Flatten: inferred, or computed from static input dims."""
    before, after = graph.shape_info(hop.input).shape, graph.shape_info(hop.output).shape
    if after is None and before is not None and all(isinstance(d, int) for d in before):
        k = int(attr(hop.node.proto, "axis", 1)) % (len(before) or 1)
        return [prod(before[:k]), prod(before[k:])]
    return None if after is None else list(after)


def _reshape_dims(graph: Any, hop: Hop) -> list | None:
    """The output dims of a Reshape: inferred, completed from a constant target shape."""
    p = hop.node.proto
    before = graph.shape_info(hop.input).shape
    after = graph.shape_info(hop.output).shape
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


# --------------------------------------------------------------------------- along other axes (issue 21)


def _const_ints(graph: Any, hop: Hop, slot: int) -> list[int] | None | str:
    p = hop.node.proto
    if len(p.input) <= slot or not p.input[slot]:
        return None
    c = graph.const(graph.value(hop.node.gi, p.input[slot]))
    if c is None:
        return f"{graph.describe_node(hop.node)} has an input {slot} that is not a constant"
    return [int(v) for v in np.asarray(c.value).reshape(-1)]


def _along_other_axes(removed_axes: Callable) -> Callable:
    """The rule of a hop that picks, slices, averages or pools along axes other than the channel's
    (a per-channel affine commutes with it; with a maximum, only a non-negative scale does):
    ``removed_axes(graph, hop, what, rank)`` gives the axes it acts on (of its input, of rank
    ``rank``) and whether they stay in the result, or why not known."""

    def follow(graph: Any, hop: Hop, a: int, rank: int, forward: bool, what: str) -> int | str:
        r_in = graph.shape_info(hop.input).rank
        if r_in is None:
            return f"the rank before {what} is unknown, so the channel axis cannot be followed"
        found = removed_axes(graph, hop, what, r_in)
        if isinstance(found, str):
            return found
        removed, keep = found
        kept = list(range(r_in)) if keep else [i for i in range(r_in) if i not in removed]
        source = a if forward else (kept[a] if a < len(kept) else None)
        if source is None or source in removed:
            return f"{what} picks, slices or averages along the channel axis"
        return kept.index(source) if forward else source

    return follow


def _gathered(graph: Any, hop: Hop, what: str, rank: int) -> tuple[set, bool] | str:
    # one index (the axis goes) or a 1-D list of them (the axis stays, shorter); other ranks add axes
    p = hop.node.proto
    if len(p.input) < 2 or not p.input[1]:
        return f"{what} has no indices"
    indices = graph.value(hop.node.gi, p.input[1])
    index = graph.const(indices)
    index_rank = np.asarray(index.value).ndim if index is not None else graph.shape_info(indices).rank
    if index_rank not in (0, 1):
        return f"{what} does not pick one index or a 1-D list of them"
    return {int(attr(p, "axis", 0)) % rank}, index_rank == 1


def _flat_gather(graph: Any, hop: Hop) -> list | None:
    """The output dims of a Gather that reads a 1-D tensor in order (axis 0, constant indices 0 .. n-1 in any
    shape): a reshape, as the exporter writes torch's flat-order ``as_strided`` (a decomposed ``flatten``);
    else None."""
    p = hop.node.proto
    if len(p.input) < 2 or not p.input[1] or int(attr(p, "axis", 0)) != 0:
        return None
    index, before = graph.const(graph.value(hop.node.gi, p.input[1])), graph.shape_info(hop.input).shape
    if index is None or before is None or len(before) != 1:
        return None
    idx = np.asarray(index.value)
    if idx.size != before[0] or not np.array_equal(idx.reshape(-1), np.arange(idx.size)):
        return None
    return list(idx.shape)


def _gather_rule(graph: Any, hop: Hop) -> Callable:
    """A Gather's axis rule: a reshape's when it reads a 1-D tensor in order (:func:`_flat_gather`), else the
    rule of a pick along other axes."""
    return _reshaped(_flat_gather) if _flat_gather(graph, hop) is not None else _along_other_axes(_gathered)


def _sliced(graph: Any, hop: Hop, what: str, rank: int) -> tuple[set, bool] | str:
    axes, starts = _const_ints(graph, hop, 3), _const_ints(graph, hop, 1)
    if isinstance(axes, str) or isinstance(starts, str) or (axes is None and starts is None):
        return axes if isinstance(axes, str) else f"{what} has starts that are not a constant"
    return {x % rank for x in (axes if axes is not None else range(len(starts)))}, True


def _reduced(graph: Any, hop: Hop, what: str, rank: int) -> tuple[set, bool] | str:
    # ReduceMean / ReduceMax: axes an attribute (before opset 18) or input 1; none: every axis
    p = hop.node.proto
    axes = attr(p, "axes")
    axes = [int(x) for x in axes] if axes is not None else _const_ints(graph, hop, 1)
    if isinstance(axes, str) or not axes:
        return axes if isinstance(axes, str) else f"{what} reduces every axis"
    return {x % rank for x in axes}, bool(int(attr(p, "keepdims", 1)))


def _spatial(graph: Any, hop: Hop, what: str, rank: int) -> tuple[set, bool] | str:
    # MaxPool, GlobalAveragePool, GlobalMaxPool: over the axes after N and C, which stay
    return set(range(2, rank)), True


#: How the channel axis passes each kind of hop (the ``kind`` of its row in ``ops.OPS``):
#: ``rule(graph, hop, axis, rank, forward, what) -> axis | why not``; None: the identity.
AXIS_RULES: dict[str, Callable | None] = {
    "identity": None,
    "permute": _permute,
    "squeeze": _squeeze,
    "unsqueeze": _squeeze,
    "reshape": _reshaped(_reshape_dims),
    "flatten": _reshaped(_flatten_dims),
    "gather": lambda graph, hop, *rest: _gather_rule(graph, hop)(graph, hop, *rest),
    "slice": _along_other_axes(_sliced),
    "reduce": _along_other_axes(_reduced),
    "spatial": _along_other_axes(_spatial),
}


def _fmt(dims) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


# --------------------------------------------------------------------------- what inference left unknown


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
        row = op_of(p)
        shape, binary = row.shape if row else "", row is not None and row.role == "binary"
        if not p.output or (p.input[0] != value.name and not binary):
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
        if shape == "same" and (dims := graph.shape_info(result).shape) is not None:
            return list(dims)
        if binary and len(p.input) == 2 and (rank := graph.shape_info(result).rank) is not None:
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

    op, row = p.op_type, op_of(p)
    if row is None:
        return None
    kind = row.kind if row.role == "hop" else ""
    if op in ("Conv", "ConvTranspose"):
        return rank(1)
    if op == "Gemm" or kind == "flatten":
        return 2
    if op == "MatMul":
        ranks = [rank(0), rank(1)]
        return None if None in ranks or min(ranks) < 2 else max(ranks)
    if row.shape in ("same", "broadcast", "permuted"):
        ranks = [rank(i) for i in range(len(p.input) if row.shape == "broadcast" else 1)]
        return None if None in ranks else max(ranks)
    if kind in ("unsqueeze", "squeeze"):
        axes = axes_of(graph, Hop(node, None, None, op))
        if not isinstance(axes, list) or rank(0) is None:
            return None
        return rank(0) + len(axes) if kind == "unsqueeze" else rank(0) - len(axes)
    if kind == "reshape" and len(p.input) > 1:
        target = graph.const(graph.value(node.gi, p.input[1]))
        return None if target is None else int(np.asarray(target.value).size)
    return None
