"""The fold driver: apply the rules to every layer until nothing changes, then
report every normalization (and every elementwise op a rule tried) that stays."""

from __future__ import annotations

from typing import Any

from ..report import FoldReport, Skipped
from .graph import GraphAdapter
from .rules import fold_input, fold_output

#: The rules, in the order they run on each layer: output side first, so that
#: a batch norm between two layers goes into the one before it (no padding issue).
RULES = (fold_output, fold_input)

#: Each round folds at least one node, so this bound is never reached in practice.
MAX_ROUNDS = 64


def fold_graph(graph: GraphAdapter, only=None) -> FoldReport:
    """Fold every foldable chain of ``graph`` in place; return the report."""
    report = FoldReport()
    reasons: dict[Any, str] = {}
    nodes = [layer.node for layer in graph.layers()]  # a fold never makes or removes a layer
    for _ in range(MAX_ROUNDS):
        changed = False
        for rule in RULES:
            for node in nodes:
                layer = graph.layer(node)  # parsed again: an earlier fold may have rewired it
                if layer is None:
                    continue
                outcome = rule(graph, layer, only)
                for node, reason in outcome.reasons.items():
                    reasons.setdefault(node, reason)
                if outcome.folded:
                    report.folded.extend(outcome.folded)
                    changed = True
        if not changed:
            break
    for norm in graph.norms():
        reason = norm.problem or reasons.get(norm.node) or no_neighbour(graph, norm)
        report.skipped.append(Skipped(graph.norm_label(norm), reason, _layer_name(graph, norm.input),
                                      graph.node_name(norm.node)))
    for node, reason in reasons.items():
        if graph.norm(node) is None and graph.is_live(node) and graph.binary(node) is not None:
            report.skipped.append(Skipped(graph.op_label(node), reason, "", graph.node_name(node)))
    return report


def _layer_name(graph: GraphAdapter, value: Any) -> str:
    node = graph.producer(value)
    return graph.node_name(node) if node is not None and graph.layer(node) is not None else ""


def no_neighbour(graph: GraphAdapter, norm) -> str:
    users = [graph.describe_node(u) if u is not None else "a graph output" for u in graph.users(norm.output)] \
        if norm.output is not None else []
    return (f"no conv, transposed conv or linear next to it: its input comes from {graph.describe(norm.input)} "
            f"and its output goes to {', '.join(users) or 'nothing'}")
