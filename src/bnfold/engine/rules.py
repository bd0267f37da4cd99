"""The two fold rules, pattern -> check -> rewrite, written once for every graph kind.

* ``fold_output``: a layer, then an affine chain (batch norms, elementwise ops
  with per-channel constants, shape-only hops), folded into the layer's output
  channels.
* ``fold_input``: an affine chain whose last value feeds only the layer,
  folded into its input channels.

When the composed affine does not fold (a cast overflows, a shift meets
padding), the step farthest from the layer is dropped and the shorter chain is
tried: that is the whole retry policy.  All arithmetic is in ``bnfold.fold_math``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import fold_math
from ..fold_math import Affine, FoldError
from ..report import Folded
from .chain import Stop, chain_after, chain_before
from .graph import GraphAdapter, Layer, LayerWeights, Outcome, Step


def compose(steps: list[Step]) -> Affine:
    """The one affine a chain applies, first step first."""
    affines = [s.affine for s in steps if s.affine is not None]
    total = affines[0]
    for a in affines[1:]:
        total = total.then(a)
    return total


def check_layer(graph: GraphAdapter, layer: Layer, only) -> LayerWeights:
    """The layer's constants, or Stop with the reason nothing folds into it."""
    if only is not None and layer.kind not in only:
        raise Stop(layer.node, f"folding into {layer.kind} layers was not requested (only={','.join(sorted(only))})")
    weights = graph.weights(layer)
    if isinstance(weights, str):
        raise Stop(layer.node, f"cannot fold into {layer.op} {graph.describe_node(layer.node)}: {weights}")
    if weights.weight.dim() < 2:
        raise Stop(layer.node, f"the {layer.op} weight has rank {weights.weight.dim()}")
    return weights


def _trim_hops(steps: list[Step], end: int) -> None:
    """Drop hops at the far end of the chain (index ``end``: -1 or 0): they stay as they are."""
    while steps and steps[end].affine is None:
        steps.pop(end)


def _finish(layer: Layer, w: LayerWeights, new_w: torch.Tensor, new_b: torch.Tensor):
    """The folded weight (already in its dtype) and the bias cast back, or None when none is needed."""
    if w.bias is None and w.pre is None and not bool((new_b != 0).any()):
        new_b = None  # a layer without a bias keeps none when the fold adds nothing
    if new_b is not None:
        new_b = fold_math.cast_checked(new_b, w.bias_dtype, f"{layer.op} bias")
    return new_w, new_b


def _output_params(layer: Layer, w: LayerWeights, total: Affine):
    if w.pre is not None:
        total = w.pre.then(total)
    new_w, new_b = fold_math.fold_output_affine(w.weight, w.bias, total, layer.kind, layer.groups, w.weight_dtype)
    return _finish(layer, w, new_w, new_b)


def _input_params(layer: Layer, w: LayerWeights, total: Affine):
    if w.pre is None:
        new_w, new_b = fold_math.fold_input_affine(
            w.weight, w.bias, total, layer.kind, layer.groups, shift_exact=layer.zero_padding, dtype=w.weight_dtype
        )
    else:  # the layer's own affine after the product: fold both in float64, round once
        new_w, new_b = fold_math.fold_input_affine(
            w.weight, w.bias, total, layer.kind, layer.groups, shift_exact=layer.zero_padding
        )
        new_w, new_b = fold_math.fold_output_affine(new_w, new_b, w.pre, layer.kind, layer.groups)
        new_w = fold_math.cast_checked(new_w, w.weight_dtype, f"{layer.op} weight")
    return _finish(layer, w, new_w, new_b)


def _note(graph: GraphAdapter, out: Outcome, node: Any, reason: str) -> None:
    """Keep ``reason`` for ``node`` if it is a normalization or an elementwise op (they stay, reported)."""
    if graph.norm(node) is not None or graph.binary(node) is not None:
        out.reasons.setdefault(node, reason)


def _only_a_bias(layer: Layer, steps: list[Step]) -> bool:
    """A lone shift after a layer that cannot hold a bias: folding it would only move the add."""
    affines = [s.affine for s in steps if s.affine is not None]
    return not layer.takes_bias and len(affines) == 1 and bool((affines[0].scale == 1).all())


def _fold(graph: GraphAdapter, layer: Layer, steps: list[Step], side: str, params: Callable, out: Outcome) -> None:
    far = -1 if side == "output" else 0  # the end of the chain farthest from the layer
    if not layer.takes_bias and side == "output":  # its bias goes where the chain ends: the axis must be known
        cut = next((i for i, s in enumerate(steps) if s.axis is None), len(steps))
        del steps[cut:]
    _trim_hops(steps, far)
    if _only_a_bias(layer, steps):
        return
    while steps:
        try:
            new_w, new_b = params(compose(steps))
        except FoldError as err:
            dropped = steps.pop(far)
            _note(graph, out, dropped.node, f"cannot fold into {layer.op} {graph.describe_node(layer.node)}: {err}")
            _trim_hops(steps, far)
            continue
        label = _label(graph, steps)
        entries = _entries(graph, layer, steps, side, 0)  # named while the chain is still in the graph
        # the chain goes first: a parameter the layer shared only with removed nodes is then no longer shared
        end = graph.remove_steps(steps)
        extra, pending = graph.write_layer(layer, new_w, new_b, label)
        entries[0].extra_bytes = extra
        out.folded.extend(entries)
        if pending is not None:  # the layer holds no bias: add it where the chain ended
            if side == "output":
                axis, rank = steps[-1].axis, steps[-1].rank
            else:
                end, rank = layer.output, graph.shape_info(layer.output).rank
                axis = layer.out_axis if rank is None or layer.out_axis >= 0 else rank + layer.out_axis
            graph.add_bias(layer, end, pending, axis, rank)
        return


def _is_step(graph: GraphAdapter, node: Any) -> bool:
    return node is not None and (
        graph.norm(node) is not None or graph.binary(node) is not None or graph.hop(node) is not None
    )


def fold_output(graph: GraphAdapter, layer: Layer, only) -> Outcome:
    """Fold the affine chain after ``layer`` into it."""
    out = Outcome()
    if not any(_is_step(graph, user) for user in graph.users(layer.output)):
        return out  # nothing that could be a chain: no need to read the layer
    try:
        w = check_layer(graph, layer, only)
    except Stop as stop:
        for user in graph.users(layer.output):
            norm = graph.norm(user) if user is not None else None
            if user is not None and not (norm is not None and norm.affine_only):
                _note(graph, out, user, stop.reason)
        return out
    channels = fold_math.out_channels(layer.kind, tuple(w.weight.shape), layer.groups)
    steps, stop = chain_after(graph, layer, channels)
    if stop is not None:
        _note(graph, out, stop.node, stop.reason)
    _fold(graph, layer, steps, "output", lambda total: _output_params(layer, w, total), out)
    return out


def fold_input(graph: GraphAdapter, layer: Layer, only) -> Outcome:
    """Fold the affine chain that feeds ``layer`` into it."""
    out = Outcome()
    if not _is_step(graph, graph.producer(layer.input)):
        return out
    try:
        w = check_layer(graph, layer, only)
    except Stop as stop:
        producer = graph.producer(layer.input)
        if producer is not None and len(graph.users(layer.input)) == 1:
            _note(graph, out, producer, stop.reason)
        return out
    channels = fold_math.in_channels(layer.kind, tuple(w.weight.shape), layer.groups)
    steps, stop = chain_before(graph, layer, channels)
    if stop is not None:
        _note(graph, out, stop.node, stop.reason)
    _fold(graph, layer, steps, "input", lambda total: _input_params(layer, w, total), out)
    return out


# ------------------------------------------------------------------ report entries


def _label(graph: GraphAdapter, steps: list[Step]) -> str:
    """A short name for the fold, used to name private copies of shared tensors."""
    first = next(s for s in steps if s.affine is not None)
    name = graph.norm_label(first.norm) if first.norm is not None else graph.op_label(first.node)
    return name.replace(".", "_").replace("/", "_")


def _entries(graph: GraphAdapter, layer: Layer, steps: list[Step], side: str, extra: int) -> list[Folded]:
    ops = [s.op for s in steps]
    pattern = "+".join([layer.op] + ops if side == "output" else ops + [layer.op])
    into, into_node = graph.op_label(layer.node), graph.node_name(layer.node)  # the name people know, the node
    norms = [s for s in steps if s.norm is not None]
    if norms:
        entries = [
            Folded(graph.norm_label(s.norm), into, pattern, side, 0, graph.node_name(s.node), into_node) for s in norms
        ]
    else:
        affine = [s for s in steps if s.affine is not None]
        names = "+".join(graph.node_name(s.node) for s in affine)
        path = graph.op_label(affine[0].node)
        label = f"{path} ({names})" if path != graph.node_name(affine[0].node) else f"affine {names}"
        entries = [Folded(label, into, pattern, side, 0, graph.node_name(affine[0].node), into_node)]
    entries[0].extra_bytes = extra
    return entries
