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
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .emulator import Emulator, EmulationResult
from .errors import TensorError, json_float, measure
from .graph import batch_norm_args, batch_norm_output, layer_kind, placeholder_values, tensor_of
from .profiles import FP16_MAX, get_profile


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
    headroom: float
    folded: bool
    fold: str  # "folded into <layer> (<pattern>)" or the reason it was skipped
    runtime_scale_max: float | None = None  # max |scale| with the bn_eps override

    def to_dict(self) -> dict:
        return {k: json_float(v) if isinstance(v, float) else v for k, v in self.__dict__.items()}


@dataclass
class LayerAudit:
    """One layer's output: a conv / linear (after its batch norm when one follows), or a standalone batch norm."""

    name: str
    kind: str
    norm: str | None
    unfolded: TensorError
    folded: TensorError | None
    label: str = ""  # module path, when the graph records one

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "label": self.label,
            "kind": self.kind,
            "norm": self.norm,
            "unfolded": self.unfolded.to_dict(),
            "folded": None if self.folded is None else self.folded.to_dict(),
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
            "output_max_abs_err": json_float(self.output.max_abs_err),
            "nan": self.output.nan,
            "inf": self.output.inf,
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

    def worst_layers(self, n: int = 3, which: str = "unfolded") -> list[LayerAudit]:
        """The ``n`` layers with the lowest SQNR in the ``which`` program (NaN/inf first)."""
        rows = [r for r in self.layers if getattr(r, which) is not None]
        return sorted(rows, key=lambda r: (-getattr(r, which).nonfinite, _sort_db(getattr(r, which).sqnr_db)))[:n]

    def to_dict(self) -> dict:
        return {
            "profile": self.profile,
            "bn_eps": self.bn_eps,
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

    def plot(self, path) -> None:
        """Write the per-layer SQNR chart (unfolded vs folded) as a PNG."""
        from .plot import plot_reports

        plot_reports([self], path)

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


def _module_path(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    if stack:
        path = list(stack.values())[-1][0]
        return path.replace("L['self'].", "").replace("L__self___", "") or node.name
    return node.name


def _norms(ep, unfolded: EmulationResult, fold_report, bn_eps) -> list[NormAudit]:
    lifted, _ = placeholder_values(ep)
    status = {}
    if fold_report is not None:
        for f in fold_report.folded:
            status[f.node] = (True, f"folded into {f.into} ({f.pattern}, {f.side} side)", f.norm)
        for s in fold_report.skipped:
            status[s.node] = (False, f"skipped: {s.reason}", s.norm)
    out = []
    for node in ep.graph_module.graph.nodes:
        bn = batch_norm_args(node)
        if bn is None:
            continue
        mean, var = tensor_of(bn.mean, lifted), tensor_of(bn.var, lifted)
        if mean is None or var is None:
            continue  # statistics computed in the graph: nothing to read ahead of time
        mean, var = mean.double(), var.double()
        gamma = tensor_of(bn.weight, lifted)
        gamma = torch.ones_like(var) if gamma is None else gamma.double()
        std = torch.sqrt(var + bn.eps)
        scale = (gamma / std).abs()
        kappa = mean.abs() / std
        src = bn.input.name if isinstance(bn.input, torch.fx.Node) else ""
        x_max = unfolded.errors[src].max_abs_ref if src in unfolded.errors else math.nan
        folded, fold, label = status.get(node.name, (False, "not audited (no fold report)", None))
        runtime = None
        if bn_eps is not None:
            runtime = float((gamma / torch.sqrt(var + bn_eps)).abs().max())
        out.append(NormAudit(
            node=node.name,
            name=label or _module_path(node),
            channels=mean.numel(),
            eps=bn.eps,
            scale_min=float(scale.min()),
            scale_max=float(scale.max()),
            kappa=float(kappa.max()),
            kappa_channel=int(kappa.argmax()),
            input_max_abs=x_max,
            headroom=FP16_MAX / x_max if x_max > 0 else math.inf,
            folded=folded,
            fold=fold,
            runtime_scale_max=runtime,
        ))
    return out


def _layer_outputs(ep) -> list[tuple[str, str, str | None, str, str]]:
    """``(name, kind, norm node name, output node name, label)`` for each layer, in graph order."""
    rows, used_norms = [], set()
    nodes = list(ep.graph_module.graph.nodes)
    for node in nodes:
        kind = layer_kind(node)
        if kind is None:
            continue
        users = list(node.users)
        norm = users[0] if len(users) == 1 and batch_norm_args(users[0]) is not None else None
        if norm is not None and batch_norm_args(norm).input is node:
            used_norms.add(norm)
            rows.append((node.name, kind, norm.name, batch_norm_output(norm).name, _module_path(node)))
        else:
            rows.append((node.name, kind, None, node.name, _module_path(node)))
    for node in nodes:
        if batch_norm_args(node) is not None and node not in used_norms:
            rows.append((node.name, "batch_norm", node.name, batch_norm_output(node).name, _module_path(node)))
    order = {n.name: i for i, n in enumerate(nodes)}
    return sorted(rows, key=lambda r: order[r[0]])


def _layers(ep, fep, unfolded: EmulationResult, folded: EmulationResult | None) -> list[LayerAudit]:
    rows_u = _layer_outputs(ep)
    rows_f = _layer_outputs(fep) if fep is not None else []
    # Match the k-th conv/linear of the unfolded program with the k-th of the folded one when
    # both programs hold the same sequence of layer kinds (folding removes norms, never layers);
    # otherwise, and for standalone norms, match by node name.
    lay_u = [r for r in rows_u if r[1] != "batch_norm"]
    lay_f = [r for r in rows_f if r[1] != "batch_norm"]
    match = {}
    if [r[1] for r in lay_u] == [r[1] for r in lay_f]:
        match = {u[0]: f for u, f in zip(lay_u, lay_f)}
    by_name = {r[0]: r for r in rows_f}
    out = []
    for name, kind, norm, out_node, label in rows_u:
        f = match.get(name) if kind != "batch_norm" else None
        f = f or by_name.get(name)
        fe = folded.errors.get(f[3]) if (f is not None and folded is not None) else None
        out.append(LayerAudit(name, kind, norm, unfolded.errors[out_node], fe, label))
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


def audit(
    model,
    inputs,
    profile: str = "fp16",
    bn_eps: float | None = None,
    progress: Callable[[int, int], None] | None = None,
    labels=None,
    fold: bool = True,
) -> AuditReport:
    """Audit ``model`` (an ExportedProgram, or an nn.Module exported here in eval mode) under ``profile``.

    ``inputs`` is a list of batches, each a tuple of forward arguments (a
    single tuple or tensor is one batch).  ``bn_eps`` replaces the eps of
    every standalone batch norm in the emulated runs (not in the float64
    reference, not in folding).  ``progress(done, total)`` is called after
    each emulated batch.  ``labels`` (one tensor for all samples, or one per
    batch) adds accuracy to the end-to-end numbers of classifiers.  With
    ``fold=False`` only the unfolded program is audited.
    """
    batches = _as_batches(inputs)
    prof = get_profile(profile)
    ep = model if isinstance(model, torch.export.ExportedProgram) else None
    if ep is None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"cannot audit a {type(model).__name__}: pass an ExportedProgram or an nn.Module")
        ep = _export(model, batches)
    fold_result = None
    if fold:
        from ..api import fold as bnfold_fold

        fold_result = bnfold_fold(ep)
    total = len(batches) * (2 if fold_result is not None else 1)
    done = 0
    forward = ep.module()
    fp32_top1 = []
    unfolded = EmulationResult(prof.name)
    emu = Emulator(ep, prof, bn_eps)
    for batch in batches:
        unfolded.add(emu.run(*batch))
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
        femu = Emulator(fold_result.model, prof, bn_eps)
        for batch in batches:
            folded.add(femu.run(*batch))
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
    return AuditReport(
        profile=prof.name,
        bn_eps=bn_eps,
        samples=samples,
        batches=len(batches),
        norms=_norms(ep, unfolded, fold_result.report if fold_result else None, bn_eps),
        layers=_layers(ep, fold_result.model if fold_result else None, unfolded, folded),
        unfolded=_end_to_end(unfolded, unfolded.reference, fp32_top1, label_batches),
        folded=None if folded is None else _end_to_end(folded, unfolded.reference, fp32_top1, label_batches),
        fp32_accuracy=fp32_accuracy,
        fold_report=fold_result.report if fold_result else None,
        errors=errors,
    )
