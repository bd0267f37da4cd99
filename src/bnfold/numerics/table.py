"""The text summary of an AuditReport."""

from __future__ import annotations

import math


def db(x) -> str:
    """A dB figure for a table: one decimal, 'exact' for no error at all."""
    if x is None:
        return "-"
    if math.isinf(x) and x > 0:
        return "exact"
    if math.isnan(x):
        return "n/a"
    return f"{x:.1f}"


def pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def sci(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if math.isinf(x):
        return "inf"
    return f"{x:.3g}"


def _short(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "~"


def audit_table(report) -> str:
    eps = "model eps" if report.bn_eps is None else f"bn_eps={report.bn_eps:g}"
    lines = [f"bnfold audit: profile {report.profile}, {eps}, {report.samples} samples in {report.batches} batch(es)"]
    u, f = report.unfolded, report.folded
    lines.append("")
    lines.append(f"  {'end to end':<24} {'unfolded':>12} {'folded':>12}")
    lines.append(f"  {'output SQNR (dB)':<24} {db(u.output.sqnr_db):>12} {db(f.output.sqnr_db) if f else '-':>12}")
    if u.top1_agreement is not None:
        lines.append(f"  {'top-1 agreement w/ fp32':<24} {pct(u.top1_agreement):>12} {pct(f.top1_agreement) if f else '-':>12}")
    if u.accuracy is not None:
        acc = f"accuracy (fp32 {pct(report.fp32_accuracy)})"
        lines.append(f"  {acc:<24} {pct(u.accuracy):>12} {pct(f.accuracy) if f else '-':>12}")
    nf = lambda e: f"{e.output.nan}/{e.output.inf}"  # noqa: E731
    lines.append(f"  {'output NaN/inf':<24} {nf(u):>12} {nf(f) if f else '-':>12}")
    lines.append("")
    lines.append(f"  normalizations ({len(report.norms)}): kappa = max |mean|/sqrt(var+eps); headroom = 65504 / max|input|")
    lines.append(f"  {'norm':<28} {'ch':>4} {'|scale| range':>19} {'kappa':>8} {'headroom':>9}  fold")
    for n in report.norms:
        rng = f"{sci(n.scale_min)}..{sci(n.scale_max)}"
        extra = ""
        if n.runtime_scale_max is not None:
            extra = f" [scale max {sci(n.runtime_scale_max)} with bn_eps]"
        lines.append(f"  {_short(n.name, 28):<28} {n.channels:>4} {rng:>19} {sci(n.kappa):>8} {sci(n.headroom):>9}  "
                     f"{_short(n.fold, 90)}{extra}")
    lines.append("")
    lines.append(f"  layers ({len(report.layers)}): SQNR (dB) against float64, NaN/inf")
    lines.append(f"  {'layer':<28} {'kind':<14} {'unfolded':>9} {'folded':>9} {'NaN/inf u':>10} {'NaN/inf f':>10}")
    for r in report.layers:
        fd = db(r.folded.sqnr_db) if r.folded else "-"
        fn = f"{r.folded.nan}/{r.folded.inf}" if r.folded else "-"
        un = f"{r.unfolded.nan}/{r.unfolded.inf}"
        kind = r.kind + ("+bn" if r.norm and r.kind != "batch_norm" else "")
        lines.append(f"  {_short(r.label or r.name, 28):<28} {kind:<14} {db(r.unfolded.sqnr_db):>9} {fd:>9} "
                     f"{un:>10} {fn:>10}")
    return "\n".join(lines)
