"""The OCR task on rendered text, shared by ``benchmarks/task_accuracy.py``, ``bnfold demo`` and the tests:
detect regions on a page, read a region's line, classify a line's angle, with the trained PaddleOCR models
the rapidocr wheels ship (their ``models/*.onnx`` files; the packages are not imported)."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx

from .ctc import ctc_greedy
from .db_postprocess import THRESH, Region, det_regions
from .ocr_metrics import Match, match_regions
from .pages import Page, cls_input, det_input, line_input

#: key: (label, package, file)
MODELS = {
    "v4-det": ("PP-OCRv4 det", "rapidocr_onnxruntime", "ch_PP-OCRv4_det_infer.onnx"),
    "v6-det": ("PP-OCRv6 det", "rapidocr", "PP-OCRv6_det_small.onnx"),
    "v4-rec": ("PP-OCRv4 rec", "rapidocr_onnxruntime", "ch_PP-OCRv4_rec_infer.onnx"),
    "v6-rec": ("PP-OCRv6 rec", "rapidocr", "PP-OCRv6_rec_small.onnx"),
    "cls": ("angle cls v2.0", "rapidocr_onnxruntime", "ch_ppocr_mobile_v2.0_cls_infer.onnx"),
}
#: pixels added around a ground-truth box before it is read (a detected region already has its margin)
READ_PAD = 3

Run = Callable[[np.ndarray], np.ndarray]


def model_file(package: str, name: str) -> str | None:
    """The installed model file, or None (found through the package folder; the package is not imported)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "models", name)
    return path if os.path.exists(path) else None


def load_model(key: str) -> onnx.ModelProto:
    """The installed model; ValueError (one line) when its wheel is not installed."""
    _, package, name = MODELS[key]
    path = model_file(package, name)
    if path is None:
        raise ValueError(f"{name} is not installed (the {package} wheel; `make install` installs it)")
    return onnx.load(path)


@dataclass
class Detection:
    """The regions one run found on a page (and the probability map they come from), matched against the
    ground truth and against fp32's regions."""

    prob: np.ndarray
    regions: list[Region]
    truth: Match
    fp32: Match | None = None

    def mask_iou(self, other: Detection, thresh: float = THRESH) -> float:
        """IoU of the text masks (probability > ``thresh``) of two runs on the same page."""
        a = np.nan_to_num(self.prob, nan=0.0) > thresh
        b = np.nan_to_num(other.prob, nan=0.0) > thresh
        union = np.count_nonzero(a | b)
        return np.count_nonzero(a & b) / union if union else 1.0


def detect(run: Run, page: Page, fp32: list[Region] | None = None) -> Detection:
    """Run the detector on ``page``; its regions and their matches."""
    prob = np.asarray(run(det_input(page.image)))
    prob = prob.reshape(prob.shape[-2:])
    regions = det_regions(prob)
    shape = page.image.shape[:2]
    truth = match_regions(page.boxes, regions, shape)
    return Detection(prob, regions, truth, None if fp32 is None else match_regions(fp32, regions, shape))


def read(run: Run, table: list[str], crops: list[np.ndarray]) -> list[str]:
    """The recognizer's text for each crop (one batch, padded to the widest)."""
    if not crops:
        return []
    return ctc_greedy(run(line_input(crops)), table)


def read_regions(run: Run, table: list[str], page: Page, regions: list[Region]) -> list[str]:
    """The text in each detected region (its axis-aligned box cut from the page)."""
    return read(run, table, page.crops([r.box for r in regions]))


def classify(run: Run, crops: list[np.ndarray]) -> np.ndarray:
    """The angle classifier's top-1 class per crop (0: upright, 1: turned by 180 degrees)."""
    return np.asarray(run(cls_input(crops))).argmax(axis=1)
