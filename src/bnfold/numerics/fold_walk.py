"""Which tensor each layer row measures, in the unfolded and the folded torch program: the graph re-walk.

The fold report names each folded step (``Folded.node``) and the layer it went into
(``Folded.into_node``); this module walks the unfolded graph from each layer to the end of the
chain folded into its output and finds the folded-program node that now holds that chain's
result.  It is kept in one module so that it can be replaced by reading the steps the report
records for each fold.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..torch_export.ops import module_path, parse_norm
from .audit_report import LayerAudit
from .graph import layer_kind, running_stats_norm
from .runner import EmulationResult


def _into_node(f) -> str:
    """The graph node name of the layer a fold went into (``Folded.into_node`` where the report has it)."""
    return getattr(f, "into_node", "") or f.into


@dataclass
class _FoldMap:
    """The fold seen from the unfolded program.  Node names survive folding: a layer keeps its
    name, a skipped norm its own, and the report names each folded step (``Folded.node``) and
    the layer it went into (``Folded.into_node``)."""

    nodes: dict[str, torch.fx.Node]  # the folded program's nodes, by name
    into_output: dict[str, set[str]]  # layer name -> the steps the report folded into its output
    step_of: dict[str, tuple[str, str]]  # step name -> (layer it went into, side)
    merges: dict[str, str]  # merged conv -> the node whose value it now holds (``Merged.node``: the last add)

    @classmethod
    def of(cls, report, folded_ep) -> _FoldMap:
        into_output: dict[str, set[str]] = {}
        for f in report.folded:
            if f.side == "output":
                into_output.setdefault(_into_node(f), set()).add(f.node)
        return cls(
            {n.name: n for n in folded_ep.graph.nodes},
            into_output,
            {f.node: (_into_node(f), f.side) for f in report.folded},
            {m.into_node: m.node for m in getattr(report, "merged", ()) if m.into_node and m.node},
        )

    def kept(self, node: torch.fx.Node) -> bool:
        return node.name in self.nodes

    def unchanged(self, name: str) -> str | None:
        """``name`` when the folded program computes the same value under that name, else None.

        Every node that stays computes the same function, except a layer with steps folded into
        its output (and shape-only hops inside such a chain, which no row measures).
        """
        return name if name in self.nodes and name not in self.into_output else None

    def stops_chain_of(self, layer: str, node: torch.fx.Node) -> bool:
        """Whether ``node`` is beyond ``layer``'s output chain: a step of another fold, a layer or
        norm that stays (a chain never passes one), or the graph's output."""
        owner = self.step_of.get(node.name)
        if owner is not None:
            return owner != (layer, "output")
        if node.op != "call_function":
            return True
        return self.kept(node) and (layer_kind(node) is not None or parse_norm(node) is not None)

    def read_instead(self, value: torch.fx.Node) -> torch.fx.Node | None:
        """The folded-program node that the consumers of the removed ``value`` read in its place.

        A consumer that stays computes the same function of the same values, so what it reads
        where it read ``value`` holds ``value``'s tensor, whatever nodes the fold put there.
        """
        for user in value.users:
            twin = self.nodes.get(user.name)
            if twin is None:
                continue
            before, after = _inputs(user), _inputs(twin)
            if len(before) == len(after):
                found = [b for a, b in zip(before, after) if a is value and isinstance(b, torch.fx.Node)]
                if found:
                    return found[0]
        return None


def _inputs(node: torch.fx.Node) -> list:
    """``node``'s arguments, flattened in order (nodes and constants)."""
    flat: list = []
    torch.fx.node.map_aggregate((node.args, node.kwargs), flat.append)
    return flat


@dataclass
class _Row:
    """One audited tensor: node ``output`` of the unfolded program, node ``folded`` (or None) of
    the folded one.  ``merged``: the norms this row measures through (not rows of their own)."""

    name: str
    kind: str
    norm: str | None
    output: str
    label: str
    folded: str | None = None
    merged: frozenset = frozenset()


def _value(node: torch.fx.Node) -> torch.fx.Node | None:
    """The node holding ``node``'s tensor: a tuple-returning norm's ``getitem(0)``, else itself."""
    norm = parse_norm(node)
    return node if norm is None else norm.output


def _data_input(node: torch.fx.Node, reached: set) -> torch.fx.Node | None:
    """The input through which ``node`` reads the chain: a norm's ``input``, else its first input in ``reached``."""
    norm = parse_norm(node)
    if norm is not None:
        return norm.input
    return next((a for a in node.all_input_nodes if a in reached), None)


def _reached(layer: torch.fx.Node, fold: _FoldMap) -> set[torch.fx.Node]:
    """The nodes reachable from ``layer``'s output before its chain stops (see ``stops_chain_of``);
    a norm is followed through its normalized output only."""
    reached, todo = set(), [layer]
    while todo:
        for user in todo.pop().users:
            value = _value(user)
            if user in reached or value is None or fold.stops_chain_of(layer.name, user):
                continue
            reached.update((user, value))
            todo.append(value)
    return reached


def _output_chain(layer: torch.fx.Node, fold: _FoldMap) -> tuple[list[torch.fx.Node], torch.fx.Node | None] | None:
    """The nodes from ``layer`` to the end of the chain folded into its output, and the node of the
    folded program that holds the chain's result (None if none does); None when the graph and the
    report do not agree on a chain.

    The chain ends at the last node after the layer, in graph order, that the fold removed; the
    path back from it to the layer must hold every step the report names.
    """
    reached = _reached(layer, fold)
    removed = [n for n in reached if not fold.kept(n)]
    if not removed:
        return None
    order = {n: i for i, n in enumerate(layer.graph.nodes)}
    path, on_chain = [max(removed, key=order.__getitem__)], reached | {layer}
    while path[-1] is not layer and path[-1] is not None:
        path.append(_data_input(path[-1], on_chain))
    if path[-1] is None or not fold.into_output[layer.name] <= {n.name for n in path}:
        return None
    return path[::-1], fold.read_instead(path[0])


def _chain_row(node: torch.fx.Node, kind: str, fold: _FoldMap) -> _Row | None:
    """The row of a layer with steps folded into its output: the unfolded chain's result against
    the folded-program node that now holds it (the layer itself, or a hop or bias add after it)."""
    chain = _output_chain(node, fold)
    if chain is None:
        return None
    path, holder = chain
    norms = [n.name for n in path if parse_norm(n) is not None]
    first = norms[0] if norms else next(n.name for n in path if not fold.kept(n))
    return _Row(node.name, kind, first, path[-1].name, module_path(node), holder and holder.name, frozenset(norms))


def _plain_layer_row(node: torch.fx.Node, kind: str, fold: _FoldMap | None) -> _Row:
    """The row of a layer with nothing folded into its output: the layer, or the eval-mode norm
    that is its only user, in both programs under the same name."""
    users = list(node.users)
    norm = running_stats_norm(users[0]) if len(users) == 1 else None
    if norm is not None and norm.input is node and norm.output is not None:
        out, merged = norm.output.name, frozenset({norm.node.name})
    else:
        norm, out, merged = None, node.name, frozenset()
    folded = fold.unchanged(out) if fold is not None else None
    return _Row(node.name, kind, norm and norm.node.name, out, module_path(node), folded, merged)


def _merge_row(node: torch.fx.Node, kind: str, fold: _FoldMap, by_name: dict) -> _Row | None:
    """The row of a conv that re-parameterization made compute a whole sum of branches: the unfolded
    sum (``Merged.node``) against the folded-program node that its consumers now read."""
    total = by_name.get(fold.merges[node.name])
    if total is None:
        return None
    holder = fold.read_instead(total)
    return _Row(node.name, kind, None, total.name, f"{module_path(node)} (merged sum)", holder and holder.name)


def _rows(ep, fold: _FoldMap | None) -> list[_Row]:
    """A row per layer (with the norm or chain after it) and per remaining eval-mode norm, in graph order.
    A layer that a merge took out of the graph has no folded twin; the conv it merged into measures the sum."""
    nodes = list(ep.graph_module.graph.nodes)
    by_name = {n.name: n for n in nodes}
    rows = []
    for node in nodes:
        kind = layer_kind(node)
        if kind is None:
            continue
        if fold is not None and node.name in fold.merges and (row := _merge_row(node, kind, fold, by_name)):
            rows.append(row)
            continue
        row = _chain_row(node, kind, fold) if fold is not None and node.name in fold.into_output else None
        row = row or _plain_layer_row(node, kind, fold)
        if fold is not None and not fold.kept(node):  # merged into another conv: nothing to pair it with
            row.folded = None
        rows.append(row)
    merged = set().union(*(r.merged for r in rows))
    for node in nodes:
        norm = running_stats_norm(node)
        if norm is not None and norm.output is not None and node.name not in merged:
            folded = fold.unchanged(norm.output.name) if fold is not None else None
            rows.append(_Row(node.name, "batch_norm", node.name, norm.output.name, module_path(node), folded))
    order = {n.name: i for i, n in enumerate(nodes)}
    return sorted(rows, key=lambda r: order[r.name])


def _between(graph: torch.fx.Graph, start: str, end: str) -> list[str]:
    """The names of the nodes on some path from node ``start`` to node ``end`` (both included)."""
    nodes = {n.name: n for n in graph.nodes}
    if start not in nodes or end not in nodes:
        return []
    order = {n: i for i, n in enumerate(graph.nodes)}
    first, last = nodes[start], nodes[end]
    ancestors, todo = {last}, [last]
    while todo:
        for i in todo.pop().all_input_nodes:
            if i not in ancestors and order[i] >= order[first]:
                ancestors.add(i)
                todo.append(i)
    kept = set()
    for n in sorted(ancestors, key=order.__getitem__):
        if n is first or any(i in kept for i in n.all_input_nodes):
            kept.add(n)
    return [n.name for n in kept if n.op == "call_function"]


def _segments(graph: torch.fx.Graph, pairs) -> dict[str, str]:
    """``{node name: row name}`` for the local-error run: each row's nodes from its layer to its output."""
    seg: dict[str, str] = {}
    for row, start, end in pairs:
        for name in _between(graph, start, end):
            seg.setdefault(name, row)
    return seg


def _layers(rows: list[_Row], unfolded: EmulationResult, folded: EmulationResult | None) -> list[LayerAudit]:
    """Per-layer errors, each row paired with the folded program by node identity (see ``_FoldMap``)."""
    out = []
    for r in rows:
        err = unfolded.errors.get(r.output)
        if err is None:
            continue  # not a floating-point tensor: nothing measured
        ferr = folded.errors.get(r.folded) if folded is not None and r.folded is not None else None
        lf = folded.local.get(r.folded) if folded is not None and r.folded is not None else None
        norms = tuple(sorted(r.merged | ({r.norm} if r.norm else set())))
        out.append(LayerAudit(r.name, r.kind, r.norm, err, ferr, r.label, unfolded.local.get(r.output), lf, norms))
    return out
