"""The per-layer SQNR chart, unfolded vs folded (matplotlib, Agg backend)."""

from __future__ import annotations

import math
from pathlib import Path

from ..io.atomic import write_bytes


def _finite(x):
    return x if x is not None and math.isfinite(x) else math.nan


def plot_reports(reports, path, titles=None) -> Path:
    """One panel per AuditReport: per-layer SQNR of the unfolded and the folded program, written atomically.

    Layers whose output holds NaN/inf are marked with a red x at the bottom of
    the panel; layers with no error at all (SQNR +inf) are left out.
    """
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    n = len(reports)
    width = max(6.0, 0.28 * max(len(r.layers) for r in reports) + 2)
    fig, axes = plt.subplots(n, 1, figsize=(width, 3.6 * n), squeeze=False)
    for i, (ax, rep) in enumerate(zip(axes[:, 0], reports)):
        xs = list(range(len(rep.layers)))
        un = [_finite(r.unfolded.sqnr_db) for r in rep.layers]
        fo = [_finite(r.folded.sqnr_db) if r.folded else math.nan for r in rep.layers]
        ax.plot(xs, un, "o-", ms=3, label="unfolded")
        if rep.folded is not None:
            ax.plot(xs, fo, "s-", ms=3, label="folded")
        finite = [v for v in un + fo if not math.isnan(v)]
        bottom = min(finite) - 5 if finite else 0
        bad = [x for x, r in zip(xs, rep.layers) if r.unfolded.nonfinite or (r.folded and r.folded.nonfinite)]
        if bad:
            ax.plot(bad, [bottom] * len(bad), "rx", ms=8, label="NaN/inf in output")
        ax.set_xticks(xs)
        ax.set_xticklabels([r.label or r.name for r in rep.layers], rotation=70, fontsize=6)
        ax.set_ylabel("SQNR vs float64 (dB)")
        eps = "" if rep.bn_eps is None else f", bn_eps={rep.bn_eps:g}"
        title = titles[i] if titles else f"profile {rep.profile}{eps}"
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    # the format named by the extension; PNG when matplotlib knows no such format
    fmt = path.suffix[1:].lower()
    if fmt not in fig.canvas.get_supported_filetypes():
        fmt = "png"
    try:
        write_bytes(path, lambda f: fig.savefig(f, dpi=110, format=fmt))
    finally:
        plt.close(fig)
    return path
