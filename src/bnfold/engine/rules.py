"""The fold rules, pattern -> check -> rewrite, written once for every graph kind.

* ``fold_output``: a layer, then an affine chain (batch norms, elementwise ops
  with per-channel constants, shape-only hops), folded into the layer's output
  channels.
* ``fold_input``: an affine chain whose last value feeds only the layer,
  folded into its input channels.
* ``fold_fanout`` (``fanout.py``): a chain whose result feeds several layers,
  folded into all of them.

The retry-and-write loop every rule shares is ``edit.fold_chain``.  All
arithmetic is in ``bnfold.fold_math``.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import fold_math
from ..fold_math import Affine, FoldError
from ..report import Code
from .chain import Stop, chain_after, chain_before
from .edit import compose, fold_chain, note, trim_hops
from .graph import ChainStep, GraphAdapter, Layer, LayerWeights, Outcome
from .rule import Rule

__all__ = [
    "INPUT",
    "OUTPUT",
    "check_layer",
    "compose",
    "fold_input",
    "fold_output",
    "input_params",
    "input_check",
    "output_params",
]


def check_layer(graph: GraphAdapter, layer: Layer, only, side: str, values: bool = True) -> tuple[LayerWeights, int]:
    """The layer's constants and its channel count on ``side`` (``"output"`` / ``"input"``), or Stop
    with the reason (and code) nothing folds into it.  A fold-math refusal of the weight's shape
    (``groups`` that do not divide it) is a Stop too, never an exception.  ``values=False``: the weight may
    be its shape only (``GraphAdapter.weights``); ``edit.fold_chain`` reads it once a try of the chain gets to the
    arithmetic."""
    if only is not None and layer.kind not in only:
        raise Stop(
            layer.node,
            f"folding into {layer.kind} layers was not requested (only={','.join(sorted(only))})",
            Code.NOT_REQUESTED,
        )
    weights = graph.weights(layer, values)
    if isinstance(weights, str):
        raise Stop(
            layer.node, f"cannot fold into {layer.op} {graph.describe_node(layer.node)}: {weights}", Code.LAYER_WEIGHTS
        )
    if weights.weight.dim() < 2:
        raise Stop(layer.node, f"the {layer.op} weight has rank {weights.weight.dim()}", Code.LAYER_SHAPE)
    count = fold_math.out_channels if side == "output" else fold_math.in_channels
    try:
        channels = count(layer.kind, tuple(weights.weight.shape), layer.groups)
    except FoldError as err:
        raise Stop(
            layer.node, f"cannot fold into {layer.op} {graph.describe_node(layer.node)}: {err}", err.code
        ) from None
    return weights, channels


def _finish(layer: Layer, w: LayerWeights, new_w: torch.Tensor, new_b: torch.Tensor):
    """The folded weight (already in its dtype) and the bias cast back, or None when none is needed."""
    if w.bias is None and w.pre is None and not bool(new_b.any()):  # NaN is nonzero, -0.0 zero
        new_b = None  # a layer without a bias keeps none when the fold adds nothing
    if new_b is not None:
        try:
            new_b = fold_math.cast_checked(new_b, w.bias_dtype, f"{layer.op} bias")
        except FoldError:
            fold_math.discard(new_w)  # the weight's product is never written: its spilled bytes go back
            raise
    return new_w, new_b


def output_params(layer: Layer, w: LayerWeights, total: Affine):
    """The layer's weight and bias with ``total`` applied after it."""
    if w.pre is not None:
        total = w.pre.then(total)
    new_w, new_b = fold_math.fold_output_affine(
        w.weight, w.bias, total, layer.kind, layer.groups, w.weight_dtype, w.deferred
    )
    return _finish(layer, w, new_w, new_b)


def input_check(layer: Layer, w: LayerWeights, total: Affine) -> None:
    """The refusals of :func:`input_params` that ``w``'s shape and the layer's padding decide (a shift into a
    padded or transposed conv, a channel count): FoldError before the weight is read."""
    fold_math.check_input_affine(total, layer.kind, tuple(w.weight.shape), layer.groups, layer.zero_padding)


def input_params(layer: Layer, w: LayerWeights, total: Affine):
    """The layer's weight and bias with ``total`` applied to its input."""
    if w.pre is None:
        new_w, new_b = fold_math.fold_input_affine(
            w.weight,
            w.bias,
            total,
            layer.kind,
            layer.groups,
            shift_exact=layer.zero_padding,
            dtype=w.weight_dtype,
            deferred=w.deferred,
        )
    else:  # the layer's own affine after the product: fold both in float64, round once
        new_w, new_b = fold_math.fold_input_affine(
            w.weight, w.bias, total, layer.kind, layer.groups, shift_exact=layer.zero_padding
        )
        new_w, new_b = fold_math.fold_output_affine(new_w, new_b, w.pre, layer.kind, layer.groups)
        new_w = fold_math.cast_checked(new_w, w.weight_dtype, f"{layer.op} weight")
    return _finish(layer, w, new_w, new_b)


def _only_a_bias(layer: Layer, steps: list[ChainStep]) -> bool:
    """A lone shift after a layer that cannot hold a bias: folding it would only move the add."""
    affines = [s.affine for s in steps if s.affine is not None]
    return not layer.takes_bias and len(affines) == 1 and bool((affines[0].scale == 1).all())


def is_step(graph: GraphAdapter, node: Any) -> bool:
    """Whether ``node`` could be a step of a chain (a normalization, an elementwise op or a hop)."""
    return node is not None and (
        graph.norm(node) is not None or graph.binary(node) is not None or graph.hop(node) is not None
    )


def _why(graph: GraphAdapter):
    return lambda layer, err: f"cannot fold into {layer.op} {graph.describe_node(layer.node)}: {err}"


def fold_output(graph: GraphAdapter, layer: Layer, only) -> Outcome:
    """Fold the affine chain after ``layer`` into it."""
    out = Outcome()
    if not any(is_step(graph, user) for user in graph.users(layer.output)):
        return out  # nothing that could be a chain: no need to read the layer
    try:
        w, channels = check_layer(graph, layer, only, "output", values=False)
    except Stop as stop:
        for user in graph.users(layer.output):
            norm = graph.norm(user) if user is not None else None
            if user is not None and not (norm is not None and norm.affine_only):
                note(graph, out, user, stop.reason, stop.code)
        return out
    steps, stop = chain_after(graph, layer, channels)
    if stop is not None:
        note(graph, out, stop.node, stop.reason, stop.code)
    if not layer.takes_bias:  # its bias goes where the chain ends: the axis must be known
        cut = next((i for i, s in enumerate(steps) if s.axis is None), len(steps))
        del steps[cut:]
    trim_hops(steps, -1)
    if _only_a_bias(layer, steps):
        return out
    fold_chain(graph, [(layer, w)], steps, OUTPUT.name, output_params, out, _why(graph))
    return out


def fold_input(graph: GraphAdapter, layer: Layer, only) -> Outcome:
    """Fold the affine chain that feeds ``layer`` into it."""
    out = Outcome()
    if not is_step(graph, graph.producer(layer.input)):
        return out
    try:
        w, channels = check_layer(graph, layer, only, "input", values=False)
    except Stop as stop:
        producer = graph.producer(layer.input)
        if producer is not None and len(graph.users(layer.input)) == 1:
            note(graph, out, producer, stop.reason, stop.code)
        return out
    steps, stop = chain_before(graph, layer, channels)
    if stop is not None:
        note(graph, out, stop.node, stop.reason, stop.code)
    trim_hops(steps, 0)
    if _only_a_bias(layer, steps):
        return out
    fold_chain(graph, [(layer, w)], steps, INPUT.name, input_params, out, _why(graph), input_check)
    return out


OUTPUT = Rule("output", "a layer, then an affine chain: into the layer's output channels", fold_output)
INPUT = Rule("input", "an affine chain that feeds only the layer: into its input channels", fold_input)
