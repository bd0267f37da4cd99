"""Rendered text for the OCR task: pages and lines drawn by matplotlib (Agg) in its bundled DejaVu Sans,
strings from a fixed seed, with their ground truth; and the input tensors PaddleOCR's models expect.

Nothing is read from disk but matplotlib's own font file, and nothing depends on the machine: the pixels
are Agg's and FreeType's (both inside the matplotlib wheel).

Images are ``H x W x 3`` uint8 in BGR channel order (what ``cv2.imread`` gives PaddleOCR; the text is black
on white, so the three channels are equal anyway).  PaddleOCR's preprocessing, as its inference code does:

* det (DB): ``(img / 255 - mean) / std`` with ImageNet's mean (0.485, 0.456, 0.406) and std
  (0.229, 0.224, 0.225) applied in the image's (BGR) order, CHW, sides multiples of 32 (pages are rendered
  at such sizes, so nothing is resized);
* rec (CTC) and cls: the crop resized to height 48 (width by its aspect ratio, bilinear), ``(img / 255 - 0.5)
  / 0.5``, right-padded with zeros to the batch's width (cls: 48 x 192, a wider crop is squeezed to 192).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

#: page size (height, width): multiples of 32 as the detector requires
PAGE_SIZE = (256, 512)
#: text size in points at 100 dpi (18 pt is 25 px: capitals ~18 px high, like a scanned 10 pt line at 180 dpi)
FONT_POINTS = 18
DPI = 100
#: words the strings are drawn from (plain ASCII: every character is in each recognizer's table)
WORDS = (
    "fold batch norm layer weight bias scale shift float half error model input output channel kernel stride "
    "paddle detect text line page read word value range small large first last every other under above "
    "north south river stone green light seven eleven signal random fixed point"
).split()
DET_MEAN, DET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
LINE_HEIGHT, CLS_WIDTH = 48, 192


@dataclass
class Page:
    """A rendered page: ``image`` (H x W x 3 uint8 BGR), one ``boxes`` row ``(x0, y0, x1, y1)`` per line (the
    ink's tight box, pixels, end-exclusive) and its ``texts``."""

    image: np.ndarray
    boxes: np.ndarray
    texts: list[str] = field(default_factory=list)

    def crops(self, boxes=None, pad: int = 0) -> list[np.ndarray]:
        """The image cut at ``boxes`` (default: the ground truth), each widened by ``pad`` pixels."""
        h, w = self.image.shape[:2]
        boxes = self.boxes if boxes is None else boxes
        out = []
        for x0, y0, x1, y1 in np.asarray(boxes, dtype=float).reshape(-1, 4):
            a, b = max(0, math.floor(y0) - pad), min(h, math.ceil(y1) + pad)
            c, d = max(0, math.floor(x0) - pad), min(w, math.ceil(x1) + pad)
            out.append(self.image[a:b, c:d])
        return out


def font_path() -> Path:
    """matplotlib's bundled DejaVu Sans (never a system font)."""
    import matplotlib

    return Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"


def strings(seed: int, n: int, words: tuple[int, int] = (2, 4)) -> list[str]:
    """``n`` lines of ``words[0]..words[1]`` words each, some followed by a number; fixed by ``seed``."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = int(rng.integers(words[0], words[1] + 1))
        parts = [str(WORDS[i]) for i in rng.choice(len(WORDS), k, replace=False)]
        if rng.random() < 0.5:
            parts.append(str(int(rng.integers(10, 1000))))
        out.append(" ".join(parts))
    return out


def _draw(size: tuple[int, int], texts: list[str], origins: list[tuple[float, float]], points: float):
    """Agg-render ``texts`` (top-left at ``origins``, pixels) on white; the grey image (float, 0..255)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.font_manager import FontProperties

    h, w = size
    fig = Figure(figsize=(w / DPI, h / DPI), dpi=DPI, facecolor="white")
    canvas = FigureCanvasAgg(fig)
    prop = FontProperties(fname=str(font_path()), size=points)
    for s, (x, y) in zip(texts, origins):
        fig.text(x / w, 1 - y / h, s, fontproperties=prop, color="black", va="top", ha="left")
    canvas.draw()
    rgba = np.asarray(canvas.buffer_rgba())
    assert rgba.shape[:2] == (h, w), rgba.shape
    return rgba[..., :3].astype(np.float64).mean(axis=2)


def _ink_box(grey: np.ndarray, rows: slice) -> tuple[int, int, int, int]:
    """The tight box of the dark pixels (< 128) in ``rows`` of ``grey``."""
    ink = grey[rows] < 128
    ys, xs = np.nonzero(ink)
    if not len(ys):
        raise ValueError("a rendered line has no ink (page too small for its text?)")
    return int(xs.min()), int(ys.min()) + rows.start, int(xs.max()) + 1, int(ys.max()) + 1 + rows.start


def _bgr(grey: np.ndarray) -> np.ndarray:
    g = np.clip(np.rint(grey), 0, 255).astype(np.uint8)
    return np.ascontiguousarray(np.repeat(g[..., None], 3, axis=2))


def render_page(seed: int = 0, lines: int = 4, size: tuple[int, int] = PAGE_SIZE, points: float = FONT_POINTS) -> Page:
    """A page of ``lines`` text lines (strings from ``seed``), left margins and spacing drawn from the seed."""
    h, w = size
    rng = np.random.default_rng(seed + 1_000_003)
    px = points * DPI / 72
    pitch = h / lines
    if pitch < 1.6 * px:
        raise ValueError(f"{lines} lines of {points} pt do not fit a page {h} px high")
    texts, origins = [], []
    for i, s in enumerate(strings(seed, lines)):
        # the line must fit the width: drop words until it does (about 0.6 em per character)
        while len(s) * 0.6 * px > w - 24 and " " in s:
            s = s.rsplit(" ", 1)[0]
        texts.append(s)
        slack = max(0.0, pitch - 1.3 * px)
        origins.append((float(rng.uniform(8, 24)), i * pitch + float(rng.uniform(0.2, 0.8)) * slack))
    grey = _draw(size, texts, origins, points)
    boxes = []
    for i in range(lines):
        top = int(origins[i][1])
        bottom = int(origins[i + 1][1]) if i + 1 < lines else h
        boxes.append(_ink_box(grey, slice(top, bottom)))
    return Page(_bgr(grey), np.array(boxes, dtype=np.int64), texts)


def render_line(text: str, points: float = FONT_POINTS, margin: int = 4) -> np.ndarray:
    """One line of ``text`` cropped to its ink plus ``margin`` pixels (H x W x 3 uint8 BGR)."""
    px = points * DPI / 72
    size = (int(2 * px) + 2 * margin, int(len(text) * 0.75 * px) + 4 * margin + 8)
    grey = _draw(size, [text], [(2 * margin, margin)], points)
    x0, y0, x1, y1 = _ink_box(grey, slice(0, size[0]))
    return _bgr(grey[max(0, y0 - margin) : y1 + margin, max(0, x0 - margin) : x1 + margin])


def rotated_lines(seed: int, n: int) -> tuple[list[np.ndarray], np.ndarray]:
    """``n`` rendered lines, every other one turned by 180 degrees; labels (0: upright, 1: 180) as the angle
    classifier numbers them (``label_list: ['0', '180']``)."""
    texts = strings(seed, n, words=(1, 2))
    crops, labels = [], []
    for i, t in enumerate(texts):
        img = render_line(t)
        flip = i % 2
        crops.append(np.ascontiguousarray(img[::-1, ::-1]) if flip else img)
        labels.append(flip)
    return crops, np.array(labels, dtype=np.int64)


def det_input(image: np.ndarray) -> np.ndarray:
    """``[1, 3, H, W]`` float32: the detector's input for ``image`` (sides must be multiples of 32)."""
    h, w = image.shape[:2]
    if h % 32 or w % 32:
        raise ValueError(f"the detector needs sides that are multiples of 32, got {h}x{w}")
    x = (image.astype(np.float32) / 255.0 - np.array(DET_MEAN, np.float32)) / np.array(DET_STD, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None], dtype=np.float32)


def _resize_h(img: np.ndarray, height: int, max_width: int | None) -> np.ndarray:
    from PIL import Image

    h, w = img.shape[:2]
    nw = max(1, math.ceil(height * w / h))
    if max_width is not None:
        nw = min(nw, max_width)
    return np.asarray(Image.fromarray(img).resize((nw, height), Image.BILINEAR))


def line_input(crops: list[np.ndarray], width: int | None = None, height: int = LINE_HEIGHT) -> np.ndarray:
    """``[N, 3, height, W]`` float32 for the recognizer (``width=None``: W fits the widest crop, at least
    320 as PaddleOCR pads) or the classifier (``width=192``: wider crops squeezed)."""
    resized = [_resize_h(c, height, width) for c in crops]
    w = width or max(320, max(r.shape[1] for r in resized))
    out = np.zeros((len(crops), 3, height, w), np.float32)
    for i, r in enumerate(resized):
        out[i, :, :, : r.shape[1]] = (r.astype(np.float32).transpose(2, 0, 1) / 255.0 - 0.5) / 0.5
    return out


def cls_input(crops: list[np.ndarray]) -> np.ndarray:
    """``[N, 3, 48, 192]`` float32 for the angle classifier."""
    return line_input(crops, width=CLS_WIDTH)
