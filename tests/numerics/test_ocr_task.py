"""The OCR task on one rendered page (the trained PaddleOCR models of the rapidocr wheels): PP-OCRv4 det loses
every text region in half precision and gets fp32's back when folded; ONNX Runtime on the float16 model
ONNX Runtime users convert to, unfolded vs folded; the angle classifier on rendered, rotated lines."""

import numpy as np
import pytest

from bnfold.demo.ctc import characters
from bnfold.demo.ocr_metrics import cer
from bnfold.demo.ocr_runners import folded_model, runner
from bnfold.demo.ocr_task import READ_PAD, classify, detect, load_model, read, read_regions
from bnfold.demo.pages import render_page, rotated_lines

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def page():
    return render_page(0)


@pytest.fixture(scope="module")
def det():
    model = load_model("v4-det")
    return model, folded_model(model)


@pytest.fixture(scope="module")
def fp32(det, page):
    d = detect(runner(det[0], "fp32"), page)
    # the page is read: every rendered line is one fp32 region, and there is nothing else
    assert d.truth.matched == d.truth.truth == len(d.regions) == len(page.texts) == 4
    return d


def _same_regions(d, fp32) -> bool:
    m = d.fp32
    return m.matched == m.truth == m.found == len(fp32.regions)


def test_v4_det_in_half_precision_finds_nothing_unfolded_and_fp32s_regions_folded(det, page, fp32):
    """The ``fp16`` profile (PyTorch's CPU half): one BatchNorm's running variance (~1e8) is inf in fp16,
    its scale 0, the probability map flat: no region.  Folded, the statistics live in the conv's weights."""
    unfolded = detect(runner(det[0], "fp16"), page, fp32.regions)
    assert unfolded.regions == [] and float(np.nanmax(unfolded.prob)) < 0.3
    folded = detect(runner(det[1], "fp16"), page, fp32.regions)
    assert _same_regions(folded, fp32) and all(iou > 0.9 for _, _, iou in folded.fp32.pairs)
    assert folded.mask_iou(fp32) > 0.98


def test_v4_det_onnxruntime_fp16_unfolded_vs_folded(det, page, fp32):
    """ONNX Runtime on ``convert_float_to_float16(keep_io_types=True)``: unfolded the text mask comes apart
    (other regions, fp32's mask lost); folded it finds exactly fp32's regions.  bnfold's ``ort-cpu``
    profile predicts the unfolded run's mask."""
    unfolded = detect(runner(det[0], "ort-fp16"), page, fp32.regions)
    folded = detect(runner(det[1], "ort-fp16"), page, fp32.regions)
    assert _same_regions(folded, fp32) and folded.mask_iou(fp32) > 0.98
    assert not _same_regions(unfolded, fp32) and unfolded.mask_iou(fp32) < 0.9
    emulated = detect(runner(det[0], "ort-cpu"), page, fp32.regions)
    assert emulated.mask_iou(unfolded) > 0.97  # (identical on the machine this was written on)
    assert abs(len(emulated.regions) - len(unfolded.regions)) <= 1  # float32 kernels differ between CPUs


def test_v4_rec_reads_the_regions_alike_in_fp16(page, fp32):
    """The recognizer is unaffected: the fp16 runtimes read each ground-truth line and each fp32 region as
    fp32 does."""
    model = load_model("v4-rec")
    table = characters(model)
    crops = page.crops(pad=READ_PAD)
    want = read(runner(model, "fp32"), table, crops)
    assert cer(want, page.texts) < 0.1  # fp32 reads the rendered page (it may drop a space)
    for how in ("ort-fp16", "fp16"):
        assert read(runner(model, how), table, crops) == want
    in_regions = read_regions(runner(model, "fp32"), table, page, fp32.regions)
    assert read_regions(runner(model, "ort-fp16"), table, page, fp32.regions) == in_regions


def test_cls_top1_on_rotated_lines():
    """The angle classifier tells upright from 180-degree lines in fp32, and every fp16 run agrees."""
    model = load_model("cls")
    folded = folded_model(model)
    crops, labels = rotated_lines(3, 8)
    assert labels.tolist() == [0, 1] * 4
    want = classify(runner(model, "fp32"), crops)
    assert want.tolist() == labels.tolist()
    for m, how in ((model, "ort-fp16"), (folded, "ort-fp16"), (model, "fp16"), (folded, "fp16")):
        assert classify(runner(m, how), crops).tolist() == want.tolist()
