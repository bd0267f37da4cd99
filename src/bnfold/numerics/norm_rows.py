"""The normalization rows of the audit: each batch norm's numbers (scale range, kappa, headroom), its
fold status from the fold report, and its risk (:mod:`bnfold.numerics.risk`), predicted from the
statistics and confirmed by the emulated run.  The numbers are read from plain tensors, so the
torch-program audit and the ONNX audit share them."""

from __future__ import annotations

import math

import torch

from ..errors import FoldError
from ..fold_math import Affine, batch_norm_affine
from ..torch_export.ops import Norm, module_path, parse_layer
from .audit_report import LayerAudit, NormAudit
from .graph import lifted_tensor, lifted_tensors, running_stats_norm
from .profiles import FP16_MAX
from .risk import QNN_EPS, NormStats, Risk, judge, measure_intermediates, predict
from .runner import EmulationResult


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
    return norm_numbers(mean, var, gamma, norm.weight is None or gamma is not None, norm.eps, bn_eps)


def norm_numbers(mean, var, gamma, gamma_known: bool, eps: float, bn_eps: float | None) -> dict:
    """:func:`_norm_numbers` from the statistics themselves (``gamma`` None: 1, or unknown if not
    ``gamma_known``)."""
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
