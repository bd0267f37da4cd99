"""The OCR task's numbers: regions matched at IoU >= 0.5 (recall, precision), line accuracy and character
error rate, top-1 agreement."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .db_postprocess import polygon_mask

MATCH_IOU = 0.5


def _quad(box) -> np.ndarray:
    """A region's quad, or the corners of an ``(x0, y0, x1, y1)`` box (end-exclusive pixels)."""
    quad = getattr(box, "quad", None)
    if quad is not None:
        return np.asarray(quad, dtype=np.float64)
    x0, y0, x1, y1 = (float(v) for v in box)
    return np.array([[x0, y0], [x1 - 1, y0], [x1 - 1, y1 - 1], [x0, y1 - 1]])


@dataclass(frozen=True)
class Match:
    """Regions ``found`` matched one to one against ``truth`` at IoU >= ``MATCH_IOU`` (greedy, best IoU
    first): ``pairs`` (truth index, found index, IoU)."""

    truth: int
    found: int
    pairs: tuple[tuple[int, int, float], ...]

    @property
    def matched(self) -> int:
        return len(self.pairs)

    @property
    def recall(self) -> float:
        return self.matched / self.truth if self.truth else 1.0

    @property
    def precision(self) -> float:
        return self.matched / self.found if self.found else (1.0 if not self.truth else 0.0)

    def partner(self, truth_index: int) -> int | None:
        """The found region matched to ``truth[truth_index]``, or None."""
        return next((j for i, j, _ in self.pairs if i == truth_index), None)


def match_regions(truth, found, shape: tuple[int, int], iou: float = MATCH_IOU) -> Match:
    """Match ``found`` regions against ``truth`` regions (quads, Regions or boxes) on a ``shape`` page."""
    masks_t = [polygon_mask(_quad(t), shape) for t in truth]
    masks_f = [polygon_mask(_quad(f), shape) for f in found]
    cand = []
    for i, mt in enumerate(masks_t):
        for j, mf in enumerate(masks_f):
            union = np.count_nonzero(mt | mf)
            v = np.count_nonzero(mt & mf) / union if union else 0.0
            if v >= iou:
                cand.append((v, i, j))
    used_t, used_f, pairs = set(), set(), []
    for v, i, j in sorted(cand, key=lambda c: (-c[0], c[1], c[2])):
        if i not in used_t and j not in used_f:
            used_t.add(i)
            used_f.add(j)
            pairs.append((i, j, float(v)))
    return Match(len(masks_t), len(masks_f), tuple(sorted(pairs)))


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions)."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def cer(read: list[str], truth: list[str]) -> float:
    """Character error rate: total edit distance over total reference characters."""
    chars = sum(len(t) for t in truth)
    return sum(edit_distance(r, t) for r, t in zip(read, truth, strict=True)) / chars if chars else 0.0


def line_accuracy(read: list[str], truth: list[str]) -> float:
    """Share of lines read exactly."""
    return sum(r == t for r, t in zip(read, truth, strict=True)) / len(truth) if truth else 1.0


def top1(pred: np.ndarray, want: np.ndarray) -> float:
    """Share of equal entries (top-1 accuracy or agreement)."""
    pred, want = np.asarray(pred), np.asarray(want)
    return float((pred == want).mean()) if want.size else 1.0
