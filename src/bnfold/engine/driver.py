"""The fold driver: apply the rules to every layer until nothing changes, then
report every normalization (and every elementwise op a rule tried) that stays.

``exclude`` holds fnmatch patterns on the names people know (module paths for
torch programs, node names for ONNX): a layer whose ``op_label`` matches gets
nothing folded into it, and a normalization whose ``norm_label`` matches is
left where it is; both are reported as "excluded by --exclude PATTERN".
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable
from typing import Any

from ..kinds import LAYER_KINDS, NORM_KINDS, check_exclude, check_only
from ..report import Code, FoldReport, KeptOp, Skipped
from . import spelled
from .constant_weight import CONSTANT
from .fanout import FANOUT
from .graph import Binary, GraphAdapter, Norm
from .lower import lower_unfoldable
from .reparam import MERGE
from .rule import Rule
from .rules import INPUT, OUTPUT

#: The rules, in the order they run on each layer: output side first, so that
#: a batch norm between two layers goes into the one before it (no padding issue);
#: then a chain that feeds several layers, then one that feeds this layer alone; last, the
#: re-parameterization merge of summed conv branches (``reparam.py``), whose BN-free branches the
#: other rules made; last, a weight computed through a normalization of a constant becomes the
#: stored weight (``constant_weight.py``) where no other rule already wrote it.
RULES: tuple[Rule, ...] = (OUTPUT, FANOUT, INPUT, MERGE, CONSTANT)

#: Each round folds at least one node, so this bound is never reached in practice.
MAX_ROUNDS = 64


def excluded_by(label: str, patterns: Iterable[str]) -> str | None:
    """The first pattern of ``patterns`` that ``label`` matches (fnmatch, case-sensitive), or None."""
    return next((p for p in patterns if fnmatch.fnmatchcase(label, p)), None)


def exclusion_reason(pattern: str, what: str = "") -> tuple[str, Code]:
    """The skip reason (and code) of an excluded normalization (``what``: the excluded layer, if it was the layer)."""
    return f"excluded by --exclude {pattern}" + (f" (layer {what})" if what else ""), Code.EXCLUDED


class _Hiding:
    """The adapter as the rules see it when some normalizations are left alone (excluded, or of a kind
    ``only`` does not name): those are not normalizations, and the ops that spell the affine of a plain
    one are not elementwise ops (``spelled``), so no chain goes through them; every
    other call goes to the adapter.  ``excluded_layers``: the layer nodes ``exclude`` names, which
    no merge takes as a branch (``reparam.merge_branches``)."""

    def __init__(self, graph: GraphAdapter, left_alone: Callable[[Norm], tuple | None], excluded_layers: set):
        self._graph = graph
        self._left_alone = left_alone
        self.excluded_layers = excluded_layers

    def __getattr__(self, name: str) -> Any:
        return getattr(self._graph, name)

    def norm(self, node: Any) -> Norm | None:
        norm = self._graph.norm(node)
        return None if norm is not None and self._left_alone(norm) else norm

    def binary(self, node: Any) -> Binary | None:
        """An elementwise op, unless it spells the affine of a normalization left alone."""
        op = self._graph.binary(node)
        if op is not None and (plain := spelled.owner(self._graph, node)) is not None and self._left_alone(plain):
            return None
        return op


def _excluded_layers(graph: GraphAdapter, nodes: list, patterns: tuple[str, ...], reasons: dict) -> set:
    """The layer nodes whose label matches a pattern; their neighbouring normalizations get the reason."""
    out = set()
    for node in nodes:
        label = graph.op_label(node)
        pattern = excluded_by(label, patterns)
        if pattern is None:
            continue
        out.add(node)
        layer = graph.layer(node)
        neighbours = list(graph.users(layer.output)) + [graph.producer(layer.input)]
        for other in neighbours:
            if other is not None and graph.norm(other) is not None:
                reasons.setdefault(other, exclusion_reason(pattern, label))
    return out


def fold_graph(graph: GraphAdapter, only=None, exclude: Iterable[str] = (), lower: bool = False) -> FoldReport:
    """Fold every foldable chain of ``graph`` in place; return the report.

    ``only``: kinds (``bnfold.kinds``; a comma-separated string or an iterable, validated: an unknown
    kind is a ValueError); ``exclude``: fnmatch patterns; ``lower``: rewrite each eval batch norm
    that stays as ``x * scale + shift`` (``bnfold.engine.lower``).

    ``report.skipped`` holds the normalizations that stay; an elementwise affine op that a rule tried
    and that stays (a residual add, a ``/6`` that cannot move) is a ``report.kept_ops`` note.
    """
    only = check_only(only)
    patterns = check_exclude(exclude)
    layer_only, norm_only = _split_only(only)
    report = FoldReport()
    reasons: dict[Any, tuple[str, Code]] = {}
    nodes = [layer.node for layer in graph.layers()]  # a fold never makes a layer (a merge removes some)

    def left_alone(norm: Norm) -> tuple[str, Code] | None:
        """Why ``norm`` is left where it is by request (``exclude``, ``only``), or None."""
        pattern = excluded_by(graph.norm_label(norm), patterns) if patterns else None
        if pattern:
            return exclusion_reason(pattern)
        if norm_only and norm.kind not in norm_only:
            return f"folding {norm.kind} was not requested (only={','.join(sorted(only))})", Code.NOT_REQUESTED
        return None

    report.unmatched = unmatched(graph, only, patterns)
    view: Any = graph
    if patterns:
        skip = _excluded_layers(graph, nodes, patterns, reasons)
        nodes = [n for n in nodes if n not in skip]
    if patterns or norm_only:
        view = _Hiding(graph, left_alone, skip if patterns else set())
    _run_rules(view, nodes, layer_only, report, reasons)
    if lower:
        why = lambda norm: reasons.get(norm.node) or no_neighbour(graph, norm)  # noqa: E731
        report.lowered, refused = lower_unfoldable(graph, why, lambda norm: not left_alone(norm))
        for node, why_not in refused.items():
            if node in reasons:
                reasons[node] = (f"{reasons[node][0]}; {why_not}", reasons[node][1])
            else:  # no rule tried it: it sits next to no layer
                reasons[node] = (why_not, Code.NO_LAYER)
    for norm in graph.norms():
        label = graph.norm_label(norm)
        if norm.problem:
            reason, code = norm.problem, norm.problem_code
        else:
            reason, code = left_alone(norm) or reasons.get(norm.node) or no_neighbour(graph, norm)
        report.skipped.append(
            Skipped(label, reason, _layer_name(graph, norm.input), graph.node_name(norm.node), Code(code))
        )
    reported = _spelled_skips(graph, report, reasons, left_alone)
    for node, (reason, code) in reasons.items():
        is_op = graph.binary(node) is not None or graph.inplace_sum(node) is not None  # a sum a merge kept
        if graph.norm(node) is None and graph.is_live(node) and is_op and node not in reported:
            report.kept_ops.append(KeptOp(graph.op_label(node), reason, graph.node_name(node), Code(code)))
    return report


def _spelled_skips(graph: GraphAdapter, report: FoldReport, reasons: dict, left_alone: Callable) -> set:
    """Report each plain normalization whose spelled-out affine stays (``spelled``) as skipped, with the
    reason a rule gave one of its ops; returns those ops (they are no ``kept_ops`` note then)."""
    ops_of = set()
    for plain in graph.plain_norms():
        ops = spelled.affine_ops(graph, plain)
        if not ops:
            continue
        ops_of.update(ops)
        norm = spelled.with_affine(plain, graph, ops)
        why = next((reasons[op] for op in ops if op in reasons), None)
        reason, code = left_alone(norm) or why or no_neighbour(graph, norm)
        report.skipped.append(
            Skipped(
                graph.norm_label(norm), reason, _layer_name(graph, norm.input), graph.node_name(norm.node), Code(code)
            )
        )
    return ops_of


def unmatched(graph: GraphAdapter, only: frozenset | None, patterns: tuple[str, ...]) -> list[str]:
    """One sentence per ``exclude`` pattern that names no layer or normalization of ``graph`` and per ``only``
    kind the graph has none of: a typo there would otherwise fold what the caller meant to keep."""
    if not patterns and not only:
        return []
    norms = [*graph.norms(), *graph.plain_norms()]
    layers = list(graph.layers())
    labels = [graph.norm_label(n) for n in norms] + [graph.op_label(layer.node) for layer in layers]
    out = []
    names = getattr(graph, "label_names", "names")
    examples = ", ".join(repr(x) for x in list(dict.fromkeys(labels))[:2])
    for pattern in patterns:
        if excluded_by_any(labels, pattern):
            continue
        out.append(
            f"--exclude {pattern!r} matches no layer or normalization; the patterns match {names}"
            + (f", such as {examples}" if examples else "")
        )
    present = {n.kind for n in norms} | {layer.kind for layer in layers}
    for kind in sorted((only or frozenset()) - present):
        what = "layer" if kind in LAYER_KINDS else "normalization"
        has = ", ".join(sorted(present & frozenset(LAYER_KINDS if kind in LAYER_KINDS else NORM_KINDS))) or "none"
        out.append(f"--only {kind}: the model has no {kind} {what} (its {what} kinds: {has})")
    return out


def excluded_by_any(labels: Iterable[str], pattern: str) -> bool:
    return any(fnmatch.fnmatchcase(label, pattern) for label in labels)


def _split_only(only: frozenset | None) -> tuple[frozenset | None, frozenset]:
    """``only`` as the layer kinds to fold into (None: all) and the normalization kinds to fold (empty: all)."""
    if not only:
        return None, frozenset()
    return (only & frozenset(LAYER_KINDS)) or None, only & frozenset(NORM_KINDS)


def _run_rules(graph: Any, nodes: list, only, report: FoldReport, reasons: dict) -> None:
    """The rules on every layer node, round after round, until a round folds nothing."""
    for _ in range(MAX_ROUNDS):
        changed = False
        for rule in RULES:
            for node in nodes:
                layer = graph.layer(node) if graph.is_live(node) else None  # parsed again: a fold rewires
                if layer is None:
                    continue
                outcome = rule.apply(graph, layer, only)
                for step, why in outcome.reasons.items():
                    reasons.setdefault(step, why)
                report.merged.extend(outcome.merged)
                if outcome.folded or outcome.merged:
                    report.folded.extend(outcome.folded)
                    changed = True
        if not changed:
            break


def _layer_name(graph: GraphAdapter, value: Any) -> str:
    node = graph.producer(value)
    return graph.node_name(node) if node is not None and graph.layer(node) is not None else ""


def no_neighbour(graph: GraphAdapter, norm) -> tuple[str, Code]:
    users = (
        [graph.describe_node(u) if u is not None else "a graph output" for u in graph.users(norm.output)]
        if norm.output is not None
        else []
    )
    return (
        f"no conv, transposed conv or linear next to it: its input comes from {graph.describe(norm.input)} "
        f"and its output goes to {', '.join(users) or 'nothing'}",
        Code.NO_LAYER,
    )
