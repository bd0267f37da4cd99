"""The audit's ``mask_iou`` on a trained detector predicts what the real runtime does to the task.

PP-OCRv4 det (the rapidocr wheel's) on a rendered line of text, its probability map cut at 0.3 (what
PaddleOCR's DB post-processing does): the ``ort-cpu`` profile's mask IoU with fp32 is within 0.03 of
the IoU between ONNX Runtime on the float16 model (onnxconverter-common, ``keep_io_types=True``) and
ONNX Runtime on the float32 model.  A small page keeps the emulation cheap; the unfolded model is
the one that breaks, so only it is emulated here.
"""

import numpy as np
import pytest
import torch
from paddleocr_models import model_path

import bnfold
from bnfold.demo.pages import det_input, render_page

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxconverter_common")

THRESHOLD = 0.3


def _ort_map(model, x: np.ndarray) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def test_ort_cpu_mask_iou_predicts_onnx_runtime_on_the_float16_model():
    from bnfold.numerics.real_runtimes import float16_model

    model = onnx.load(model_path("v4-det"))
    x = det_input(render_page(0, lines=1, size=(64, 256)).image)
    fp32 = _ort_map(model, x) > THRESHOLD
    fp16 = _ort_map(float16_model(model), x) > THRESHOLD
    real = (fp32 & fp16).sum() / (fp32 | fp16).sum()
    assert fp32.sum() > 500 and real < 0.9  # the text is found in fp32, and fp16 damages the mask
    rep = bnfold.audit(model, [(torch.from_numpy(x),)], profile="ort-cpu", threshold=THRESHOLD, fold=False)
    assert abs(rep.unfolded.mask_iou - real) <= 0.03, (rep.unfolded.mask_iou, real)
