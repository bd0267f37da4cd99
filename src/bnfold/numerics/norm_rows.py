"""The normalization rows of the audit: each batch norm's numbers (scale range, kappa, headroom), its
fold status from the fold report, and its risk (:mod:`bnfold.numerics.risk`), predicted from the
statistics and confirmed by the emulated run.  The numbers are read from plain tensors, so the
torch-program audit and the ONNX audit share them."""

from __future__ import annotations

import math

import torch

from .audit_report import LayerAudit, NormAudit
from .profiles import FP16_MAX
from .risk import QNN_EPS, NormBatch, NormStats, Risk, judge, measure_intermediates, predict_at
from .runner import EmulationResult, Program
from .segments import Segments


def _fold_status(fold_report) -> dict[str, tuple[bool, str, str]]:
    """``{norm node name: (folded, fold column text, module path)}`` from the fold report."""
    status = {}
    if fold_report is not None:
        for f in fold_report.folded:
            status[f.node] = (True, f"folded into {f.into} ({f.pattern}, {f.side} side)", f.norm)
        for s in fold_report.skipped:
            status[s.node] = (False, f"skipped: {s.reason}", s.norm)
    return status


def _numbers_of(nb: NormBatch, bn_eps: float | None) -> list[dict]:
    """Per norm of ``nb``, ``NormAudit``'s channels, ``|scale|`` range, kappa (at the model's eps and at
    ``bn_eps``) and the bn_eps scale, from ``fold_math.batch_norm_affines`` (:meth:`NormBatch.at`).
    Numbers it cannot give (channel counts that disagree, undefined statistics, an unknown gamma) are NaN; the
    scale does not depend on beta.  kappa is the shift of the bare normalization (gamma = 1, beta = 0):
    ``|mean| / sqrt(var + eps)``."""
    nan, runtime_nan = math.nan, None if bn_eps is None else math.nan
    out = [
        {"channels": st.mean.numel(), "scale_min": nan, "scale_max": nan, "kappa": nan, "kappa_channel": -1,
         "runtime_scale_max": runtime_nan, "runtime_kappa": runtime_nan}
        for st in nb.stats
    ]  # fmt: skip
    model = nb.at(nb.model_eps)
    runtime = nb.at([bn_eps] * nb.seg.n) if bn_eps is not None else None
    for i, m in enumerate(nb.members):
        numbers, known = out[m], nb.stats[m].gamma_known
        if model.scaled[i] and known:
            numbers["scale_min"], numbers["scale_max"] = model.extremes[i][:2]
        if model.bare[i]:
            numbers["kappa"], numbers["kappa_channel"] = model.extremes[i][2:]
        if runtime is not None and runtime.scaled[i] and known:
            numbers["runtime_scale_max"] = runtime.extremes[i][1]
        if runtime is not None and runtime.bare[i]:
            numbers["runtime_kappa"] = runtime.extremes[i][2]
    return out


def _other_eps(bn_eps, prof) -> float | None:
    """The eps predicted beside the model's: the runtime's (``bn_eps``), else under ``htp`` the QNN builder's
    (the what-if), else none."""
    return bn_eps if bn_eps is not None else QNN_EPS if prof.htp_batch_norm else None


def _risks(nb: NormBatch, prof, bn_eps, probes: list, rows: list, out_errs: list) -> list[Risk | None]:
    """Predicted and measured risk of each norm of ``nb`` (see :mod:`bnfold.numerics.risk`), all at once: None
    where its gamma or beta is unknown."""
    stats, none, other = nb.stats, [None] * len(nb.stats), _other_eps(bn_eps, prof)
    model, *at_other = predict_at(nb, prof, [None] if other is None else [None, other])
    runtime = at_other[0] if bn_eps is not None else none
    what_if = at_other[0] if bn_eps is None and at_other else none
    eps = [st.eps if st is not None and bn_eps is None else bn_eps for st in stats]
    measured = measure_intermediates(nb, prof, eps, probes)
    out = []
    for i, (st, m, row, out_err) in enumerate(zip(stats, measured, rows, out_errs)):
        if st is None or not (st.gamma_known and st.beta_known):
            out.append(None)
            continue
        if m is not None:
            m.output_nonfinite = out_err.nonfinite if out_err is not None else 0
            if row is not None and row.local_unfolded is not None and row.local_folded is not None:
                a, b = row.local_unfolded.sqnr_db, row.local_folded.sqnr_db
                if math.isfinite(a) and math.isfinite(b):
                    m.loss_db = b - a
        out.append(judge(Risk(model[i], runtime[i], what_if[i], m)))
    return out


def norm_audits(prog: Program, unfolded: EmulationResult, fold_report, bn_eps, prof, layers: list[LayerAudit]):
    """A :class:`NormAudit` per eval-mode batch norm of ``prog`` whose statistics are constants."""
    consts = prog.constants
    layer_of = {v: s for s in prog.steps if s.layer is not None for v in s.outs if v}  # value -> the layer making it
    flat = lambda v: None if v is None else consts[v].flatten()  # noqa: E731 - per channel, as stored
    status = _fold_status(fold_report)
    row_of = {n: r for r in layers for n in r.norms}
    found, stats = [], []
    for step in prog.steps:
        norm = step.norm
        if norm is None:
            continue
        weight, bias, mean, var = norm.params
        if mean not in consts or var not in consts:
            continue  # statistics computed in the graph: nothing to read ahead of time
        gamma_known, beta_known = weight is None or weight in consts, bias is None or bias in consts
        layer = layer_of.get(norm.input)
        layer_bias = flat(layer.bias) if layer is not None and layer.bias in consts else None
        if layer_bias is not None and layer_bias.numel() != consts[mean].numel():
            layer_bias = None
        found.append(step)
        stats.append(
            NormStats(
                flat(mean),
                flat(var),
                flat(weight) if gamma_known else None,
                flat(bias) if beta_known else None,
                norm.eps,
                layer_bias,
                rounded_input=layer is not None,
                gamma_known=gamma_known,
                beta_known=beta_known,
            )
        )
    rows = [row_of.get(step.name) for step in found]
    out_errs = [unfolded.errors.get(step.norm.output) if step.norm.output else None for step in found]
    with torch.inference_mode():  # plain arithmetic on constants: no op needs autograd's bookkeeping
        nb = NormBatch(stats)
        other = _other_eps(bn_eps, prof)  # every eps the rows read, computed at once: the model's and this one
        nb.prepare([nb.model_eps] + ([[other] * nb.seg.n] if other is not None else []))
        numbers = _numbers_of(nb, bn_eps)
        risks = _risks(nb, prof, bn_eps, [unfolded.probes.get(step.name) for step in found], rows, out_errs)
        inputs = _input_max_abs(found, unfolded.probes)
    out = []
    for step, nums, risk, row, x_max in zip(found, numbers, risks, rows, inputs):
        folded, fold, label = status.get(step.name, (False, "not audited (no fold report)", None))
        out.append(
            NormAudit(
                node=step.name,
                name=label or step.label or step.name,
                eps=step.norm.eps,
                input_max_abs=x_max,
                headroom=_smallest_headroom(risk, x_max),
                folded=folded,
                fold=fold,
                risk=risk,
                row=row.title if row is not None else None,
                **nums,
            )
        )
    return out


def _input_max_abs(steps: list, probes: dict) -> list[float]:
    """Per norm step, the largest ``|input|`` of the reference run, from its probe's per-channel range (NaN
    left out, inf kept; NaN without a probe), for all norms at once."""
    have = [(i, probes[s.name]) for i, s in enumerate(steps) if s.name in probes]
    out = [math.nan] * len(steps)
    seg = Segments([p.lo_ref.numel() for _, p in have])
    lo, hi = seg.stack([[getattr(p, k) for _, p in have] for k in ("lo_ref", "hi_ref")], [0.0, 0.0])
    for (i, _), top in zip(have, seg.max(torch.maximum(-lo, hi), floor=0.0).tolist()):
        out[i] = top
    return out


def _smallest_headroom(risk: Risk | None, x_max: float) -> float:
    """The smallest headroom of any intermediate: measured (reference and emulated) and predicted."""
    meas, pred = (risk.measured, risk.effective) if risk is not None else (None, None)
    found = [meas.headroom_reference, meas.headroom_emulated] if meas is not None else []
    found += [pred.headroom] if pred is not None else []
    return min(found) if found else FP16_MAX / x_max if x_max > 0 else math.inf
