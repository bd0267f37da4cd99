"""The fp16 range rewrite, written once for every graph kind: a value whose peak magnitude passes a limit is
scaled by a power of two ``s = 2 ** -k``, exactly, with every writer and reader of the scaled values
compensating.

Each value past the limit (then each constant past its limit) gets a plan (``range_planner``: the region's
exponents, ``k``), a kind for the report (``range_kind``) and its edits (``range_apply``); ``rescale_graph`` here
tries them in turn and fills one ``bnfold.report.Rescaled`` per value.  Nothing here is arithmetic on tensors: the
factors are applied by ``bnfold.fold_math.scale_pow2`` and the adapters' primitive edits.  Whether the rewritten
model is the same function is proved outside (in float64, on the calibration batches and fresh inputs:
``bnfold.rescale``).
"""

from __future__ import annotations

import heapq
from typing import Any

from ..report import Code
from .graph import GraphAdapter
from .range_apply import apply
from .range_kind import kind_of
from .range_planner import MAX_REGION, Limits, Plan, Planner, Refused

__all__ = ["MAX_REGION", "HotConstants", "Limits", "Plan", "Planner", "Refused", "rescale_graph"]


def _rewrite(planner: Planner, value: Any, entry, tried: set, by_handle: dict, hot, limits: Limits) -> bool:
    """Plan, size and apply the region of ``value`` (a value scaled by ``s``), filling ``entry``; False if refused.
    ``hot(v)``: whether ``v`` is another hot value still to try (named in the reason when the region takes it)."""
    g, fp16_max = planner.g, entry.limit
    try:
        p = planner.plan(value)
        others = [g.value_name(v) for v in p.exps if v != value and hot(v)]
        k, met = planner.choose_k(p)
        if k <= 0:
            raise Refused(
                "every scale that lowers it pushes another value or a rewritten constant past its limit",
                Code.LIMIT_BOUND,
            )
        kind = kind_of(planner, p, value)
        entry.nodes = apply(planner, p, k, f"range_{g.value_name(value)}")
    except Refused as why:
        entry.reason, entry.code = why.reason, why.code
        return False
    entry.factor, entry.kind, entry.muls = 2.0**-k, kind, len(p.mul_after) + len(p.mul_before)
    tried.update(p.exps)  # one entry per region: its other values are not tried again
    for v, e in p.exps.items():
        if v not in p.mul_after and v in by_handle:
            by_handle[v] *= 2.0 ** -float(e * k)
    if value in by_handle:
        entry.peak_after = by_handle[value]
        entry.margin = fp16_max / entry.peak_after
    entry.code = Code.RESCALED if met else Code.MARGIN_NOT_MET
    entry.reason = f"scaled by 2^-{k} with {len(p.exps)} value(s)" + (
        f", also bringing down {', '.join(others[:4])}" if others else ""
    )
    if not met:
        entry.reason += "; the margin is not met: a larger scale pushes another value or constant past its limit"
    return True


class HotConstants:
    """The constants beyond the constant limit, in graph order: a layer's weight or bias (the value: the layer's
    output), then a constant operand of a sum, product or quotient (the value: its output).  Read once, then
    again only for the nodes an edit touched or added (``Planner.forget``)."""

    def __init__(self, planner: Planner):
        self.planner = planner
        self.read()

    def read(self) -> None:
        self.found: dict = {}
        self._rank()
        for node in self.rank:
            self.look(node)
        self.planner.edited.clear()
        self.planner.added = []

    def _rank(self) -> None:
        """Layers first, then the other nodes in graph order; what was found is kept for the nodes still there."""
        planner = self.planner
        self.rank = {n: (0, (i,)) for i, n in enumerate(planner.written.values())}
        self.rank.update((n, (1, key)) for n, key in planner.order.items() if n not in planner.layer_nodes)
        self.relisted = planner.relisted
        self.found = {n: found for n, found in self.found.items() if n in self.rank}
        self.heap = [(self.rank[n], id(n), n) for n, found in self.found.items() if found is not None]
        heapq.heapify(self.heap)

    def look(self, node: Any) -> None:
        found = self.found[node] = self.hot(node)
        if found is not None:
            heapq.heappush(self.heap, (self.rank[node], id(node), node))

    def hot(self, node: Any) -> tuple[Any, str, float] | None:
        """``(value, what, largest magnitude)`` when ``node`` holds a constant beyond the limit, else None."""
        planner, limit = self.planner, self.planner.limits.constant
        lw = planner.layer(node) if node in planner.layer_nodes else None
        if lw is not None:
            weight, bias = planner.spans(node)
            high = max(weight[1], bias[1] if bias is not None else 0.0)
            return (lw[0].output, f"{planner.g.node_name(node)} weight", high) if high > limit else None
        op = planner.rop(node)
        if op is None or op.fact not in ("sum", "product", "quotient"):
            return None
        for _, v in op.operands:
            if planner.is_const(v) and (high := planner.const_span(v)[1]) > limit:
                return (op.output, f"{planner.g.node_name(node)} constant", high)
        return None

    def next(self, tried: set) -> tuple[Any, str, float] | None:
        """The first constant beyond the limit whose value was not tried."""
        planner = self.planner
        if planner.relisted != self.relisted:  # the order numbered or the layers listed again: all ranked again
            self._rank()
        if planner.added:  # the new nodes ranked (a key of the graph order: no walk) and read, and below the nodes
            for node in planner.added:  # the edit touched
                if node not in planner.layer_nodes:
                    self.rank[node] = (1, planner.order[node])
                if node in self.rank:
                    self.look(node)
            planner.added = []
        for node in planner.edited:
            if node in self.rank:
                self.look(node)
        planner.edited.clear()
        while self.heap:
            _, _, node = self.heap[0]
            found = self.found.get(node)
            if found is not None and found[0] not in tried and planner.g.is_live(node):
                return found
            heapq.heappop(self.heap)  # gone (the order keeps a node an edit removed), or tried (for good)
        return None


def _inside_layer(planner: Planner, value: Any) -> bool:
    """Whether ``value`` is computed inside a layer (its product before the bias add that ends it)."""
    node = planner.g.producer(value)
    return value not in planner.written and node is not None and node in planner.layer_nodes


def rescale_graph(
    graph: GraphAdapter, peaks: dict[str, float], limits: Limits, fp16_max: float = 65504.0, spans: dict | None = None
) -> list:
    """Rewrite every value of ``graph`` whose peak (``peaks``: by ``value_name``, float32 magnitudes on the
    calibration batches) passes ``limits.value``, largest first; returns one ``bnfold.report.Rescaled`` per value
    tried (rescaled, or refused with its code).  ``peak_after`` and ``margin`` are the plan's predictions; the
    caller measures them.  Every value past the limit is tried once (with it, the other values of its region): at
    most one plan per value, each bounded by ``MAX_REGION``; one ``Planner`` reads the graph once and again only
    what each rewrite edits or touches (a multiply's writer and readers; the multiply takes its place in the graph
    order from the node before it, no weight read, and no walk but where the adapter names a node the order does not
    hold: then the order is numbered again), so the weights are read once each and again only where a rewrite edits
    them; ``spans``: the spans of constants left on disk, measured as the calibration read them (``Planner``'s
    ``known``), which are then not read for them."""
    from ..report import Rescaled

    entries, tried = [], set()
    by_handle = {v: peaks[graph.value_name(v)] for v in graph.values() if graph.value_name(v) in peaks}
    planner = Planner(graph, by_handle, limits, spans)

    def skip(v: Any) -> bool:  # a weight computed from constants is no value, a layer's product before its bias
        return planner.is_const(v) or _inside_layer(planner, v)  # add is the layer's

    def hot(v: Any) -> bool:
        return by_handle.get(v, 0.0) > limits.value and v not in tried and not skip(v)

    # largest first; a rewrite changes the peaks of its region's values only, and those are tried with it
    for value in sorted((v for v, peak in by_handle.items() if peak > limits.value), key=lambda v: -by_handle[v]):
        if value in tried:
            continue
        tried.add(value)
        if skip(value):
            continue
        name, peak = graph.value_name(value), by_handle[value]
        entry = Rescaled(name, peak=peak, peak_after=peak, limit=fp16_max, margin=fp16_max / peak)
        entries.append(entry)
        _rewrite(planner, value, entry, tried, by_handle, hot, limits)
    constants = HotConstants(planner)
    while (found := constants.next(tried)) is not None:  # the value a constant makes moves down with it
        value, what, high = found
        tried.add(value)
        entry = Rescaled(what, peak=high, peak_after=high, limit=limits.constant, margin=limits.constant / high)
        entries.append(entry)
        if _rewrite(planner, value, entry, tried, by_handle, lambda v: False, limits):
            entry.kind, entry.peak_after = "constant", high * entry.factor
            entry.margin = limits.constant / entry.peak_after
    return entries
