"""Normalizations whose affine is spelled out after them: a plain normalization (the adapter's
``plain_norm``: no affine of its own), then ``* weight + bias`` as elementwise ops by constants.

The dynamo ONNX exporter writes every GroupNorm so: a Reshape to the groups, an InstanceNormalization
with scale 1 and bias 0, a Reshape back, then a Mul and an Add; a torch program may compute
``F.group_norm(x, g) * w + b`` itself.  The rules fold those ops as any affine chain; this module says
whose affine they are, so that the report names the normalization and its kind as the other spellings
do: the fold entry (``edit.fold_entries``), the skipped entry when the affine stays (``driver``), and
a normalization left alone by ``only`` / ``exclude`` keeps its affine (``driver._Hiding``).

The affine of a plain normalization: the elementwise ops by constants that follow its output, through
shape-only hops, each value on the way read by the next op alone.
"""

from __future__ import annotations

from typing import Any

from .graph import GraphAdapter, Norm

#: The longest walk between a plain normalization and the last op of its affine.
MAX_WALK = 16


def _data(graph: GraphAdapter, node: Any) -> Any:
    """The one operand of the elementwise op ``node`` that is no constant, or None (not such an op)."""
    op = graph.binary(node)
    if op is None:
        return None
    data = [v for v in (op.a, op.b) if not graph.is_constant(v)]
    return data[0] if len(data) == 1 else None


def owner(graph: GraphAdapter, node: Any) -> Norm | None:
    """The plain normalization whose affine the elementwise op ``node`` is part of, or None."""
    x, reader = _data(graph, node), node
    for _ in range(MAX_WALK):
        if x is None or graph.users(x) != [reader]:
            return None
        producer = graph.producer(x)
        if producer is None:
            return None
        plain = graph.plain_norm(producer)
        if plain is not None:
            return plain if plain.output == x else None
        hop = graph.hop(producer)
        if hop is not None and hop.output == x:
            x = hop.input
        else:
            x = _data(graph, producer)
        reader = producer
    return None


def affine_ops(graph: GraphAdapter, plain: Norm) -> list:
    """The elementwise ops that apply ``plain``'s affine, first first (empty: it has none)."""
    x, ops = plain.output, []
    for _ in range(MAX_WALK):
        users = graph.users(x)
        if len(users) != 1 or users[0] is None:
            break
        node = users[0]
        hop = graph.hop(node)
        if hop is not None and hop.input == x:
            x = hop.output
        elif _data(graph, node) == x:
            ops.append(node)
            x = graph.binary(node).output
        else:
            break
    return ops


def with_affine(plain: Norm, graph: GraphAdapter, ops: list) -> Norm:
    """``plain`` as the normalization with its spelled-out affine ``ops``, for the report: its output is
    theirs, its input the value before the hops that lead to it (the exporter's Reshape to the groups)."""
    x = plain.input
    for _ in range(MAX_WALK):
        hop = graph.hop(graph.producer(x))
        if hop is None or hop.output != x:
            break
        x = hop.input
    return Norm(
        plain.node,
        x,
        graph.binary(ops[-1]).output,
        None,
        None,
        None,
        None,
        plain.eps,
        axis=plain.axis,
        op=plain.op,
        affine_only=True,
        kind=plain.kind,
    )
