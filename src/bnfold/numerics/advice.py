"""The closing "what to do" of an audit: which norms the fold removes, which stay and what they cost,
and whether a runtime eps breaks the unfolded model."""

from __future__ import annotations

import math

from .profiles import FP16_MAX
from .risk import DEGRADE_DB, QNN_EPS, norm_severity


def _names(norms, text=lambda n: n.name, n: int = 4) -> str:
    shown = ", ".join(text(x) for x in norms[:n])
    return shown + (f" and {len(norms) - n} more" if len(norms) > n else "")


def _cost(norms) -> str:
    """``name (verdict, ~N dB, cause)`` for each norm, the worst first."""
    return _names(sorted(norms, key=norm_severity), _with_cost)


def _with_cost(n) -> str:
    extra = f", ~{n.risk.loss_db if n.risk is not None else 0.0:.0f} dB" if n.verdict == "degrades" else ""
    extra += f", {n.risk.cause}" if n.risk is not None and n.risk.cause else ""
    return f"{n.name} ({n.verdict}{extra})"


def _e2e(e) -> str:
    out = e.output
    if out.nonfinite:
        return f"{100 * out.nonfinite_share:.3g}% NaN/inf"
    if not math.isfinite(out.sqnr_db):
        return "exact"
    spread = e.sqnr_spread_db
    return f"{out.sqnr_db:.1f} ± {max(spread, 0.1):.1f} dB" if math.isfinite(spread) else f"{out.sqnr_db:.1f} dB"


def _task(report) -> list[str]:
    """The agreement with fp32 on the task, unfolded and folded, as a line (none when there is none to cite)."""
    from .table import task_rows

    u, f = report.unfolded, report.folded
    parts = [
        f"{label.replace(' w/ fp32', '')} unfolded {cell(u)}" + (f", folded {cell(f)}" if f is not None else "")
        for label, cell in task_rows(u)
    ]
    return [f"on these inputs, agreement with fp32: {'; '.join(parts)}."] if parts else []


def verdict(report) -> list[str]:
    """The verdict line (and the prescription's when the model is rejected); [] for a report without one."""
    if report.deploy is None or report.floor is None:
        return []
    weak = " (random inputs: weak evidence; audit real data with --inputs)" if report.random_inputs else ""
    if report.deploy:
        which = "the folded model" if report.ship == "folded" else "the model as is"
        return [f"verdict: deploy {which} under {report.profile}: {report.floor.met(report.shipped)}{weak}."]
    which = "folded model" if report.ship == "folded" else "model"
    cause = (
        report.cause.line()
        if report.cause is not None
        else ("no op breaks (no overflow, no NaN/inf from finite inputs, no SQNR drop of 10 dB or more)")
    )
    misses = "; ".join(report.floor.failures(report.shipped))
    lines = [f"verdict: do not deploy under {report.profile} as is: {cause}; the {which}: {misses}{weak}."]
    if report.prescription is not None:
        lines.append(report.prescription.line())
    return lines


def _overflow(n) -> str:
    """What overflows in norm ``n`` (verdict ``overflows``): the value its statistics drive past fp16's range,
    and what the run on these inputs showed."""
    pred, meas, parts = n.risk.effective, n.risk.measured, []
    if pred is not None and pred.overflows and pred.intermediates:
        top, value = max(pred.intermediates.items(), key=lambda kv: kv[1])
        parts.append(f"its {top} reaches {value:.3g} (fp16 holds up to {FP16_MAX:g}), predicted from its statistics")
    if meas is not None and meas.output_nonfinite:
        parts.append(f"{meas.output_nonfinite} NaN/inf in its output on these inputs")
    elif meas is not None:
        room = min(meas.headroom_reference, meas.headroom_emulated)
        where = "stay within" if room >= 1 else "leave"
        parts.append(f"on these inputs its values {where} fp16's range (headroom {room:.2g}x)")
    return f"what overflows in {n.name}: {'; '.join(parts) or n.risk.detail}."


def advice(report) -> list[str]:
    norms = report.norms
    lines = verdict(report)
    lines += [] if report.random_inputs else _task(report)  # real inputs: the task's number comes next
    bad = [n for n in norms if n.verdict in ("overflows", "degrades", "input NaN")]
    over = [n for n in norms if n.verdict == "overflows"]
    eps = "the model's eps" if report.bn_eps is None else f"runtime eps {report.bn_eps:g}"
    if not norms:
        lines.append("no batch norm with running statistics: nothing to fold, nothing at risk from one.")
    elif bad:
        lines.append(
            f"under {report.profile} at {eps}, {len(bad)} of {len(norms)} batch norms are at risk: {_cost(bad)}."
        )
    else:
        lines.append(
            f"under {report.profile} at {eps}, every batch norm is safe (predicted local loss below "
            f"{DEGRADE_DB:g} dB, no overflow)."
        )
    lines += [_overflow(n) for n in sorted(over, key=norm_severity)[:3]]
    if report.fold_report is not None and norms:
        folded = [n for n in norms if n.folded]
        kept = [n for n in norms if not n.folded]
        saved = [n for n in folded if n in bad]
        lines.append(
            f"bnfold folds {len(folded)} of {len(norms)}"
            + (f", {len(saved)} of the risky ones among them ({_names(saved)})" if saved else "")
            + ": a folded norm is computed into the layer's weights in float64, so the backend never sees "
            "a BatchNorm (no runtime eps, no fp16 scale or bias')."
        )
        lines.append(f"{len(kept)} stay after folding: {_cost(kept)}." if kept else "none stays after folding.")
    if report.folded is not None:
        lines.append(f"end to end: unfolded {_e2e(report.unfolded)}, folded {_e2e(report.folded)}.")
    what_if = [n for n in norms if n.risk is not None and n.risk.risky_at_what_if]
    if report.bn_eps is None and report.profile == "htp" and norms:
        if what_if:
            n_over = sum(n.risk.what_if.overflows for n in what_if)
            lines.append(
                f"a runtime that applies eps {QNN_EPS:g} (ExecuTorch's QNN batch-norm builder) would break "
                f"the unfolded model at {len(what_if)} norm(s) ({n_over} overflow; predicted): "
                f"{_names(what_if)}; audit with --bn-eps {QNN_EPS:g} to measure it."
            )
        else:
            lines.append(
                f"a runtime eps of {QNN_EPS:g} (ExecuTorch's QNN batch-norm builder) would not break the "
                "unfolded model (predicted from the statistics)."
            )
    elif report.bn_eps is not None and norms:
        at_model_eps = [n.risk.model for n in norms if n.risk is not None and n.risk.model is not None]
        model_bad = [m for m in at_model_eps if m.overflows or m.loss_db >= DEGRADE_DB]
        model_over = [m for m in model_bad if m.overflows]
        counts = (
            f"{len(bad)} norm(s) at risk ({len(over)} overflow), against {len(model_bad)} "
            f"({len(model_over)} overflow) at the model's eps (predicted)"
        )
        worse = len(over) > len(model_over) or len(bad) > len(model_bad)
        effect = "breaks the unfolded model" if worse else "adds no risk over the model's eps"
        lines.append(f"the runtime eps {report.bn_eps:g} {effect}: {counts}.")
    return lines
