"""Which value each audit row measures in the unfolded and the folded program, read from the fold report.

Format-neutral: both programs are :class:`~.runner.Program` s (steps by name, values by name).  Node
names survive folding: a layer keeps its name, a skipped norm its own.  The report names the steps of
each chain folded into a layer's output (``Folded.steps``, in graph order) and the layer
(``Folded.into_node``); the row measures the chain's result (the value its last step writes) in the
unfolded program against the value the folded program's readers of that result now read (the layer
itself, a hop or a bias add after it).  A conv that re-parameterization made compute a sum of
branches (``Merged``) measures that sum.  Every other value keeps its name and its function, so the
folded program is measured against the unfolded program's reference values through :func:`ref_names`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .audit_report import LayerAudit
from .runner import EmulationResult, Program, Step


class Graph:
    """Who writes and who reads each value of a :class:`~.runner.Program`."""

    def __init__(self, prog: Program):
        self.prog = prog
        self.steps = {s.name: s for s in prog.steps}
        self.order = {s.name: i for i, s in enumerate(prog.steps)}
        self.producer = {v: s for s in prog.steps for v in s.outs if v}
        self.readers: dict[str, list[Step]] = {}
        for s in prog.steps:
            for v in dict.fromkeys(s.ins):
                if v:
                    self.readers.setdefault(v, []).append(s)

    def value(self, step: Step) -> str:
        """The value holding ``step``'s tensor: a norm's normalized output, else its first output."""
        return step.norm.output if step.norm is not None and step.norm.output else step.outs[0]

    def between(self, start: str, value: str) -> list[str]:
        """The values on some path from step ``start``'s outputs to ``value`` (both ends included)."""
        end = self.producer.get(value)
        if end is None or start not in self.steps:
            return []
        first = self.order[start]
        ancestors, todo = {end.name}, [end]
        while todo:
            for v in todo.pop().ins:
                p = self.producer.get(v)
                if p is not None and p.name not in ancestors and self.order[p.name] >= first:
                    ancestors.add(p.name)
                    todo.append(p)
        kept: set[str] = set()
        for name in sorted(ancestors, key=self.order.__getitem__):
            if name == start or any(self.producer[v].name in kept for v in self.steps[name].ins if v in self.producer):
                kept.add(name)
        return [o for name in kept for o in self.steps[name].outs if o]


@dataclass
class Row:
    """One audited tensor: value ``output`` of the unfolded program, value ``folded`` (or None) of the
    folded one.  ``merged``: the norms this row measures through (not rows of their own)."""

    name: str
    kind: str
    norm: str | None
    output: str
    label: str
    folded: str | None = None
    merged: frozenset = frozenset()


def _read_instead(g: Graph, fg: Graph, value: str) -> str | None:
    """The folded-program value that the readers of the unfolded ``value`` read in its place (a reader that
    stays computes the same function of the same values; a layer folded into reads its data input at the same
    position, its new bias after it), or the folded output in its place."""
    for user in g.readers.get(value, []):
        twin = fg.steps.get(user.name)
        if twin is not None and twin.op == user.op:  # a layer that gained a bias reads its input where it did
            found = [b for a, b in zip(user.ins, twin.ins) if a == value and b]
            if found:
                return found[0]
    outs, fouts = g.prog.outputs, fg.prog.outputs
    return fouts[outs.index(value)] if value in outs and len(outs) == len(fouts) else None


def rows(g: Graph, fg: Graph | None, report) -> list[Row]:
    """A row per layer (with the norm or chain after it) and per remaining eval-mode norm, in graph order
    (``g``: the unfolded program's graph, ``fg`` the folded one's or None)."""
    prog = g.prog
    chains: dict[str, list] = {}
    merges: dict[str, str] = {}
    if report is not None and fg is not None:
        for f in report.folded:
            if f.side == "output" and f.steps:
                chains.setdefault(f.into_node or f.into, f.steps)
        merges = {m.into_node: m.node for m in getattr(report, "merged", ()) if m.into_node and m.node}
    out = []
    for step in prog.steps:
        if step.layer is None or not step.outs or not step.outs[0]:
            continue
        label = step.label or step.name
        if step.name in merges and merges[step.name] in g.steps:
            total = g.value(g.steps[merges[step.name]])
            out.append(Row(step.name, step.layer, None, total, f"{label} (merged sum)", _read_instead(g, fg, total)))
            continue
        chain = [g.steps[s.node] for s in chains.get(step.name, []) if s.node in g.steps]
        if chain:
            end = g.value(chain[-1])
            norms = [s.name for s in chain if s.norm is not None]
            first = norms[0] if norms else chain[0].name
            row = Row(step.name, step.layer, first, end, label, _read_instead(g, fg, end), frozenset(norms))
        else:
            value, norm, merged = step.outs[0], None, frozenset()
            readers = g.readers.get(value, [])
            if len(readers) == 1 and readers[0].norm is not None and readers[0].norm.input == value:
                norm, merged = readers[0].name, frozenset({readers[0].name})
                value = g.value(readers[0])
            row = Row(step.name, step.layer, norm, value, label, _unchanged(g, fg, value, chains), merged)
        if fg is not None and step.name not in fg.steps:  # merged into another conv: nothing to pair it with
            row.folded = None
        out.append(row)
    merged = set().union(*(r.merged for r in out))
    for step in prog.steps:
        if step.norm is not None and step.norm.output and step.name not in merged:
            value, label = step.norm.output, step.label or step.name
            out.append(Row(step.name, "batch_norm", step.name, value, label, _unchanged(g, fg, value, chains)))
    return sorted(out, key=lambda r: g.order[r.name])


def _unchanged(g: Graph, fg: Graph | None, value: str, chains: dict) -> str | None:
    """``value`` when the folded program computes the same value under that name, else None."""
    if fg is None or value not in fg.producer:
        return None
    return value if fg.producer[value].name not in chains else None


def ref_names(g: Graph, fg: Graph, row_list: list[Row], report) -> dict[str, str]:
    """``{folded value: unfolded value}`` holding the same tensor: each row's pair, and every value whose
    step stays and computes what it did (not a layer a chain or a merge went into), under its name or, where the fold
    gave its output the name of an affine it folded away, under that one."""
    changed = {f.into_node or f.into for f in (report.folded if report is not None else ()) if f.side == "output"}
    changed |= {m.into_node for m in getattr(report, "merged", ()) if m.into_node}
    out = {
        v: v
        for v, s in fg.producer.items()
        if v in g.producer and s.name not in changed and g.producer[v].name == s.name
    }
    for s in fg.prog.steps:  # a step that stays but writes under another name (the value of an affine folded away)
        twin = g.steps.get(s.name)
        if s.name not in changed and twin is not None and twin.op == s.op and len(twin.outs) == len(s.outs):
            out.update((f, u) for f, u in zip(s.outs, twin.outs) if f and u and f not in out and u in g.producer)
    out.update((v, v) for v in fg.prog.inputs if v in g.prog.inputs)
    out.update((r.folded, r.output) for r in row_list if r.folded is not None)
    return out


def segments(g: Graph, pairs) -> dict[str, str]:
    """``{value name: row name}`` for the local-error run: each row's values from its layer to its output."""
    seg: dict[str, str] = {}
    for row, start, value in pairs:
        for v in g.between(start, value):
            seg.setdefault(v, row)
    return seg


def layers(row_list: list[Row], unfolded: EmulationResult, folded: EmulationResult | None) -> list[LayerAudit]:
    """Per-layer errors, each row paired with the folded program."""
    out = []
    for r in row_list:
        err = unfolded.errors.get(r.output)
        if err is None:
            continue  # not a floating-point tensor: nothing measured
        ferr = folded.errors.get(r.folded) if folded is not None and r.folded is not None else None
        lf = folded.local.get(r.folded) if folded is not None and r.folded is not None else None
        norms = tuple(sorted(r.merged | ({r.norm} if r.norm else set())))
        out.append(LayerAudit(r.name, r.kind, r.norm, err, ferr, r.label, unfolded.local.get(r.output), lf, norms))
    return out
