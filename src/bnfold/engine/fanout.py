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

from .. import fold_math
from ..fold_math import FoldError
from .chain import Stop, _same, chain_up
from .graph import GraphAdapter, Layer, Outcome
from .rules import _entries, _input_params, _is_step, _label, _note, _trim_hops, check_layer, compose


def _branch(graph: GraphAdapter, layer: Layer) -> tuple[Any, int | None]:
    """From ``layer`` up through shape-only hops that have no other user: the value reached and
    the channel axis there (None: a hop lost it)."""
    x = layer.input
    rank = graph.shape_info(x).rank
    axis = layer.in_axis % rank if rank else layer.in_axis
    while len(graph.users(x)) == 1 and (hop := graph.hop(graph.producer(x))) is not None:
        found = graph.follow_axis(hop, axis, False) if axis is not None else None
        axis = None if isinstance(found, str) else found
        x = hop.input
    return x, axis


def _layer_below(graph: GraphAdapter, user: Any) -> Layer | None:
    """The layer that ``user`` is, or that it reaches through shape-only hops with no other user."""
    node = user
    for _ in range(64):
        if node is None:
            return None
        layer = graph.layer(node)
        if layer is not None:
            return layer
        hop = graph.hop(node)
        users = graph.users(hop.output) if hop is not None else []
        if hop is None or len(users) != 1:
            return None
        node = users[0]
    return None


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
    if len(users) < 2 or not _is_step(graph, producer) or graph.hop(producer) is not None:
        return out
    layers: list[Layer] = []
    for user in users:
        other = _layer_below(graph, user)
        if other is None or not _same(_branch(graph, other)[0], x) or _branch(graph, other)[1] != axis:
            what = "a graph output" if user is None else graph.describe_node(user)
            _note(
                graph,
                out,
                producer,
                f"its output {graph.describe(x)} also feeds {what}, which is not a conv "
                "or linear reading it as its input, so it cannot fold into every user",
            )
            return out
        layers.append(other)
    if layers[0].node != layer.node:
        return out  # tried from the first consumer
    try:
        weights = [check_layer(graph, lay, only) for lay in layers]
    except Stop as stop:
        _note(graph, out, producer, f"it feeds {len(layers)} layers and one cannot take it: {stop.reason}")
        return out
    channels = {fold_math.in_channels(lay.kind, tuple(w.weight.shape), lay.groups) for lay, w in zip(layers, weights)}
    if len(channels) != 1 or axis is None:
        _note(
            graph,
            out,
            producer,
            f"it feeds {len(layers)} layers that read it with different channels ({sorted(channels)})",
        )
        return out
    steps, stop = chain_up(graph, x, axis, channels.pop(), fanout=True)
    if stop is not None:
        _note(graph, out, stop.node, stop.reason)
    _trim_hops(steps, 0)
    while steps:
        total = compose(steps)
        try:
            params = [_input_params(lay, w, total) for lay, w in zip(layers, weights)]
        except FoldError as err:
            failed = next(lay for lay, w in zip(layers, weights) if _fails(lay, w, total))
            dropped = steps.pop(0)
            _note(
                graph,
                out,
                dropped.node,
                f"it feeds {len(layers)} layers and cannot fold into "
                f"{failed.op} {graph.describe_node(failed.node)}: {err}",
            )
            _trim_hops(steps, 0)
            continue
        label = _label(graph, steps)
        entries = _entries(graph, layer, steps, "input", 0)  # named while the chain is still in the graph
        for entry in entries:
            entry.into = ", ".join(graph.op_label(lay.node) for lay in layers)
            entry.into_node = ", ".join(graph.node_name(lay.node) for lay in layers)
        graph.remove_steps(steps)  # first: parameters shared only with the chain are then not shared
        for lay, (new_w, new_b) in zip(layers, params):
            added, pending = graph.write_layer(lay, new_w, new_b, label)
            entries[0].extra_bytes += added
            if pending is not None:
                rank = graph.shape_info(lay.output).rank
                graph.add_bias(lay, lay.output, pending, lay.out_axis % rank if rank else lay.out_axis, rank)
        out.folded.extend(entries)
        return out
    return out


def _fails(layer: Layer, weights, total) -> bool:
    try:
        _input_params(layer, weights, total)
    except FoldError:
        return True
    return False
