"""DB post-processing, as PaddleOCR's detectors expect it, in numpy and scipy.ndimage (no OpenCV, no shapely).

PaddleOCR's ``DBPostProcess`` (its inference defaults: ``det_db_thresh`` 0.3, ``det_db_box_thresh`` 0.6,
``det_db_unclip_ratio`` 1.5, ``score_mode`` fast, no dilation, ``min_size`` 3): binarize the probability map
at ``thresh``; per connected region (8-connected, as OpenCV's contours follow it) the minimum-area rectangle
of its pixels; drop it when its short side is under ``min_size`` or when the mean probability inside it is
under ``box_thresh``; expand ("unclip") it by ``area * unclip_ratio / perimeter`` on every side (the
minimum-area rectangle of a rectangle offset with round joins is the rectangle grown by the offset); drop
it when its short side is then under ``min_size + 2``.

Differences from PaddleOCR's code, none of which moves a box on the rendered pages: regions are the
connected components (OpenCV's ``RETR_LIST`` also lists the holes inside them), and the score and masks
are filled by a point-in-polygon test on pixel centres instead of OpenCV's scan conversion.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

THRESH, BOX_THRESH, UNCLIP_RATIO, MIN_SIZE, MAX_CANDIDATES = 0.3, 0.6, 1.5, 3, 1000


@dataclass(frozen=True)
class Region:
    """A detected text region: ``quad`` (4 x 2 float, x y, clockwise from top-left) and its ``score``."""

    quad: np.ndarray
    score: float

    @property
    def box(self) -> tuple[float, float, float, float]:
        """The axis-aligned box ``(x0, y0, x1, y1)`` around the quad."""
        q = self.quad
        return float(q[:, 0].min()), float(q[:, 1].min()), float(q[:, 0].max()), float(q[:, 1].max())


def min_area_rect(points: np.ndarray) -> tuple[np.ndarray, float, float]:
    """The minimum-area rectangle around ``points`` (N x 2): its corners (4 x 2, clockwise from the
    top-left in image coordinates) and its two side lengths (rotating calipers on the convex hull)."""
    from scipy.spatial import ConvexHull, QhullError

    pts = np.unique(np.asarray(points, dtype=np.float64), axis=0)
    try:
        hull = pts[ConvexHull(pts).vertices] if len(pts) >= 3 else pts
    except QhullError:  # collinear points: a segment, whose rectangle has width 0
        hull = pts
    best = None
    edges = np.diff(np.vstack([hull, hull[:1]]), axis=0)
    angles = np.unique(np.mod(np.arctan2(edges[:, 1], edges[:, 0]), np.pi / 2)) if len(hull) > 1 else np.zeros(1)
    for a in angles:
        c, s = np.cos(a), np.sin(a)
        rot = np.array([[c, s], [-s, c]])  # into the frame whose x axis is the edge
        r = hull @ rot.T
        lo, hi = r.min(0), r.max(0)
        area = float(np.prod(hi - lo))
        if best is None or area < best[0] - 1e-9:
            best = (area, rot, lo, hi)
    _, rot, lo, hi = best
    corners = np.array([[lo[0], lo[1]], [hi[0], lo[1]], [hi[0], hi[1]], [lo[0], hi[1]]]) @ rot
    w, h = hi - lo
    return _order(corners), float(w), float(h)


def _order(corners: np.ndarray) -> np.ndarray:
    """PaddleOCR's corner order: the two leftmost points give top-left / bottom-left, the two rightmost
    top-right / bottom-right."""
    p = corners[np.argsort(corners[:, 0], kind="stable")]
    tl, bl = (p[0], p[1]) if p[0][1] <= p[1][1] else (p[1], p[0])
    tr, br = (p[2], p[3]) if p[2][1] <= p[3][1] else (p[3], p[2])
    return np.array([tl, tr, br, bl])


def polygon_mask(quad: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Boolean ``shape`` mask of the pixel centres inside the convex ``quad`` (edges included)."""
    h, w = shape
    ys, xs = np.mgrid[0:h, 0:w]
    return _inside(quad, xs.astype(np.float64), ys.astype(np.float64))


def _inside(quad: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    q = np.asarray(quad, dtype=np.float64)
    pos, neg = np.ones(xs.shape, dtype=bool), np.ones(xs.shape, dtype=bool)
    for i in range(len(q)):
        (x0, y0), (x1, y1) = q[i], q[(i + 1) % len(q)]
        cross = (x1 - x0) * (ys - y0) - (y1 - y0) * (xs - x0)
        pos &= cross >= -1e-9
        neg &= cross <= 1e-9
    return pos | neg


def _score(prob: np.ndarray, quad: np.ndarray) -> float:
    """Mean probability inside ``quad`` (PaddleOCR's "fast" score, over the quad's bounding pixels)."""
    h, w = prob.shape
    x0 = int(np.clip(np.floor(quad[:, 0].min()), 0, w - 1))
    x1 = int(np.clip(np.ceil(quad[:, 0].max()), 0, w - 1))
    y0 = int(np.clip(np.floor(quad[:, 1].min()), 0, h - 1))
    y1 = int(np.clip(np.ceil(quad[:, 1].max()), 0, h - 1))
    ys, xs = np.mgrid[y0 : y1 + 1, x0 : x1 + 1]
    inside = _inside(np.rint(quad), xs.astype(np.float64), ys.astype(np.float64))
    sub = prob[y0 : y1 + 1, x0 : x1 + 1]
    return float(sub[inside].mean()) if inside.any() else 0.0


def _unclip(quad: np.ndarray, w: float, h: float, ratio: float) -> tuple[np.ndarray, float]:
    """The rectangle grown by ``area * ratio / perimeter`` on every side; its short side."""
    d = w * h * ratio / (2 * (w + h))
    centre = quad.mean(0)
    ex = (quad[1] - quad[0]) / max(np.linalg.norm(quad[1] - quad[0]), 1e-12)
    ey = (quad[3] - quad[0]) / max(np.linalg.norm(quad[3] - quad[0]), 1e-12)
    hw, hh = np.linalg.norm(quad[1] - quad[0]) / 2 + d, np.linalg.norm(quad[3] - quad[0]) / 2 + d
    grown = np.array([centre - hw * ex - hh * ey, centre + hw * ex - hh * ey, centre + hw * ex + hh * ey])
    grown = np.vstack([grown, centre - hw * ex + hh * ey])
    return _order(grown), float(min(w, h) + 2 * d)


def det_regions(
    prob: np.ndarray,
    thresh: float = THRESH,
    box_thresh: float = BOX_THRESH,
    unclip_ratio: float = UNCLIP_RATIO,
    min_size: int = MIN_SIZE,
    max_candidates: int = MAX_CANDIDATES,
) -> list[Region]:
    """The text regions of one probability map (``H x W``, or ``[1, 1, H, W]``), in reading order
    (top to bottom, then left to right); corners in the map's pixels, clipped to it."""
    from scipy import ndimage

    p = np.asarray(prob, dtype=np.float64)
    p = p.reshape(p.shape[-2:])
    h, w = p.shape
    mask = np.nan_to_num(p, nan=0.0) > thresh
    labels, n = ndimage.label(mask, structure=np.ones((3, 3), dtype=bool))
    regions = []
    for k, sl in enumerate(ndimage.find_objects(labels)[:max_candidates], 1):
        ys, xs = np.nonzero(labels[sl] == k)
        pts = np.stack([xs + sl[1].start, ys + sl[0].start], axis=1)
        quad, rw, rh = min_area_rect(pts)
        if min(rw, rh) < min_size:
            continue
        score = _score(np.nan_to_num(p, nan=0.0), quad)
        if score < box_thresh:
            continue
        grown, short = _unclip(quad, rw, rh, unclip_ratio)
        if short < min_size + 2:
            continue
        grown[:, 0] = np.clip(np.rint(grown[:, 0]), 0, w)
        grown[:, 1] = np.clip(np.rint(grown[:, 1]), 0, h)
        regions.append(Region(grown, score))
    regions.sort(key=lambda r: (round(r.box[1] / 8), r.box[0]))
    return regions
