"""``bnfold.audit``: what fp16 does to a model's normalizations, unfolded and folded.

Per normalization: its scale range, ``kappa = max_c |mean_c| / sqrt(var_c + eps)``
(the cancellation factor that multiplies the fp16 rounding error of its input),
the fp16 overflow headroom of its input on the given batches, and whether
``bnfold.fold`` folds it.  Per layer: SQNR against float64 and NaN/inf counts,
unfolded and folded side by side.  End to end: output SQNR, top-1 agreement
with the float32 model (classifiers) and NaN/inf counts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import FoldError
from ..fold_math import Affine, batch_norm_affine
from ..torch_export.ops import Norm, module_path, parse_layer, parse_norm
from .emulator import EmulationResult, Emulator
from .errors import TensorError, json_float, measure
from .graph import layer_kind, lifted_tensor, lifted_tensors, running_stats_norm
from .profiles import FP16_MAX, get_profile
from .risk import QNN_EPS, NormStats, Risk, judge, measure_intermediates, predict


@dataclass
class NormAudit:
    """One batch normalization of the unfolded program (``node`` is its graph node name)."""

    node: str
    name: str
    channels: int
    eps: float
    scale_min: float
    scale_max: float
    kappa: float
    kappa_channel: int
    input_max_abs: float
    headroom: float  # the smallest fp16 headroom of any intermediate, measured (ref and emulated) or predicted
    folded: bool
    fold: str  # "folded into <layer> (<pattern>)" or the reason it was skipped
    runtime_scale_max: float | None = None  # max |scale| with the bn_eps override
    runtime_kappa: float | None = None  # kappa with the bn_eps override
    risk: Risk | None = None
    row: str | None = None  # the layer row that measures it (table name)

    @property
    def verdict(self) -> str:
        return self.risk.verdict if self.risk is not None else "unknown"

    def to_dict(self) -> dict:
        out = {k: json_float(v) if isinstance(v, float) else v for k, v in self.__dict__.items() if k != "risk"}
        out["risk"] = None if self.risk is None else self.risk.to_dict()
        return out


@dataclass
class LayerAudit:
    """One layer's output: a conv / linear / matmul (after the batch norm, or the chain folded into
    it, that follows), or a standalone batch norm.  ``norm`` is the node name of that batch norm
    (or of the chain's first step).  ``folded`` measures the same tensor in the folded program,
    found by node identity; None when the folded program no longer holds it."""

    name: str
    kind: str
    norm: str | None
    unfolded: TensorError
    folded: TensorError | None
    label: str = ""  # module path, when the graph records one
    local_unfolded: TensorError | None = None  # the error this row adds by itself (inputs as emulated)
    local_folded: TensorError | None = None
    norms: tuple = ()  # node names of the batch norms this row measures through

    @property
    def title(self) -> str:
        """The row's name in the table and the plot."""
        return self.label or self.name

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "label": self.label,
            "kind": self.kind,
            "norm": self.norm,
            "norms": list(self.norms),
            "cumulative": {
                "unfolded": self.unfolded.to_dict(),
                "folded": None if self.folded is None else self.folded.to_dict(),
            },
            "local": {
                "unfolded": None if self.local_unfolded is None else self.local_unfolded.to_dict(),
                "folded": None if self.local_folded is None else self.local_folded.to_dict(),
            },
        }


@dataclass
class EndToEnd:
    """The program's outputs over all batches, against the unfolded model's float64 outputs."""

    output: TensorError
    top1_agreement: float | None = None  # fraction of samples whose argmax matches the float32 model
    accuracy: float | None = None  # fraction matching ``labels``, when given
    predictions: torch.Tensor | None = None

    def to_dict(self) -> dict:
        return {
            "output_sqnr_db": json_float(self.output.sqnr_db),
            "output_finite_sqnr_db": json_float(self.output.finite_sqnr_db),
            "output_max_abs_err": json_float(self.output.max_abs_err),
            "elements": self.output.count,
            "nan": self.output.nan,
            "inf": self.output.inf,
            "nonfinite_share": self.output.nonfinite_share,
            "top1_agreement": self.top1_agreement,
            "accuracy": self.accuracy,
        }


@dataclass
class AuditReport:
    profile: str
    bn_eps: float | None
    samples: int
    batches: int
    norms: list[NormAudit]
    layers: list[LayerAudit]
    unfolded: EndToEnd
    folded: EndToEnd | None
    fp32_accuracy: float | None = None
    fold_report: Any = None
    errors: dict[str, dict[str, TensorError]] = field(default_factory=dict)  # every tensor, per program
    name: str = "model"
    random_inputs: bool = False  # the batches were random: top-1 agreement says little

    def worst_layers(self, n: int = 3, which: str = "unfolded", local: bool = False) -> list[LayerAudit]:
        """The ``n`` layers with the lowest SQNR in the ``which`` program (NaN/inf first); ``local``: by the
        error each layer adds by itself instead of the cumulative one."""
        attr = ("local_" if local else "") + which
        rows = [r for r in self.layers if getattr(r, attr) is not None]
        return sorted(rows, key=lambda r: (-getattr(r, attr).nonfinite, _sort_db(getattr(r, attr).sqnr_db)))[:n]

    def advice(self) -> list[str]:
        """The closing "what to do" lines (see :func:`bnfold.numerics.advice.advice`)."""
        from .advice import advice

        return advice(self)

    def to_dict(self) -> dict:
        return {
            "model": self.name,
            "profile": self.profile,
            "bn_eps": self.bn_eps,
            "random_inputs": self.random_inputs,
            "what_to_do": self.advice(),
            "samples": self.samples,
            "batches": self.batches,
            "fp32_accuracy": self.fp32_accuracy,
            "end_to_end": {"unfolded": self.unfolded.to_dict(), "folded": self.folded and self.folded.to_dict()},
            "normalizations": [n.to_dict() for n in self.norms],
            "layers": [r.to_dict() for r in self.layers],
            "fold_report": None if self.fold_report is None else self.fold_report.to_dict(),
            "tensors": {prog: [e.to_dict() for e in errs.values()] for prog, errs in self.errors.items()},
        }

    def table(self) -> str:
        from .table import audit_table

        return audit_table(self)

    def plot(self, path, worst: int = 25) -> None:
        """Write the SQNR chart (see :func:`bnfold.numerics.plot.plot_reports`)."""
        from .plot import plot_reports

        plot_reports([self], path, worst=worst)

    def __str__(self) -> str:
        return self.table()


def _sort_db(db: float) -> float:
    return -1e9 if math.isnan(db) else db


# -- running it ------------------------------------------------------------------------------------


def _as_batches(inputs) -> list[tuple]:
    if isinstance(inputs, torch.Tensor):
        return [(inputs,)]
    if isinstance(inputs, tuple):
        return [inputs]
    batches = list(inputs)
    if not batches:
        raise ValueError("audit needs at least one batch of inputs")
    return [b if isinstance(b, tuple) else tuple(b) if isinstance(b, list) else (b,) for b in batches]


def _export(module: torch.nn.Module, batches: list[tuple]) -> torch.export.ExportedProgram:
    """Export ``module`` in eval mode; the batch dimension is dynamic when batch sizes differ."""
    sizes = {b[0].shape[0] for b in batches if b and isinstance(b[0], torch.Tensor)}
    dynamic = None
    if len(sizes) > 1:
        dim = torch.export.Dim("batch")
        dynamic = tuple({0: dim} if isinstance(a, torch.Tensor) else None for a in batches[0])
    was_training = module.training
    module.eval()
    try:
        return torch.export.export(module, batches[0], dynamic_shapes=dynamic)
    finally:
        module.train(was_training)


# -- normalizations --------------------------------------------------------------------------------


def _fold_status(fold_report) -> dict[str, tuple[bool, str, str]]:
    """``{norm node name: (folded, fold column text, module path)}`` from the fold report."""
    status = {}
    if fold_report is not None:
        for f in fold_report.folded:
            status[f.node] = (True, f"folded into {f.into} ({f.pattern}, {f.side} side)", f.norm)
        for s in fold_report.skipped:
            status[s.node] = (False, f"skipped: {s.reason}", s.norm)
    return status


def _affine_or_none(mean, var, eps: float, weight=None) -> Affine | None:
    """``fold_math.batch_norm_affine``, or None where it refuses the statistics (NaN/inf, var + eps <= 0)."""
    try:
        return batch_norm_affine(mean, var, eps, weight)
    except FoldError:
        return None


def _max_abs(t: torch.Tensor | None) -> float:
    return float(t.abs().max()) if t is not None else math.nan


def _stats(norm: Norm, lifted: dict) -> NormStats | None:
    """The norm's constants, or None when its statistics (or gamma/beta) are computed in the graph."""
    mean, var = lifted_tensor(norm.mean, lifted), lifted_tensor(norm.var, lifted)
    if mean is None or var is None:
        return None
    gamma, beta = lifted_tensor(norm.weight, lifted), lifted_tensor(norm.bias, lifted)
    if (norm.weight is not None and gamma is None) or (norm.bias is not None and beta is None):
        return None
    f64 = lambda t: None if t is None else t.detach().to(torch.float64).flatten()  # noqa: E731
    layer = parse_layer(norm.input) if isinstance(norm.input, torch.fx.Node) else None
    layer_bias = lifted_tensor(layer.bias, lifted) if layer is not None else None
    if layer_bias is not None and layer_bias.numel() != mean.numel():
        layer_bias = None
    return NormStats(
        f64(mean), f64(var), f64(gamma), f64(beta), norm.eps, f64(layer_bias), rounded_input=layer is not None
    )


def _norm_numbers(norm: Norm, lifted: dict, bn_eps: float | None) -> dict | None:
    """``NormAudit``'s channels, ``|scale|`` range, kappa (at the model's eps and at ``bn_eps``) and the
    bn_eps scale for ``norm``, from ``fold_math.batch_norm_affine``; None when its statistics are computed
    in the graph.  Numbers it cannot give (undefined statistics, a gamma computed in the graph) are NaN.

    kappa is the shift of the bare normalization (gamma = 1, beta = 0): ``|mean| / sqrt(var + eps)``.
    """
    mean, var = lifted_tensor(norm.mean, lifted), lifted_tensor(norm.var, lifted)
    if mean is None or var is None:
        return None
    gamma = lifted_tensor(norm.weight, lifted)
    gamma_known = norm.weight is None or gamma is not None
    bare = _affine_or_none(mean, var, norm.eps)
    full = _affine_or_none(mean, var, norm.eps, gamma) if gamma_known else None
    runtime = _affine_or_none(mean, var, bn_eps, gamma) if gamma_known and bn_eps is not None else None
    bare_rt = _affine_or_none(mean, var, bn_eps) if bn_eps is not None else None
    scale = full.scale.abs() if full is not None else None
    kappa = bare.shift.abs() if bare is not None else None
    return {
        "channels": mean.numel(),
        "scale_min": float(scale.min()) if scale is not None else math.nan,
        "scale_max": _max_abs(scale),
        "kappa": _max_abs(kappa),
        "kappa_channel": int(kappa.argmax()) if kappa is not None else -1,
        "runtime_scale_max": None if bn_eps is None else _max_abs(runtime.scale if runtime is not None else None),
        "runtime_kappa": None if bn_eps is None else _max_abs(bare_rt.shift if bare_rt is not None else None),
    }


def _risk(stats: NormStats | None, prof, bn_eps, probe, row: LayerAudit | None, out_err) -> Risk | None:
    """Predicted and measured risk of one norm (see :mod:`bnfold.numerics.risk`)."""
    if stats is None:
        return None
    model = predict(stats, prof, stats.eps)
    runtime = predict(stats, prof, bn_eps) if bn_eps is not None else None
    what_if = predict(stats, prof, QNN_EPS) if bn_eps is None and prof.htp_batch_norm else None
    measured = measure_intermediates(stats, prof, stats.eps if bn_eps is None else bn_eps, probe) if probe else None
    if measured is not None:
        measured.output_nonfinite = out_err.nonfinite if out_err is not None else 0
        if row is not None and row.local_unfolded is not None and row.local_folded is not None:
            a, b = row.local_unfolded.sqnr_db, row.local_folded.sqnr_db
            if math.isfinite(a) and math.isfinite(b):
                measured.loss_db = b - a
    return judge(Risk(model, runtime, what_if, measured))


def _norms(ep, unfolded: EmulationResult, fold_report, bn_eps, prof, layers: list[LayerAudit]) -> list[NormAudit]:
    lifted, _ = lifted_tensors(ep)
    status = _fold_status(fold_report)
    row_of = {n: r for r in layers for n in r.norms}
    out = []
    for node in ep.graph_module.graph.nodes:
        norm = running_stats_norm(node)
        numbers = None if norm is None else _norm_numbers(norm, lifted, bn_eps)
        if numbers is None:
            continue  # not a norm, or statistics computed in the graph: nothing to read ahead of time
        src = norm.input.name if isinstance(norm.input, torch.fx.Node) else ""
        x_max = unfolded.errors[src].max_abs_ref if src in unfolded.errors else math.nan
        folded, fold, label = status.get(node.name, (False, "not audited (no fold report)", None))
        row = row_of.get(node.name)
        out_err = unfolded.errors.get(norm.output.name) if norm.output is not None else None
        risk = _risk(_stats(norm, lifted), prof, bn_eps, unfolded.probes.get(node.name), row, out_err)
        head = _smallest_headroom(risk, x_max)
        out.append(
            NormAudit(
                node=node.name,
                name=label or module_path(node),
                eps=norm.eps,
                input_max_abs=x_max,
                headroom=head,
                folded=folded,
                fold=fold,
                risk=risk,
                row=row.title if row is not None else None,
                **numbers,
            )
        )
    return out


def _smallest_headroom(risk: Risk | None, x_max: float) -> float:
    """The smallest headroom of any intermediate: measured (reference and emulated) and predicted."""
    found = []
    if risk is not None and risk.measured is not None:
        found += [risk.measured.headroom_reference, risk.measured.headroom_emulated]
    if risk is not None and risk.effective is not None:
        found.append(risk.effective.headroom)
    if not found:
        return FP16_MAX / x_max if x_max > 0 else math.inf
    return min(found)


# -- layers: which tensor each row measures, in each program ------------------------------------------


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


def _rows(ep, fold: _FoldMap | None) -> list[_Row]:
    """A row per layer (with the norm or chain after it) and per remaining eval-mode norm, in graph order."""
    nodes = list(ep.graph_module.graph.nodes)
    rows = []
    for node in nodes:
        kind = layer_kind(node)
        if kind is None:
            continue
        row = _chain_row(node, kind, fold) if fold is not None and node.name in fold.into_output else None
        rows.append(row or _plain_layer_row(node, kind, fold))
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


def _end_to_end(res: EmulationResult, ref_outputs: list, fp32_top1: list, labels: list | None) -> EndToEnd:
    total = None
    preds = []
    for outs, refs in zip(res.outputs, ref_outputs):
        for o, r in zip(outs, refs):
            if isinstance(r, torch.Tensor) and r.is_floating_point():
                m = measure("output", "output", o, r, exact_diff=True)
                if total is None:
                    total = m
                else:
                    total.merge(m)
        first = outs[0] if outs else None
        if isinstance(first, torch.Tensor) and first.dim() == 2 and first.shape[1] > 1:
            preds.append(first.argmax(1))
    e2e = EndToEnd(total or TensorError("output", "output", ()))
    if preds and len(preds) == len(fp32_top1):
        p = torch.cat(preds)
        e2e.predictions = p
        e2e.top1_agreement = float((p == torch.cat(fp32_top1)).double().mean())
        if labels is not None:
            e2e.accuracy = float((p == torch.cat(labels)).double().mean())
    return e2e


def _split_labels(labels, batches: list[tuple]) -> list[torch.Tensor] | None:
    if labels is None:
        return None
    if isinstance(labels, torch.Tensor):
        sizes = [b[0].shape[0] for b in batches]
        return list(torch.as_tensor(labels).split(sizes))
    return [torch.as_tensor(t) for t in labels]


def _stage(progress, name: str) -> None:
    """Tell ``progress`` that a stage begins, when it understands stages (``progress.stage(name)``)."""
    stage = getattr(progress, "stage", None)
    if callable(stage):
        stage(name)


def audit(
    model,
    inputs,
    profile: str = "fp16",
    bn_eps: float | None = None,
    progress: Callable[[int, int], None] | None = None,
    labels=None,
    fold: bool = True,
    name: str | None = None,
    random_inputs: bool = False,
) -> AuditReport:
    """Audit ``model`` (an ExportedProgram, an nn.Module exported here in eval mode, or an ONNX ModelProto
    traced with :func:`bnfold.numerics.onnx_program.onnx_program`) under ``profile``.

    ``inputs`` is a list of batches, each a tuple of forward arguments (a
    single tuple or tensor is one batch).  ``bn_eps`` replaces the eps of
    every standalone batch norm in the emulated runs (not in the float64
    reference, not in folding).  ``progress(done, total)`` is called after
    each emulated batch (and ``progress.stage(name)`` before folding and each
    emulation, when it has one).  ``labels`` (one tensor for all samples, or
    one per batch) adds accuracy to the end-to-end numbers of classifiers.
    With ``fold=False`` only the unfolded program is audited.  ``name`` names
    the model in the table and plot; ``random_inputs`` marks the batches as
    random (top-1 agreement on them is then flagged as weak evidence).

    A program whose batch norms run in training mode is refused (ValueError):
    its numbers would change from run to run and nothing in it folds.
    """
    batches = _as_batches(inputs)
    prof = get_profile(profile)
    ep = model if isinstance(model, torch.export.ExportedProgram) else None
    if ep is None and type(model).__name__ == "ModelProto":
        from .onnx_program import onnx_program

        _stage(progress, "convert")
        ep = onnx_program(model, batches[0])
    if ep is None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(
                f"cannot audit a {type(model).__name__}: pass an ExportedProgram, an nn.Module or an ONNX ModelProto"
            )
        name = name or type(model).__name__
        ep = _export(model, batches)
    from ..checks import training_norms

    training = training_norms(ep)
    if training:
        raise ValueError(
            f"the program has batch norms in training mode ({', '.join(training[:3])}"
            f"{', ...' if len(training) > 3 else ''}); call model.eval() before torch.export"
        )
    from ..io.cost import audit_plan  # the cost check before anything runs (see bnfold.io.cost)

    audit_plan(ep, batches, runs=3 if fold else 2, name=name)
    fold_result = None
    if fold:
        from ..api import fold as bnfold_fold

        _stage(progress, "fold")
        fold_result = bnfold_fold(ep)
    fmap = _FoldMap.of(fold_result.report, fold_result.model) if fold_result is not None else None
    rows = _rows(ep, fmap)
    total = len(batches) * (2 if fold_result is not None else 1)
    done = 0
    forward = ep.module()
    fp32_top1 = []
    unfolded = EmulationResult(prof.name)
    _stage(progress, "emulate unfolded")
    emu = Emulator(ep, prof, bn_eps, _segments(ep.graph_module.graph, [(r.name, r.name, r.output) for r in rows]))
    on_node = getattr(progress, "node", None)
    for batch in batches:
        unfolded.add(emu.run(*batch, on_node=on_node))
        with torch.no_grad():
            out = forward(*batch)
        first = out[0] if isinstance(out, (tuple, list)) else out
        if isinstance(first, torch.Tensor) and first.dim() == 2 and first.shape[1] > 1:
            fp32_top1.append(first.argmax(1))
        done += 1
        if progress is not None:
            progress(done, total)
    folded = None
    if fold_result is not None:
        folded = EmulationResult(prof.name)
        _stage(progress, "emulate folded")
        fgraph = fold_result.model.graph_module.graph
        fseg = _segments(fgraph, [(r.name, r.name, r.folded) for r in rows if r.folded is not None])
        femu = Emulator(fold_result.model, prof, bn_eps, fseg)
        for batch in batches:
            folded.add(femu.run(*batch, on_node=on_node))
            done += 1
            if progress is not None:
                progress(done, total)
    label_batches = _split_labels(labels, batches)
    fp32_accuracy = None
    if label_batches is not None and fp32_top1:
        fp32_accuracy = float((torch.cat(fp32_top1) == torch.cat(label_batches)).double().mean())
    samples = sum(b[0].shape[0] if b and isinstance(b[0], torch.Tensor) and b[0].dim() else 1 for b in batches)
    errors = {"unfolded": unfolded.errors}
    if folded is not None:
        errors["folded"] = folded.errors
    layers = _layers(rows, unfolded, folded)
    return AuditReport(
        profile=prof.name,
        bn_eps=bn_eps,
        samples=samples,
        batches=len(batches),
        norms=_norms(ep, unfolded, fold_result.report if fold_result else None, bn_eps, prof, layers),
        layers=layers,
        unfolded=_end_to_end(unfolded, unfolded.reference, fp32_top1, label_batches),
        folded=None if folded is None else _end_to_end(folded, unfolded.reference, fp32_top1, label_batches),
        fp32_accuracy=fp32_accuracy,
        fold_report=fold_result.report if fold_result else None,
        errors=errors,
        name=name or "model",
        random_inputs=random_inputs,
    )
