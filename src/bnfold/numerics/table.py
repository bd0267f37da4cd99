"""The text summary of an AuditReport."""

from __future__ import annotations

import math


def db(x) -> str:
    """A dB figure for a table: one decimal, 'exact' for no error at all, 'n/a' when undefined."""
    return "exact" if x == math.inf else num(x, ".1f")


def sqnr(err) -> str:
    """An error's SQNR cell: NaN/inf share when the tensor holds any (it has no SQNR), else :func:`db`."""
    if err is None:
        return "-"
    if err.nonfinite:
        return f"NaN {100 * err.nonfinite_share:.3g}%"
    if err.ref_nonfinite:
        return "ref NaN"
    return db(err.sqnr_db)


def sqnr_spread(e2e) -> str:
    """An end-to-end SQNR cell with its spread over batches (``43.4 ± 0.8``), as :func:`sqnr` when the
    spread is undefined (one batch, NaN/inf).  The spread gets the value's precision, at least its last
    digit, so a reader (and the README test) can tell which digits the inputs move."""
    cell, spread = sqnr(e2e.output), e2e.sqnr_spread_db
    if not math.isfinite(spread) or not math.isfinite(e2e.output.sqnr_db):
        return cell
    return f"{cell} ± {max(spread, 0.1):.1f}"


def nonfinite(err) -> str:
    """``nan/inf`` counts and their share of the elements."""
    if err is None:
        return "-"
    if not err.nonfinite:
        return "0/0"
    return f"{err.nan}/{err.inf} ({100 * err.nonfinite_share:.3g}%)"


def pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def sci(x: float) -> str:
    if x is None:
        return "n/a"
    return "inf" if math.isinf(x) else num(x, ".3g")


def _short(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "~"


NAME_WIDTH = 28  # the name column's least width
NAME_MAX = 48  # its most, but with ``full``: a longer name keeps its head and its end, the middle elided


def _elide(s: str, n: int) -> str:
    """``s`` in ``n`` characters, a ``~`` where some was left out.  A path of scopes (the TorchScript exporter's
    ``/features/features.1/block/block.2/block.2.1/BatchNormalization``) first loses each scope that the next one
    repeats (``~features.1/block.2.1/BatchNormalization``); what is still too long keeps its first few characters
    and its end, where names differ (the dynamo exporter's differ in a counter at the end)."""
    if len(s) <= n:
        return s
    parts = s.split("/")
    kept = [p for p, nxt in zip(parts, parts[1:] + [""]) if p and not nxt.startswith(p + ".")]
    if len(kept) < len([p for p in parts if p]):
        s = "~" + "/".join(kept)
        if len(s) <= n:
            return s
    head = min(10, n // 4)
    return s[:head] + "~" + s[len(s) - (n - head - 1) :]


def _names(names: list[str], full: bool) -> tuple[int, list[str]]:
    """The name column's width and its cells: each name in full (``full``), or shortened by :func:`_elide`."""
    cells = list(names) if full else [_elide(x, NAME_MAX) for x in names]
    return max([NAME_WIDTH] + [len(c) for c in cells]), cells


def _end_to_end(report) -> list[str]:
    def line(label: str, cell, u, f) -> str:
        return f"  {label:<26} {cell(u):>14} {cell(f) if f else '-':>14}"

    def nan_inf(e) -> str:
        return nonfinite(e.output)

    u, f = report.unfolded, report.folded
    which = "output" if u.output_index is None else f"output {u.output_index}"
    out = [f"  {'end to end':<26} {'unfolded':>14} {'folded':>14}", line(f"{which} SQNR (dB)", sqnr_spread, u, f)]
    star = "*" if report.random_inputs else ""
    out += [line(label + star, cell, u, f) for label, cell in task_rows(u)]
    if u.accuracy is not None:
        out.append(line(f"accuracy (fp32 {pct(report.fp32_accuracy)})", lambda e: pct(e.accuracy), u, f))
    out.append(line("output NaN/inf", nan_inf, u, f))
    rt = report.runtime
    if rt is not None:
        ru, rf, real = rt.unfolded, rt.folded, f"real {rt.runtime}"
        out += [line(f"{real} SQNR (dB)", sqnr_spread, ru, rf), line(f"{real} NaN/inf", nan_inf, ru, rf)]
        out += [line(_short(f"{real} {label}", 26), cell, ru, rf) for label, cell in task_rows(ru, short=True)]
        out.append(f"  (the {rt.runtime} run is what the {rt.matches_profile} profile emulates)")
    if "±" in "".join(out):
        out.append(f"  (x ± s: the SQNR over all {report.batches} batches ± the standard deviation of each batch's)")
    if report.random_inputs and task_rows(u):
        out.append(
            "  * on random inputs: weak evidence (random inputs neither follow the data nor reach its "
            "activation ranges); audit real data with --inputs"
        )
    return out


def task_rows(e2e, short: bool = False) -> list:
    """``(label, cell(end_to_end) -> str)`` for each agreement number ``e2e`` has: top-1, mask IoU, metric
    (``short``: labels without "w/ fp32" and the metric's name, for the real-runtime rows)."""
    fp32 = "" if short else " w/ fp32"
    rows = []
    if e2e.top1_agreement is not None:
        rows.append((("top-1" if short else "top-1 agreement") + fp32, lambda e: pct(e.top1_agreement)))
    if e2e.mask_iou is not None:
        label = f"IoU>{e2e.threshold:g}" if short else f"mask IoU w/ fp32 (>{e2e.threshold:g})"
        rows.append((label, lambda e: num(e.mask_iou, ".3f")))
    if e2e.metric_name is not None:
        rows.append(("metric" if short else _short(f"metric {e2e.metric_name}", 26), lambda e: num(e.metric, ".4g")))
    return rows


def num(x, spec: str) -> str:
    """A number's cell: ``spec``-formatted, 'n/a' when undefined ('-' for None)."""
    if x is None:
        return "-"
    return "n/a" if math.isnan(x) else format(x, spec)


def _norm_rows(report, full: bool = False) -> list[str]:
    rt = report.bn_eps is not None
    w, names = _names([n.name for n in report.norms], full)
    out = [
        f"  normalizations ({len(report.norms)}): kappa = max |mean|/sqrt(var+eps) at the model's eps"
        + (f" and at the runtime eps {report.bn_eps:g}" if rt else "")
        + "; headroom = 65504 / the largest |value| the profile stores (input, x*scale, bias', sum; "
        "smallest of predicted and measured)",
        "  loss = local SQNR of the folded layer minus that of the unfolded one: predicted from the statistics "
        "| measured by the emulated run",
        f"  {'norm':<{w}} {'ch':>4} {'|scale| max':>11} {'kappa':>8} {'kappa@rt' if rt else '':>9} {'headroom':>9} "
        f"{'verdict':<10} {'loss pred|meas':>15} {'cause':<30} fold",
    ]
    for n, name in zip(report.norms, names):
        r = n.risk
        pred = r.effective.loss_db if r is not None and r.effective is not None else None
        meas = r.measured.loss_db if r is not None and r.measured is not None else None
        loss = f"{db(pred)}|{db(meas)}"
        scale = n.runtime_scale_max if rt and n.runtime_scale_max is not None else n.scale_max
        krt = sci(n.runtime_kappa) if rt else ""
        head = "input NaN" if n.verdict == "input NaN" else sci(n.headroom)  # no headroom to speak of
        out.append(
            f"  {name:<{w}} {n.channels:>4} {sci(scale):>11} {sci(n.kappa):>8} {krt:>9} "
            f"{head:>9} {n.verdict:<10} {loss:>15} {_short(r.cause if r else '', 30):<30} "
            f"{n.fold if full else _short(n.fold, 70)}"
        )
    return out


def _layer_rows(report, full: bool = False) -> list[str]:
    w, names = _names([r.title for r in report.layers], full)
    local = "(its inputs as emulated)" if report.local_runs else "(not run: --local)"
    out = [
        f"  layers ({len(report.layers)}): SQNR (dB) against the reference run (float64; float32 under the "
        "profiles that store fp16, its own error 8192x below fp16's).  cumulative: this output against the "
        "reference run of the whole model (carries upstream error); local: the error this layer adds by itself "
        f"{local}.  'NaN x%': the output holds NaN/inf and has no SQNR",
        f"  {'layer':<{w}} {'kind':<14} {'cumul unf':>10} {'cumul fold':>10} {'local unf':>10} "
        f"{'local fold':>10} {'NaN/inf unfolded':>18} {'NaN/inf folded':>16}",
    ]
    for r, name in zip(report.layers, names):
        kind = r.kind + ("+bn" if r.norm and r.kind != "batch_norm" else "")
        out.append(
            f"  {name:<{w}} {kind:<14} {sqnr(r.unfolded):>10} {sqnr(r.folded):>10} "
            f"{sqnr(r.local_unfolded):>10} {sqnr(r.local_folded):>10} {nonfinite(r.unfolded):>18} "
            f"{nonfinite(r.folded):>16}"
        )
    return out


def audit_table(report, full: bool = False) -> str:
    """The report as text; ``full`` (``bnfold audit -v``): every name and fold in full."""
    eps = "model eps" if report.bn_eps is None else f"runtime bn_eps={report.bn_eps:g}"
    rand = ", random inputs" if report.random_inputs else ""
    head = (
        f"bnfold audit: {report.name}, profile {report.profile}, {eps}, {report.samples} samples in "
        f"{report.batches} batch(es){rand}"
    )
    advice = ["  what to do:"] + [f"  - {a}" for a in report.advice()]
    blocks = [
        [head] + [f"  note: {n}" for n in report.notes],
        _end_to_end(report),
        _norm_rows(report, full),
        _layer_rows(report, full),
        advice,
    ]
    return "\n\n".join("\n".join(b) for b in blocks)
