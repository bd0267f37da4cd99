"""The fan-out rule: an affine chain whose result feeds several layers folds into every one of them.

``W·(s⊙x + t) + b = (W·diag(s))·x + (W·t + b)`` holds for each consumer on
its own, so a BatchNorm, a per-channel mul/add chain or the elementwise affine
of a LayerNorm / RMSNorm / GroupNorm that feeds the q, k and v projections (or
Inception-style branches) folds into all of them at once, or into none: if
one consumer cannot take it, nothing changes and the report names that
consumer and why.  The retry policy is the input side's: drop the step
farthest from the layers and try the shorter chain.
"""

from __future__ import annotations

from typing import Any

from ..report import Code
from .axes import channel_axis
from .chain import Stop, chain_up, same_value
from .edit import fold_chain, note
from .graph import GraphAdapter, Layer, Outcome
from .rule import Rule
from .rules import check_layer, input_check, input_params


def _branch(graph: GraphAdapter, layer: Layer) -> tuple[Any, int | None]:
    """From ``layer`` up through hops (no maximum) that have no other user: the value reached and
    the channel axis there (None: a hop lost it)."""
    x = layer.input
    rank = graph.shape_info(x).rank
    axis = channel_axis(layer.in_axis, rank)
    while len(graph.users(x)) == 1 and (hop := graph.hop(graph.producer(x))) is not None and not hop.monotone:
        found = graph.follow_axis(hop, axis, False) if axis is not None else None
        axis = None if isinstance(found, str) else found
        x = hop.input
    return x, axis


def _layer_below(graph: GraphAdapter, user: Any) -> Layer | None:
    """The layer that ``user`` is, or that it reaches through hops (no maximum) with no other user."""
    node = user
    for _ in range(64):
        if node is None:
            return None
        layer = graph.layer(node)
        if layer is not None:
            return layer
        hop = graph.hop(node)
        users = graph.users(hop.output) if hop is not None else []
        if hop is None or hop.monotone or len(users) != 1:  # a max-pool is crossed only by a checked chain
            return None
        node = users[0]
    return None


def _affine(graph: GraphAdapter, node: Any) -> bool:
    """Whether ``node`` can start a chain: a normalization, or an elementwise op with one constant
    operand (a residual add of two computed values is no affine op, and is never reported)."""
    if node is None:
        return False
    if graph.norm(node) is not None:
        return True
    op = graph.binary(node)
    return op is not None and sum(not graph.is_constant(v) for v in (op.a, op.b)) == 1


def fold_fanout(graph: GraphAdapter, layer: Layer, only) -> Outcome:
    """Fold the chain whose result feeds ``layer`` and its sibling consumers into all of them.

    The shared value may reach each layer through its own shape-only hops (a
    view before each ``addmm``).  Runs from the first consumer only, so each
    value is tried once.
    """
    out = Outcome()
    x, axis = _branch(graph, layer)
    users = graph.users(x)
    producer = graph.producer(x)
    if len(users) < 2 or not _affine(graph, producer):
        return out
    layers: list[Layer] = []
    for user in users:
        other = _layer_below(graph, user)
        if other is None or not same_value(_branch(graph, other)[0], x) or _branch(graph, other)[1] != axis:
            what = "a graph output" if user is None else graph.describe_node(user)
            note(
                graph,
                out,
                producer,
                f"its output {graph.describe(x)} also feeds {what}, which is not a conv "
                "or linear reading it as its input, so it cannot fold into every user",
                Code.FANOUT_NOT_ALL_LAYERS,
            )
            return out
        layers.append(other)
    if layers[0].node != layer.node:
        return out  # tried from the first consumer
    try:
        checked = [check_layer(graph, lay, only, "input", values=False) for lay in layers]
    except Stop as stop:
        note(graph, out, producer, f"it feeds {len(layers)} layers and one cannot take it: {stop.reason}", stop.code)
        return out
    channels = {c for _, c in checked}
    if len(channels) != 1 or axis is None:
        note(
            graph,
            out,
            producer,
            f"it feeds {len(layers)} layers that read it with different channels ({sorted(channels)})",
            Code.FANOUT_CHANNELS,
        )
        return out
    steps, stop = chain_up(graph, x, axis, channels.pop(), fanout=True)
    if stop is not None:
        note(graph, out, stop.node, stop.reason, stop.code)
    targets = [(lay, w) for lay, (w, _) in zip(layers, checked)]  # read by fold_chain once a try gets that far

    def why(failed: Layer, err) -> str:
        return (
            f"it feeds {len(layers)} layers and cannot fold into {failed.op} {graph.describe_node(failed.node)}: {err}"
        )

    fold_chain(graph, targets, steps, FANOUT.name, input_params, out, why, input_check)
    return out


FANOUT = Rule(
    "fanout", "an affine chain whose result feeds several layers: into each one's input channels", fold_fanout
)
