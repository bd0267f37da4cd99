"""The edits of a fold, written once: the retry-and-write loop, the chain-removal bookkeeping and the
broadcast shape of new per-channel tensors.  Adapters only make primitive edits (remove a node whose
users then read another value, strip a normalization's affine, drop a tensor nobody reads, write a
layer's tensors, add a bias after a value).

The retry policy: when the composed affine does not fold (a cast overflows, a shift meets padding,
a negative scale would cross a max-pool), the step farthest from the layer(s) is dropped (its reason
and code kept) and the shorter chain is tried; hops left at the far end stay where they are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import fold_math
from ..fold_math import Affine, FoldError
from ..report import Code, Folded, FoldStep
from . import spelled
from .axes import channel_axis
from .graph import ChainStep, GraphAdapter, Layer, LayerWeights, Outcome


def compose(steps: list[ChainStep]) -> Affine:
    """The one affine a chain applies, first step first."""
    affines = [s.affine for s in steps if s.affine is not None]
    total = affines[0]
    for a in affines[1:]:
        total = total.then(a)
    return total


def broadcast_shape(channels: int, axis: int | None, rank: int | None, full_rank: bool) -> list[int]:
    """The shape of a new per-channel tensor that broadcasts along ``axis`` of a rank-``rank`` tensor.

    ``full_rank``: ``[1, C, 1, 1]`` (nothing left for a backend to broadcast); otherwise the shortest
    trailing-aligned shape ``[C, 1, 1]``.  An unknown rank (or axis) gives ``[C]``: the channels are last.
    """
    if rank is None or axis is None:
        return [channels]
    axis = axis % rank
    trailing = [1] * (rank - 1 - axis)
    return ([1] * axis if full_rank else []) + [channels] + trailing


def note(graph: GraphAdapter, out: Outcome, node: Any, reason: str, code: Code) -> None:
    """Keep ``reason`` (and its ``code``) for ``node`` if it is a normalization or an elementwise op
    (they stay, reported); the first reason given for a node wins."""
    if node is not None and (graph.norm(node) is not None or graph.binary(node) is not None):
        out.reasons.setdefault(node, (reason, code))


def trim_hops(steps: list[ChainStep], end: int) -> None:
    """Drop hops at the far end of the chain (index ``end``: -1 or 0): they stay as they are."""
    while steps and steps[end].affine is None:
        steps.pop(end)


# ------------------------------------------------------------------ removing a chain


def _resolve(value: Any, replaced: dict) -> Any:
    while value in replaced:  # the value was the output of a step already removed
        value = replaced[value]
    return value


def remove_chain(graph: GraphAdapter, steps: list[ChainStep]) -> Any:
    """Take the affine steps of a chain out of the graph; returns the value that now stands where
    the chain ended.

    Each removed step's users read the value the step read (or, through steps already removed, the
    value the first of them read); a LayerNorm-like step stays and loses its weight and bias; the
    steps' parameter operands are dropped once nothing reads them.  Hops stay.
    """
    replaced: dict[Any, Any] = {}
    operands: list = []
    for step in steps:
        if step.affine is None:
            continue
        operands.extend(step.operands)
        if step.norm is not None and step.norm.affine_only:
            graph.strip_affine(step.norm)
            continue
        source = _resolve(step.input, replaced)
        if not graph.remove_node(step, source):
            replaced[step.output] = source
    graph.drop_unused(operands)
    return _resolve(steps[-1].output, replaced)


def step_entries(graph: GraphAdapter, steps: list[ChainStep]) -> list[FoldStep]:
    """The chain as report steps (named while it is still in the graph)."""
    out = []
    for s in steps:
        if s.affine is None:
            action = "kept"
        elif s.norm is not None and s.norm.affine_only:
            action = "affine_removed"
        else:
            action = "removed"
        out.append(FoldStep(graph.node_name(s.node), s.op, action))
    return out


# ------------------------------------------------------------------ the retry-and-write loop

#: ``params(layer, weights, total)``: the folded ``(weight, bias)`` of one layer, or FoldError.
Params = Callable[[Layer, LayerWeights, Affine], tuple]
#: ``check(layer, weights, total)``: FoldError for a refusal of ``params`` that the weight's shape decides.
Check = Callable[[Layer, LayerWeights, Affine], object]


def read_weights(graph: GraphAdapter, layer: Layer, w: LayerWeights) -> LayerWeights:
    """``w`` with the weight's values, read now where ``GraphAdapter.weights(layer, values=False)`` gave its
    shape only."""
    if not w.weight.is_meta:
        return w
    read = graph.weights(layer)
    if isinstance(read, str) or read.weight.shape != w.weight.shape:  # the same checks passed on its shape
        raise AssertionError(f"internal: {layer.op} weight read as {read!r}, checked as {tuple(w.weight.shape)}")
    return read


def fold_chain(
    graph: GraphAdapter,
    targets: list[tuple[Layer, LayerWeights]],
    steps: list[ChainStep],
    rule: str,
    params: Params,
    out: Outcome,
    why: Callable[[Layer, FoldError], str],
    check: Check | None = None,
) -> None:
    """Fold ``steps`` into every layer of ``targets`` (all or none), dropping the farthest step
    until the composed affine folds; write the result and record the entries in ``out``.

    ``rule`` is ``"output"`` (``steps`` follow the layer), ``"input"`` or ``"fanout"`` (they
    feed the layer(s)); ``why(layer, err)`` words the reason of a dropped step.  A target's weight may be
    its shape only: it is read (:func:`read_weights`, once) when a try has passed the max-pool crossings and
    every target's ``check``, so a weight whose chain the loop leaves whole is never read.
    """
    targets = list(targets)  # each weight replaced by its values once read
    side = "output" if rule == "output" else "input"
    far = -1 if side == "output" else 0  # the end of the chain farthest from the layer
    trim_hops(steps, far)
    # the output side drops steps from the end: each shorter chain's affine is a prefix of the fold below
    prefixes = _prefix_composites(steps) if side == "output" else []
    crossings: dict = {}  # negative_crossing's per max-pool, for every try
    with fold_math.screened():  # a retried weight's overflow refused from its slices' extremes
        while steps:
            crossing = negative_crossing(graph, steps, side, crossings)
            if crossing:
                dropped = steps.pop(far)
                note(graph, out, dropped.node, crossing, Code.NEGATIVE_SCALE)
                _drop(steps, far, dropped, prefixes)
                continue
            total = prefixes[-1] if prefixes else compose(steps)
            new, failed = [], _refused(targets, total, check)
            for i, (layer, w) in enumerate(targets if failed is None else ()):
                targets[i] = (layer, read_weights(graph, layer, w))
                try:
                    new.append(params(*targets[i], total))
                except FoldError as err:
                    failed = (layer, err)
                    break
            if failed is not None:
                fold_math.discard(*(x for made in new for x in made))  # this try's products, never written
                dropped = steps.pop(far)
                note(graph, out, dropped.node, why(*failed), failed[1].code)
                _drop(steps, far, dropped, prefixes)
                continue
            _write(graph, targets, steps, rule, side, new, out)
            return


def _refused(targets: list[tuple[Layer, LayerWeights]], total: Affine, check: Check | None):
    """The first target whose ``check`` refuses ``total``, with the FoldError, or None."""
    for layer, w in targets if check is not None else ():
        try:
            check(layer, w, total)
        except FoldError as err:
            return layer, err
    return None


def _prefix_composites(steps: list[ChainStep]) -> list[Affine]:
    """``compose`` of each leading part of ``steps`` that ends at an affine step, shortest first (the same
    products in the same order, so the same bits)."""
    out: list[Affine] = []
    for s in steps:
        if s.affine is not None:
            out.append(s.affine if not out else out[-1].then(s.affine))
    return out


def _drop(steps: list[ChainStep], far: int, dropped: ChainStep, prefixes: list[Affine]) -> None:
    """After ``dropped`` left the far end: the hops now there go too, and so does its prefix."""
    if prefixes and dropped.affine is not None:
        prefixes.pop()
    trim_hops(steps, far)


def negative_crossing(graph: GraphAdapter, steps: list[ChainStep], side: str, memo: dict | None = None) -> str:
    """Why the chain cannot move to the layer through one of its maxima, or "".

    Folding moves every affine step farther from the layer than a max-pool across it, and
    ``max(x * s + t) = max(x) * s + t`` per channel only where ``s >= 0``: the composed scale of
    those steps must be non-negative on every channel.  ``memo`` (output side, where the retry loop only
    drops steps from the end): per max-pool, the negative channels of each leading part of what crosses it,
    composed once for every try of the loop (the same products in the same order).
    """
    memo = memo if side == "output" else None
    affine_before = [0]  # affine steps before each index
    for s in steps:
        affine_before.append(affine_before[-1] + (s.affine is not None))
    for i, step in enumerate(steps):
        if not step.monotone:
            continue
        lo, hi = (i + 1, len(steps)) if side == "output" else (0, i)
        count = affine_before[hi] - affine_before[lo]
        if not count:
            continue
        if memo is None:
            scale = compose(steps[lo:hi]).scale
            negative, channels = int((scale < 0).sum()), scale.numel()
        else:
            if i not in memo:
                memo[i] = _negatives(steps[lo:hi])
            negative, channels = memo[i][count - 1]
        if negative:
            what = graph.describe_node(step.node)
            return (
                f"the scale that would move through {what} is negative on {negative} of {channels} "
                "channels; a maximum commutes only with a non-negative scale"
            )
    return ""


def _negatives(crossing: list[ChainStep]) -> list[tuple[int, int]]:
    """``(negative channels, channels)`` of the composed scale of each leading part of ``crossing`` that ends at
    an affine step (``compose``'s products in its order)."""
    return [(int((a.scale < 0).sum()), a.scale.numel()) for a in _prefix_composites(crossing)]


def _write(graph: GraphAdapter, targets: list, steps: list[ChainStep], rule: str, side: str, new: list, out: Outcome):
    layers = [layer for layer, _ in targets]
    label = fold_label(graph, steps)
    entries = fold_entries(graph, layers, steps, side, rule)  # named while the chain is still in the graph
    # the chain goes first: a parameter the layer shared only with removed nodes is then no longer shared
    end = remove_chain(graph, steps)
    for layer, (new_w, new_b) in zip(layers, new):
        # a layer that holds no bias gets it where the chain ended (output side) or after the layer
        at = (end, steps[-1].axis, steps[-1].rank) if side == "output" else None
        added, bias_added = write_layer(graph, layer, new_w, new_b, label, at)
        entries[0].extra_bytes += added
        if bias_added:
            for entry in entries:
                entry.bias_added = True
    out.folded.extend(entries)


def write_layer(
    graph: GraphAdapter, layer: Layer, weight: torch.Tensor, bias: torch.Tensor | None, label: str, at=None
) -> tuple[int, bool]:
    """Write ``layer``'s new weight and bias; a bias the layer cannot hold (a conv without a bias input, a
    Gemm whose ``beta * C`` made one) is added after it: at ``at`` = ``(value, channel axis, rank)``, else
    on the layer's output.  Returns the bytes added and whether a bias was added after the layer."""
    added, pending = graph.write_layer(layer, weight, bias, label)
    if pending is None:
        return added, False
    if at is None:
        rank = graph.shape_info(layer.output).rank
        at = (layer.output, channel_axis(layer.out_axis, rank), rank)
    value, axis, rank = at
    graph.add_bias(
        layer, value, pending.reshape(broadcast_shape(pending.numel(), axis, rank, graph.full_rank_constants))
    )
    return added, True


# ------------------------------------------------------------------ report entries


def fold_label(graph: GraphAdapter, steps: list[ChainStep]) -> str:
    """A short name for the fold, used to name private copies of shared tensors."""
    first = next(s for s in steps if s.affine is not None)
    name = graph.norm_label(first.norm) if first.norm is not None else graph.op_label(first.node)
    return name.replace(".", "_").replace("/", "_")


def fold_entries(
    graph: GraphAdapter, layers: list[Layer], steps: list[ChainStep], side: str, rule: str
) -> list[Folded]:
    """One entry per normalization of the chain, a plain one whose affine the chain's ops spell out
    included (``spelled``); one entry for a chain of elementwise ops alone."""
    layer = layers[0]
    ops = [s.op for s in steps]
    pattern = "+".join([layer.op] + ops if side == "output" else ops + [layer.op])
    into = ", ".join(graph.op_label(lay.node) for lay in layers)  # the names people know
    into_node = ", ".join(graph.node_name(lay.node) for lay in layers)
    chain = step_entries(graph, steps)
    written = [graph.node_name(lay.node) for lay in layers]

    def entry(norm: str, node: str, kind: str = "") -> Folded:  # the chain's steps shared, not copied
        return Folded(norm, into, pattern, side, 0, node, into_node, rule, chain, list(written), kind=kind)

    norms: dict = {}  # node -> Norm, in chain order: the chain's normalizations and those whose affine it spells
    for s in steps:
        norm = s.norm if s.norm is not None else spelled.owner(graph, s.node) if s.affine is not None else None
        if norm is not None:
            norms.setdefault(norm.node, norm)
    if norms:
        return [entry(graph.norm_label(n), graph.node_name(n.node), n.kind) for n in norms.values()]
    affine = [s for s in steps if s.affine is not None]
    names = "+".join(graph.node_name(s.node) for s in affine)
    path = graph.op_label(affine[0].node)
    label = f"{path} ({names})" if path != graph.node_name(affine[0].node) else f"affine {names}"
    return [entry(label, graph.node_name(affine[0].node))]
