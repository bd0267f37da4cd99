"""The ONNX audit: the model and the folded ONNX that ``bnfold fold`` writes, each emulated.

``bnfold.fold`` (the ONNX frontend) folds the model; both graphs run in
:class:`~bnfold.numerics.onnx_emulator.OnnxEmulator` under the profile.  Layers pair through
the fold report and the value names: the fold keeps a layer's node name and writes a chain
folded into the layer's output under the chain's output name, so a row measures value ``T``
of the unfolded model (the chain's result) against value ``T`` of the folded one (the layer's
output now).  The folded model is measured against the unfolded model's float64 run: the
numbers say how far what ships is from the model that was trained.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import onnx
import torch

from .audit_report import AuditReport, LayerAudit, NormAudit
from .batches import as_batches
from .emulator import EmulationResult
from .end_to_end import _end_to_end, _split_labels
from .norm_rows import _fold_status, _risk, _smallest_headroom, norm_numbers
from .onnx_emulator import OnnxEmulator, OnnxNorm, constants, input_shapes_of, node_names
from .onnx_ops import LAYER_OPS
from .profiles import get_profile
from .risk import NormStats


def _stage(progress, name: str) -> None:
    stage = getattr(progress, "stage", None)
    if callable(stage):
        stage(name)


def random_batches(model: onnx.ModelProto, input_shapes: dict | None, n: int = 1, seed: int = 0) -> list[tuple]:
    """``n`` batches of standard-normal inputs shaped by :func:`input_shapes_of` (an open batch dim is 1)."""
    shapes = input_shapes_of(model, input_shapes)
    for name, dims in shapes.items():
        if any(d is None for d in dims[1:]):
            shown = ",".join("?" if d is None else str(d) for d in dims)
            raise ValueError(
                f"input {name!r} has open dims [{shown}]; give its shape (input_shapes={{{name!r}: (1, ...)}}, "
                f"--input-shape {name}:1,...) or --inputs"
            )
    g = torch.Generator().manual_seed(seed)
    return [
        tuple(torch.randn([1 if d is None else d for d in dims], generator=g) for dims in shapes.values())
        for _ in range(n)
    ]


def check_batches(model: onnx.ModelProto, batches: list[tuple], input_shapes: dict | None) -> None:
    """Each batch fits the model's inputs (their fixed dims and ``input_shapes``)."""
    shapes = input_shapes_of(model, input_shapes)
    for b in batches:
        if len(b) != len(shapes):
            raise ValueError(f"the model takes {len(shapes)} input(s) ({', '.join(shapes)}), a batch holds {len(b)}")
        for (name, dims), x in zip(shapes.items(), b):
            got = list(torch.as_tensor(x).shape)
            if len(got) != len(dims) or any(d is not None and d != g for d, g in zip(dims, got)):
                shown = ["?" if d is None else d for d in dims]
                raise ValueError(f"input {name!r} takes shape {shown}; a batch holds {got}")


class _Graph:
    """Who produces and who reads each value of an ONNX graph."""

    def __init__(self, model: onnx.ModelProto):
        self.nodes = list(model.graph.node)
        self.names = node_names(model)
        self.by_name = dict(zip(self.names, self.nodes))
        self.order = {n: i for i, n in enumerate(self.names)}
        self.producer = {o: name for name, n in zip(self.names, self.nodes) for o in n.output if o}
        self.readers: dict[str, list[str]] = {}
        for name, n in zip(self.names, self.nodes):
            for v in n.input:
                self.readers.setdefault(v, []).append(name)
        self.values = set(self.producer) | {i.name for i in model.graph.input}

    def between(self, start: str, value: str) -> list[str]:
        """The values on some path from node ``start``'s outputs to ``value`` (both ends included)."""
        end = self.producer.get(value)
        if end is None or start not in self.by_name:
            return []
        first = self.order[start]
        ancestors, todo = {end}, [end]
        while todo:
            for v in self.by_name[todo.pop()].input:
                p = self.producer.get(v)
                if p is not None and p not in ancestors and self.order[p] >= first:
                    ancestors.add(p)
                    todo.append(p)
        kept: set[str] = set()
        for p in sorted(ancestors, key=self.order.__getitem__):
            if p == start or any(self.producer.get(v) in kept for v in self.by_name[p].input):
                kept.add(p)
        return [o for p in kept for o in self.by_name[p].output if o]


def _rows(g: _Graph, norms: dict[str, OnnxNorm], report, folded: _Graph | None) -> list[dict]:
    """A row per layer (with the chain folded into its output, or the unfolded norm that is its only
    reader) and per remaining norm, in graph order: ``{name, kind, norm, output, folded, merged}``."""
    into_output: dict[str, list] = {}
    if report is not None:
        for f in report.folded:
            if f.side == "output":
                into_output.setdefault(f.into_node or f.into, []).append(f.node)
    rows, merged_all = [], set()
    for name, node in zip(g.names, g.nodes):
        kind = LAYER_OPS.get(node.op_type)
        if kind is None or not node.output:
            continue
        out, merged, norm, ffold = node.output[0], set(), None, None
        if name in into_output and folded is not None and name in folded.by_name:
            out = ffold = folded.by_name[name].output[0]  # the chain's result, under its own name in both
            steps = set(into_output[name])
            merged = {s for s in steps if s in norms}
            norm = min(steps, key=lambda s: g.order.get(s, 0))
            if out not in g.values:
                out, ffold = node.output[0], None
        else:
            readers = g.readers.get(out, [])
            if len(readers) == 1 and readers[0] in norms and norms[readers[0]].input == out:
                norm = readers[0]
                merged = {norm}
                out = norms[norm].output
            if folded is not None and out in folded.values and name not in into_output:
                ffold = out
        merged_all |= merged
        rows.append({"name": name, "kind": kind, "norm": norm, "output": out, "folded": ffold, "merged": merged})
    for name, n in norms.items():
        if name not in merged_all:
            ffold = n.output if folded is not None and n.output in folded.values else None
            row = {"name": name, "kind": "batch_norm", "norm": name, "output": n.output, "folded": ffold}
            rows.append(dict(row, merged={name}))
    return sorted(rows, key=lambda r: g.order[r["name"]])


def _segments(g: _Graph, pairs) -> dict[str, str]:
    seg: dict[str, str] = {}
    for row, start, value in pairs:
        for v in g.between(start, value):
            seg.setdefault(v, row)
    return seg


def _layer_rows(rows, unfolded: EmulationResult, folded: EmulationResult | None) -> list[LayerAudit]:
    out = []
    for r in rows:
        err = unfolded.errors.get(r["output"])
        if err is None:
            continue
        fv = r["folded"]
        ferr = folded.errors.get(fv) if folded is not None and fv is not None else None
        lf = folded.local.get(fv) if folded is not None and fv is not None else None
        norms = tuple(sorted(r["merged"] | ({r["norm"]} if r["norm"] else set())))
        out.append(
            LayerAudit(
                r["name"], r["kind"], r["norm"], err, ferr, r["name"], unfolded.local.get(r["output"]), lf, norms
            )
        )
    return out


def _norm_rows(g, norms, consts, unfolded, report, bn_eps, prof, layers) -> list[NormAudit]:
    status = _fold_status(report)
    row_of = {n: r for r in layers for n in r.norms}
    out = []
    for name, n in norms.items():
        numbers = norm_numbers(n.mean, n.var, n.gamma, True, n.eps, bn_eps)
        x_err = unfolded.errors.get(n.input)
        x_max = x_err.max_abs_ref if x_err is not None else math.nan
        producer = g.by_name.get(g.producer.get(n.input, ""))
        layer = producer is not None and producer.op_type in LAYER_OPS
        bias = None
        if layer and producer.op_type in ("Conv", "ConvTranspose") and len(producer.input) > 2:
            b = consts.get(producer.input[2])
            bias = None if b is None else torch.as_tensor(b, dtype=torch.float64).flatten()
            if bias is not None and bias.numel() != n.mean.numel():
                bias = None
        stats = NormStats(n.mean, n.var, n.gamma, n.beta, n.eps, bias, rounded_input=layer)
        folded, fold, label = status.get(name, (False, "not audited (no fold report)", None))
        row = row_of.get(name)
        risk = _risk(stats, prof, bn_eps, unfolded.probes.get(name), row, unfolded.errors.get(n.output))
        out.append(
            NormAudit(
                node=name,
                name=label or name,
                eps=n.eps,
                input_max_abs=x_max,
                headroom=_smallest_headroom(risk, x_max),
                folded=folded,
                fold=fold,
                risk=risk,
                row=row.title if row is not None else None,
                **numbers,
            )
        )
    return out


def _execute(emu: OnnxEmulator, batches, result: EmulationResult, progress, **kw) -> list[dict]:
    """Run ``emu`` on every batch into ``result`` (the one place where the ONNX audit executes a model);
    ``kw`` goes to :meth:`OnnxEmulator.run` (a per-batch ``against`` list is taken apart here).
    Returns the reference values each batch kept."""
    against = kw.pop("against", None)
    on_node = getattr(progress, "node", None)
    kept = []
    for done, batch in enumerate(batches, 1):
        res, k = emu.run(*batch, against=None if against is None else against[done - 1], on_node=on_node, **kw)
        result.add(res)
        kept.append(k)
        if progress is not None:
            progress(done, len(batches))
    return kept


def audit_onnx(
    model: onnx.ModelProto,
    inputs=None,
    profile: str = "fp16",
    bn_eps: float | None = None,
    progress: Callable[[int, int], None] | None = None,
    labels=None,
    fold: bool = True,
    name: str | None = None,
    random_inputs: bool = False,
    input_shapes: dict | None = None,
    runtime: str | None = None,
) -> AuditReport:
    """Audit an ONNX model and the ONNX ``bnfold.fold`` writes for it (see :func:`bnfold.numerics.audit`)."""

    prof = get_profile(profile)
    if inputs is None:
        batches = random_batches(model, input_shapes)
    else:
        batches = as_batches(inputs)
        check_batches(model, batches, input_shapes)
    from ..io.cost import onnx_run_plan  # the cost check before anything runs (see bnfold.io.cost)

    onnx_run_plan(model, batches, name or "the model")
    fold_result = None
    if fold:
        from ..api import fold as bnfold_fold

        _stage(progress, "fold")
        fold_result = bnfold_fold(model)
    report = fold_result.report if fold_result is not None else None
    g = _Graph(model)
    consts = constants(model)
    fg = _Graph(fold_result.model) if fold_result is not None else None
    emu = OnnxEmulator(model, prof, bn_eps)
    rows = _rows(g, emu.norms, report, fg)
    emu.segments = _segments(g, [(r["name"], r["name"], r["output"]) for r in rows])
    unfolded = EmulationResult(prof.name, not_emulated=list(emu.not_emulated))
    _stage(progress, "emulate unfolded")
    keep = frozenset(fg.values) if fg is not None else frozenset()
    refs = _execute(emu, batches, unfolded, progress, keep_reference=keep)
    folded = None
    if fold_result is not None:
        _stage(progress, "emulate folded")
        fseg = _segments(fg, [(r["name"], r["name"], r["folded"]) for r in rows if r["folded"] is not None])
        femu = OnnxEmulator(fold_result.model, prof, bn_eps, fseg)
        folded = EmulationResult(prof.name, not_emulated=list(femu.not_emulated))
        _execute(femu, batches, folded, progress, reference=False, against=refs)
    del refs
    label_batches = _split_labels(labels, batches)
    top1 = _top1(unfolded.reference)
    layers = _layer_rows(rows, unfolded, folded)
    errors = {"unfolded": unfolded.errors}
    if folded is not None:
        errors["folded"] = folded.errors
    rep = AuditReport(
        profile=prof.name,
        bn_eps=bn_eps,
        samples=sum(int(b[0].shape[0]) if b and torch.as_tensor(b[0]).dim() else 1 for b in batches),
        batches=len(batches),
        norms=_norm_rows(g, emu.norms, consts, unfolded, report, bn_eps, prof, layers),
        layers=layers,
        unfolded=_end_to_end(unfolded, unfolded.reference, top1, label_batches),
        folded=None if folded is None else _end_to_end(folded, unfolded.reference, top1, label_batches),
        fp32_accuracy=None,
        fold_report=report,
        errors=errors,
        name=name or (model.graph.name or "model"),
        random_inputs=random_inputs,
    )
    if label_batches is not None and top1:
        rep.fp32_accuracy = float((torch.cat(top1) == torch.cat(label_batches)).double().mean())
    if runtime is not None:
        from .runtimes import runtime_run

        _stage(progress, f"run {runtime}")
        rep.runtime = runtime_run(
            runtime, model, fold_result.model if fold_result is not None else None, batches, unfolded.reference
        )
    return rep


def _top1(reference: list) -> list:
    """The float64 model's top-1 per batch (classifiers: a first output of shape [N, classes])."""
    out = []
    for outs in reference:
        first = outs[0] if outs else None
        if isinstance(first, torch.Tensor) and first.dim() == 2 and first.shape[1] > 1:
            out.append(first.argmax(1))
    return out if len(out) == len(reference) else []
