"""The OCR task's parts on hand-made inputs: rendered pages, DB post-processing, CTC decoding, matching."""

import math

import numpy as np
import pytest

from bnfold.demo.ctc import characters, ctc_greedy
from bnfold.demo.db_postprocess import det_regions, min_area_rect, polygon_mask
from bnfold.demo.ocr_metrics import cer, edit_distance, line_accuracy, match_regions
from bnfold.demo.pages import DET_MEAN, DET_STD, cls_input, det_input, line_input, render_page, strings


def test_pages_are_fixed_by_the_seed_and_boxes_hold_the_ink():
    a, b = render_page(5), render_page(5)
    assert np.array_equal(a.image, b.image) and a.texts == b.texts and np.array_equal(a.boxes, b.boxes)
    assert render_page(6).texts != a.texts and strings(1, 3) == strings(1, 3)
    h, w = a.image.shape[:2]
    assert a.image.dtype == np.uint8 and a.image.shape == (256, 512, 3)
    ink = a.image[..., 0] < 128
    inside = np.zeros_like(ink)
    for x0, y0, x1, y1 in a.boxes:
        assert 0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h
        inside[y0:y1, x0:x1] = True
        # a tight box: ink on each of its four edges
        assert ink[y0, x0:x1].any() and ink[y1 - 1, x0:x1].any() and ink[y0:y1, x0].any() and ink[y0:y1, x1 - 1].any()
    assert not (ink & ~inside).any()  # all ink is in a line's box


def test_model_inputs():
    page = render_page(0)
    x = det_input(page.image)
    assert x.shape == (1, 3, 256, 512) and x.dtype == np.float32
    white = (1 - np.array(DET_MEAN)) / np.array(DET_STD)
    assert np.allclose(x[0, :, 0, -1], white, atol=1e-6)  # the top-right pixel is paper
    with pytest.raises(ValueError, match="multiples of 32"):
        det_input(page.image[:250])
    crops = page.crops(pad=3)
    r = line_input(crops)
    assert r.shape[:3] == (4, 3, 48) and r.shape[3] >= 320 and r.min() >= -1 and r.max() <= 1
    # each crop keeps its aspect ratio, the rest of the row is zero padding
    for i, c in enumerate(crops):
        width = math.ceil(48 * c.shape[1] / c.shape[0])
        assert r[i, :, :, :width].max() == 1.0 and not r[i, :, :, width:].any()
    assert cls_input(crops).shape == (4, 3, 48, 192)


def test_min_area_rect_of_a_turned_rectangle():
    t = math.radians(20)
    u, v = np.array([math.cos(t), math.sin(t)]), np.array([-math.sin(t), math.cos(t)])
    pts = np.array([a * u + b * v for a in np.linspace(0, 30, 31) for b in np.linspace(0, 8, 9)]) + 50
    quad, w, h = min_area_rect(pts)
    assert sorted([w, h]) == pytest.approx([8, 30], abs=1e-9)
    assert quad[0][0] < quad[1][0] and quad[0][1] < quad[3][1]  # top-left, top-right, ..., bottom-left


def test_db_post_processing_on_a_drawn_map():
    prob = np.zeros((64, 128))
    prob[10:20, 10:70] = 0.9  # a text kernel 60 x 10
    prob[40:42, 10:70] = 0.9  # too thin: short side 1 (pixel centres) < min_size 3
    prob[50:60, 100:110] = 0.4  # above the threshold, under the box threshold 0.6
    (r,) = det_regions(prob)
    # pixel centres span 59 x 9; unclip grows each side by area * 1.5 / perimeter
    d = 59 * 9 * 1.5 / (2 * (59 + 9))
    assert r.box == pytest.approx((round(10 - d), round(10 - d), round(69 + d), round(19 + d)))
    assert r.score == pytest.approx(0.9)
    assert det_regions(np.full((32, 32), np.nan)) == []
    assert det_regions(prob, box_thresh=0.3)[-1].box[0] < 100  # the faint blob counts at a lower box threshold


def test_matching_and_text_metrics():
    truth = [(10, 10, 50, 20), (10, 40, 50, 50)]
    found = [(11, 41, 50, 50), (10, 10, 29, 20), (100, 10, 120, 20)]
    m = match_regions(truth, found, (64, 128))
    assert m.matched == 1 and m.partner(1) == 0 and m.partner(0) is None  # 19 of 40 columns: IoU 0.475
    assert m.recall == 0.5 and m.precision == pytest.approx(1 / 3)
    assert match_regions(truth, [(10, 10, 30, 20)], (64, 128)).pairs == ((0, 0, 0.5),)  # IoU 0.5 matches
    assert polygon_mask(np.array([[0, 0], [3, 0], [3, 1], [0, 1]]), (4, 4)).sum() == 8
    assert edit_distance("kitten", "sitting") == 3 and edit_distance("", "ab") == 2
    assert cer(["ab", "cd"], ["ab", "ce"]) == 0.25 and line_accuracy(["ab", "cd"], ["ab", "ce"]) == 0.5


def test_ctc_greedy_merges_repeats_and_drops_blanks():
    table = ["", "a", "b", " "]
    steps = [1, 1, 0, 1, 2, 2, 3, 0, 3, 2]  # a a - a b b _ - _ b
    logits = np.eye(4)[steps][None]
    assert ctc_greedy(logits, table) == ["aab  b"]
    with pytest.raises(ValueError, match="recognizer outputs"):
        ctc_greedy(logits[:, :, :3], table)

    class Meta:
        metadata_props = [type("P", (), {"key": "character", "value": "x\ny"})()]

    assert characters(Meta()) == ["", "x", "y", " "]
