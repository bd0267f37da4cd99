"""The SQNR chart of an audit, readable at a glance on a 170-layer model (matplotlib, Agg backend).

One row of two panels per report:

* left, the whole model: the cumulative SQNR of every layer in graph order, unfolded and folded, on a fixed
  0-100 dB axis (extended down to -40 dB when a layer is worse than 0 dB) with two reference lines (the fp16
  floor: one fp16 rounding; the danger level: noise at 10% of the signal) and red marks at layers whose output
  holds NaN/inf;
* right, the worst layers: the ``worst`` layers with the lowest local SQNR (the error each adds by itself;
  the cumulative one when the audit ran without local runs), unfolded next to folded, named as in the table.

The title carries the model's name, the profile and eps, and the end-to-end numbers.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..io.atomic import write_bytes
from .risk import SPREAD, U_FP16
from .table import pct

#: SQNR of one fp16 rounding of values spread over binades: what a perfect fp16 layer reaches
FP16_FLOOR_DB = -10 * math.log10(SPREAD * U_FP16**2)
#: below this the noise is 10% of the signal
DANGER_DB = 20.0
TOP_DB = 100.0
BOTTOM_DB = -40.0


def _db(err) -> float:
    """A plottable SQNR: NaN when undefined (NaN/inf in the tensor), capped at the axis top."""
    if err is None or err.nonfinite or err.ref_nonfinite:
        return math.nan
    return min(err.sqnr_db, TOP_DB) if not math.isnan(err.sqnr_db) else math.nan


def _e2e(e) -> str:
    if e is None:
        return "-"
    if e.output.nonfinite:
        return f"NaN/inf {100 * e.output.nonfinite_share:.3g}%"
    return f"SQNR {e.output.sqnr_db:.1f} dB" if math.isfinite(e.output.sqnr_db) else "exact"


def title_of(rep) -> str:
    eps = "model eps" if rep.bn_eps is None else f"runtime eps {rep.bn_eps:g}"
    text = f"{rep.name}: profile {rep.profile}, {eps}.  Output: unfolded {_e2e(rep.unfolded)}"
    if rep.folded is not None:
        text += f", folded {_e2e(rep.folded)}"
    if rep.unfolded.top1_agreement is not None:
        agree = pct(rep.unfolded.top1_agreement)
        if rep.folded is not None and rep.folded.top1_agreement is not None:
            agree += f" / {pct(rep.folded.top1_agreement)}"
        text += f"; top-1 agreement {agree}" + (" (random inputs)" if rep.random_inputs else "")
    return text


def _depth_panel(ax, rep) -> None:
    xs = list(range(len(rep.layers)))
    un = [_db(r.unfolded) for r in rep.layers]
    fo = [_db(r.folded) for r in rep.layers]
    ax.plot(xs, un, "-", lw=1.2, color="tab:red", label="unfolded")
    if rep.folded is not None:
        ax.plot(xs, fo, "-", lw=1.2, color="tab:blue", label="folded")
    lowest = min((v for v in un + fo if not math.isnan(v)), default=0.0)
    bottom = max(BOTTOM_DB, min(0.0, 10 * math.floor((lowest - 5) / 10)))  # fixed scale, below 0 only when needed
    bad = [x for x, r in zip(xs, rep.layers) if r.unfolded.nonfinite or (r.folded and r.folded.nonfinite)]
    if bad:
        ax.plot(bad, [bottom + 2] * len(bad), "x", color="darkred", ms=7, label=f"NaN/inf ({len(bad)} layers)")
    _references(ax, horizontal=True)
    ax.set_ylim(bottom, TOP_DB)
    ax.set_xlim(-0.5, max(len(xs) - 0.5, 0.5))
    ax.set_xlabel(f"layer (graph order, {len(xs)} layers)")
    ax.set_ylabel(f"cumulative SQNR vs the {rep.reference} reference (dB)")
    ax.set_title("whole model: error carried to each layer", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")


def _references(ax, horizontal: bool) -> None:
    line = ax.axhline if horizontal else ax.axvline
    line(FP16_FLOOR_DB, color="gray", ls="--", lw=1)
    line(DANGER_DB, color="darkorange", ls=":", lw=1.2)
    if horizontal:
        ax.text(0, FP16_FLOOR_DB + 1, f"fp16 floor {FP16_FLOOR_DB:.0f} dB", fontsize=7, color="gray")
        ax.text(0, DANGER_DB + 1, f"danger {DANGER_DB:.0f} dB (noise 10%)", fontsize=7, color="darkorange")


def _worst_panel(ax, rep, worst: int) -> None:
    local = rep.local_runs  # False: an audit without local runs (audit(local=False), bnfold audit without --local)
    pre, kind = ("local_", "local") if local else ("", "cumulative")
    rows = rep.worst_layers(worst, "unfolded", local=local)[::-1]  # worst at the top
    ys = list(range(len(rows)))
    h = 0.4 if rep.folded is not None else 0.8
    for which, shift, color in (("unfolded", h / 2, "tab:red"), ("folded", -h / 2, "tab:blue")):
        if which == "unfolded" or rep.folded is not None:
            v = [_db(getattr(r, pre + which)) for r in rows]
            ax.barh([y + shift for y in ys], [0 if math.isnan(x) else x for x in v], h, color=color, label=which)
    for y, r in zip(ys, rows):
        e = getattr(r, pre + "unfolded")
        if e is not None and e.nonfinite:
            ax.text(1, y + h / 2, f"NaN/inf {100 * e.nonfinite_share:.3g}%", va="center", fontsize=7, color="darkred")
    ax.set_yticks(ys)
    ax.set_yticklabels([r.title for r in rows], fontsize=7)
    _references(ax, horizontal=False)
    ax.set_xlim(0, TOP_DB)
    ax.set_xlabel("local SQNR: error the layer adds by itself (dB)" if local else "cumulative SQNR (dB)")
    ax.set_title(f"worst {len(rows)} layers (lowest {kind} SQNR, unfolded)", fontsize=9)
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize=7, loc="lower right")


def plot_reports(reports, path, titles=None, worst: int = 25) -> Path:
    """Write the chart of each AuditReport (one row of panels each) to ``path``, atomically; the format
    follows the extension (PNG when matplotlib knows no such format)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    # matplotlib's built-in settings, whatever ``matplotlibrc`` the current folder, ``MATPLOTLIBRC`` or the
    # user's config holds (a crafted one can ask for a canvas of gigabytes); the backend stays Agg
    builtin = {k: v for k, v in matplotlib.rcParamsDefault.items() if k not in ("backend", "backend_fallback")}
    shown = min(worst, max((len(r.layers) for r in reports), default=1))
    height = max(4.0, 0.2 * shown + 1.8)
    path = Path(path)
    with matplotlib.rc_context(builtin):  # restored after the plot
        fig = plt.figure(figsize=(15, (height + 0.5) * len(reports)), layout="constrained")
        rows = fig.subfigures(len(reports), 1, squeeze=False)[:, 0]
        for i, (row, rep) in enumerate(zip(rows, reports)):
            left, right = row.subplots(1, 2, width_ratios=[1.4, 1])
            _depth_panel(left, rep)
            _worst_panel(right, rep, worst)
            row.suptitle(titles[i] if titles else title_of(rep), fontsize=10, fontweight="bold")
        fmt = path.suffix[1:].lower()
        if fmt not in fig.canvas.get_supported_filetypes():
            fmt = "png"
        try:
            write_bytes(path, lambda f: fig.savefig(f, dpi=100, format=fmt))
        finally:
            plt.close(fig)
    return path
