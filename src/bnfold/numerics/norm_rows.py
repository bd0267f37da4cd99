"""The normalization rows of the audit: each batch norm's numbers (scale range, kappa, headroom), its
fold status from the fold report, and its risk (:mod:`bnfold.numerics.risk`), predicted from the
statistics and confirmed by the emulated run.  The numbers are read from plain tensors, so the
torch-program audit and the ONNX audit share them."""

from __future__ import annotations

import math

import torch

from ..errors import FoldError
from ..fold_math import Affine, batch_norm_affine
from .audit_report import LayerAudit, NormAudit
from .profiles import FP16_MAX
from .risk import QNN_EPS, NormStats, Risk, judge, measure_intermediates, predict
from .runner import EmulationResult, Program


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


def norm_numbers(mean, var, gamma, gamma_known: bool, eps: float, bn_eps: float | None) -> dict:
    """``NormAudit``'s channels, ``|scale|`` range, kappa (at the model's eps and at ``bn_eps``) and the
    bn_eps scale, from ``fold_math.batch_norm_affine`` (``gamma`` None: 1, or unknown if not ``gamma_known``).
    Numbers it cannot give (undefined statistics, a gamma computed in the graph) are NaN.  kappa is the
    shift of the bare normalization (gamma = 1, beta = 0): ``|mean| / sqrt(var + eps)``."""
    bare = _affine_or_none(mean, var, eps)
    full = _affine_or_none(mean, var, eps, gamma) if gamma_known else None
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


def _norms(prog: Program, unfolded: EmulationResult, fold_report, bn_eps, prof, layers: list[LayerAudit]):
    """A :class:`NormAudit` per eval-mode batch norm of ``prog`` whose statistics are constants."""
    consts, producer = prog.constants, {v: s for s in prog.steps for v in s.outs if v}
    f64 = lambda v: None if v is None else consts[v].to(torch.float64).flatten()  # noqa: E731
    status = _fold_status(fold_report)
    row_of = {n: r for r in layers for n in r.norms}
    out = []
    for step in prog.steps:
        norm = step.norm
        if norm is None or norm.params[2] not in consts or norm.params[3] not in consts:
            continue  # statistics computed in the graph: nothing to read ahead of time
        weight, bias, mean, var = (p if p is None or p in consts else "?" for p in norm.params)
        gamma = f64(weight) if weight != "?" else None
        numbers = norm_numbers(f64(mean), f64(var), gamma, weight != "?", norm.eps, bn_eps)
        x_err = unfolded.errors.get(norm.input)
        x_max = x_err.max_abs_ref if x_err is not None else math.nan
        stats = None
        if "?" not in (weight, bias):
            layer = producer.get(norm.input)
            layer = layer if layer is not None and layer.layer is not None else None
            layer_bias = f64(layer.bias) if layer is not None and layer.bias in consts else None
            if layer_bias is not None and layer_bias.numel() != numbers["channels"]:
                layer_bias = None
            rounded = layer is not None
            stats = NormStats(f64(mean), f64(var), gamma, f64(bias), norm.eps, layer_bias, rounded_input=rounded)
        folded, fold, label = status.get(step.name, (False, "not audited (no fold report)", None))
        row = row_of.get(step.name)
        out_err = unfolded.errors.get(norm.output) if norm.output else None
        risk = _risk(stats, prof, bn_eps, unfolded.probes.get(step.name), row, out_err)
        out.append(
            NormAudit(
                node=step.name,
                name=label or step.label or step.name,
                eps=norm.eps,
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
