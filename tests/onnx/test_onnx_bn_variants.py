"""BatchNormalization across opsets, legacy attributes and dtypes."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ref
import pytest
from onnx_testkit import G, check_fold, ops, ort_run, rel_err

from bnfold.onnx import fold_onnx
from bnfold.report import Code


@pytest.mark.parametrize("opset", [7, 9, 13, 14, 15, 21])
def test_bn_opsets(opset):
    g = G(seed=opset)
    x = g.input("x", [2, 3, 5, 5])
    c = g.node("Conv", [x, g.randn("W", 4, 3, 3, 3), g.randn("B", 4)], "c", name="conv")
    attrs = {"epsilon": 1e-3}
    if opset >= 14:
        attrs["training_mode"] = 0
    if opset < 9:
        attrs["spatial"] = 1
    g.output(g.bn(c, 4, "bn", out="y", **attrs))
    check_fold(g.model(opset=opset), g.feeds, folded=1)


def test_bn_opset6_is_test():
    g = G()
    x = g.input("x", [2, 3, 5, 5])
    c = g.node("Conv", [x, g.randn("W", 4, 3, 3, 3)], "c", name="conv")
    g.output(g.bn(c, 4, "bn", out="y", is_test=1))
    r = fold_onnx(g.model(opset=6))
    assert len(r.report.folded) == 1 and "BatchNormalization" not in ops(r.model)
    g2 = G()
    x = g2.input("x", [2, 3, 5, 5])
    c = g2.node("Conv", [x, g2.randn("W", 4, 3, 3, 3)], "c", name="conv")
    g2.output(g2.bn(c, 4, "bn", out="y", is_test=0))
    r = fold_onnx(g2.model(opset=6))
    assert not r.report.folded and r.report.skipped[0].code == Code.TRAINING_MODE


@pytest.mark.parametrize("rank", [2, 4])
def test_spatial0_per_channel_shapes_fold(rank):
    g = G(seed=rank)
    if rank == 4:  # spatial=0 wants stats [C, H, W]: per-channel when H = W = 1
        x = g.input("x", [2, 3, 1, 1])
        y = g.node("Conv", [x, g.randn("W", 4, 3, 1, 1)], "c", name="conv")
        shape = (4, 1, 1)
    else:
        x = g.input("x", [3, 5])
        y = g.node("Gemm", [x, g.randn("Wg", 4, 5), g.randn("C", 4)], "c", name="gemm", transB=1)
        shape = (4,)
    r = g.rng
    stats = [
        g.init(n, v.reshape(shape))
        for n, v in (
            ("s", r.uniform(-2, 2, 4)),
            ("b", r.uniform(-1, 1, 4)),
            ("m", r.uniform(-1, 1, 4)),
            ("v", r.uniform(0.5, 2, 4)),
        )
    ]
    g.output(g.node("BatchNormalization", [y, *stats], "y", name="bn", spatial=0))
    check_fold(g.model(opset=7), g.feeds, folded=1)


def test_spatial0_per_element_stats_skip():
    g = G()
    x = g.input("x", [2, 3, 5, 5])
    y = g.node("Conv", [x, g.randn("W", 4, 3, 3, 3)], "c", name="conv")
    r = g.rng
    stats = [
        g.init(n, v)
        for n, v in (
            ("s", r.uniform(-2, 2, (4, 3, 3))),
            ("b", r.uniform(-1, 1, (4, 3, 3))),
            ("m", r.uniform(-1, 1, (4, 3, 3))),
            ("v", r.uniform(0.5, 2, (4, 3, 3))),
        )
    ]
    g.output(g.node("BatchNormalization", [y, *stats], "y", name="bn", spatial=0))
    m = g.model(opset=7)
    r = fold_onnx(m)
    assert not r.report.folded
    (s,) = r.report.skipped
    assert s.norm == "bn" and s.code == Code.NOT_PER_CHANNEL and s.producer == "conv"
    assert r.model.SerializeToString() == m.SerializeToString()


def test_fp16_model_fp32_stats():
    g = G(seed=5)
    x = g.input("x", [2, 3, 6, 6], dtype=np.float16)
    y = g.node(
        "Conv",
        [x, g.randn("W", 8, 3, 3, 3, dtype=np.float16, scale=0.5), g.randn("B", 8, dtype=np.float16)],
        "c",
        name="conv",
        pads=[1, 1, 1, 1],
    )
    g.output(g.bn(y, 8, "bn", out="y", dtype=np.float32))
    r = check_fold(g.model(opset=15), g.feeds, folded=1, rel=5e-3)
    w = {t.name: t for t in r.model.graph.initializer}
    assert set(w) == {"W", "B"} and all(t.data_type == 10 for t in w.values())  # float16 kept


def test_fp16_everywhere():
    g = G(seed=6)
    x = g.input("x", [2, 3, 6], dtype=np.float16)
    y = g.node("Conv", [x, g.randn("W", 4, 3, 3, dtype=np.float16)], "c", name="conv")
    g.output(g.bn(y, 4, "bn", out="y", dtype=np.float16))
    check_fold(g.model(opset=15), g.feeds, folded=1, rel=5e-3)


def test_float64_model():  # ORT runs Gemm and BatchNormalization, not Conv, in float64
    g = G(seed=7)
    x = g.input("x", [3, 5], dtype=np.float64)
    y = g.node("Gemm", [x, g.randn("B", 5, 4, dtype=np.float64), g.randn("C", 4, dtype=np.float64)], "c", name="gemm")
    g.output(g.bn(y, 4, "bn", out="y", dtype=np.float64))
    r = check_fold(g.model(opset=15), g.feeds, folded=1, rel=1e-12)
    assert {t.data_type for t in r.model.graph.initializer} == {11}


def test_unused_optional_outputs_do_not_block():
    """Opset 9 may list the (empty) training outputs; nobody reads them, so the BN folds.
    (ORT crashes running such an original, so the folded model is checked against the reference only.)"""
    g = G()
    x = g.input("x", [2, 3, 5, 5])
    y = g.node("Conv", [x, g.randn("W", 4, 3, 3, 3)], "c", name="conv")
    g.output(g.node("BatchNormalization", [y, *g.bn_stats("bn", 4)], ["y", "", "", "", ""], name="bn"))
    m = g.model(opset=9)
    r = fold_onnx(m)
    onnx.checker.check_model(r.model, full_check=True)
    assert len(r.report.folded) == 1 and "BatchNormalization" not in ops(r.model)
    assert [o.name for o in r.model.graph.output] == ["y"] and r.model.graph.node[-1].output[0] == "y"
    (ref,) = onnx_ref.run(m, g.feeds)
    assert rel_err(ort_run(r.model, g.feeds)[0], ref) < 2e-5
