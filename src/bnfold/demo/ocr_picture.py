"""The OCR demo's picture: the page with each run's detected regions, one panel per run (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .db_postprocess import THRESH


def draw_panels(page, panels: list[tuple[str, object]], path: Path) -> Path:
    """Write ``path`` (PNG): ``page`` once per ``(title, Detection)`` under its text mask (probability
    > 0.3, light blue), regions that match a text line (IoU >= 0.5) in green, the others in red, the
    rendered lines' boxes dashed grey."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Polygon, Rectangle

    h, w = page.image.shape[:2]
    n = len(panels)
    fig = Figure(figsize=(w / 80, n * (h / 80 + 0.45)), dpi=100)
    FigureCanvasAgg(fig)
    rgb = np.ascontiguousarray(page.image[..., ::-1])
    for k, (title, det) in enumerate(panels):
        ax = fig.add_subplot(n, 1, k + 1)
        ax.imshow(rgb, interpolation="nearest")
        mask = np.nan_to_num(det.prob, nan=0.0) > THRESH
        overlay = np.zeros((*mask.shape, 4))
        overlay[mask] = (0.2, 0.5, 1.0, 0.3)
        ax.imshow(overlay, interpolation="nearest")
        for x0, y0, x1, y1 in page.boxes:
            ax.add_patch(Rectangle((x0 - 0.5, y0 - 0.5), x1 - x0, y1 - y0, fill=False, ec="0.6", ls="--", lw=0.8))
        matched = {j for _, j, _ in det.truth.pairs}
        for j, r in enumerate(det.regions):
            ax.add_patch(
                Polygon(r.quad - 0.5, closed=True, fill=False, ec="tab:green" if j in matched else "tab:red", lw=1.6)
            )
        extra = len(det.regions) - det.truth.matched
        ax.set_title(
            f"{title}: {det.truth.matched} of {det.truth.truth} text regions" + (f", {extra} other" if extra else ""),
            fontsize=10,
        )
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_xlim(-0.5, w - 0.5)
        ax.set_ylim(h - 0.5, -0.5)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path
