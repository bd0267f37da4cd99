"""Normalizations before a layer (input side): the scale always folds, the shift
only into a consumer without padding, never into a transposed conv."""

from __future__ import annotations

import numpy as np
import pytest
from onnx_testkit import G, check_fold, ops

from bnfold.onnx import fold_onnx
from bnfold.report import Code

AFFINE = ("BatchNormalization", "Mul", "Div", "Add", "Sub")


@pytest.mark.parametrize("group", [1, 2])
@pytest.mark.parametrize(
    "attrs",
    [
        dict(),
        dict(strides=[2, 2], dilations=[1, 2]),
        dict(auto_pad="VALID"),
        dict(auto_pad="SAME_UPPER", kernel_shape=[1, 1]),
    ],
)
def test_bn_before_unpadded_conv(group, attrs):
    g = G(seed=group)
    x = g.input("x", [2, 4, 6, 7])
    y = g.bn(x, 4, "bn")
    k = 1 if "kernel_shape" in attrs else 3
    g.output(
        g.node("Conv", [y, g.randn("W", 6, 4 // group, k, k), g.randn("B", 6)], "y", name="conv", group=group, **attrs)
    )
    r = check_fold(g.model(), g.feeds, folded=1)
    f = r.report.folded[0]
    assert (f.norm, f.into, f.pattern, f.side) == ("bn", "conv", "BatchNormalization+Conv", "input")
    assert r.model.graph.node[0].input[0] == "x"


def test_bn_before_padded_conv_is_skipped():
    g = G()
    x = g.input("x", [2, 4, 6, 6])
    g.output(g.node("Conv", [g.bn(x, 4, "bn"), g.randn("W", 6, 4, 3, 3)], "y", name="conv", pads=[1, 1, 1, 1]))
    m = g.model()
    r = fold_onnx(m)
    (s,) = r.report.skipped
    assert s.norm == "bn" and s.code == Code.SHIFT_PADDING
    assert r.model.SerializeToString() == m.SerializeToString()


def test_scale_only_before_padded_conv_folds():
    g = G()
    x = g.input("x", [2, 4, 6, 6])
    y = g.node("Mul", [x, g.randn("s", 1, 4, 1, 1)], "m", name="mul")
    g.output(g.node("Conv", [y, g.randn("W", 6, 4, 3, 3)], "y", name="conv", pads=[1, 1, 1, 1]))
    r = check_fold(g.model(), g.feeds, folded=1, gone=AFFINE)
    assert r.report.folded[0].pattern == "Mul+Conv"


@pytest.mark.parametrize("pads", [0, 1])
def test_preprocessing_normalize(pads):
    """(x - mean) / std before the first conv: everything folds without padding; with
    padding the scale (Div) folds and the shift (Sub) stays, reported."""
    g = G()
    x = g.input("x", [2, 3, 8, 8])
    y = g.node("Sub", [x, g.init("mean", np.array([0.485, 0.456, 0.406]).reshape(1, 3, 1, 1))], "xc", name="sub")
    y = g.node("Div", [y, g.init("std", np.array([0.229, 0.224, 0.225]).reshape(1, 3, 1, 1))], "xn", name="div")
    g.output(g.node("Conv", [y, g.randn("W", 4, 3, 3, 3)], "y", name="conv", pads=[pads] * 4))
    if pads == 0:
        r = check_fold(g.model(), g.feeds, folded=1, gone=AFFINE)
        assert r.report.folded[0].norm == "affine sub+div" and ops(r.model) == ["Conv"]
    else:
        r = check_fold(g.model(), g.feeds, folded=1, gone=("Div",), skipped=0)
        assert r.report.folded[0].norm == "affine div" and ops(r.model) == ["Sub", "Conv"]
        (kept,) = r.report.kept_ops  # a Sub is no normalization: a note, not a skip
        assert kept.op == "sub" and kept.code == Code.SHIFT_PADDING


def test_conv_transpose_scale_folds_shift_does_not():
    g = G()
    x = g.input("x", [2, 4, 5, 5])
    y = g.node("Mul", [x, g.randn("s", 4, 1, 1)], "m", name="mul")
    g.output(g.node("ConvTranspose", [y, g.randn("W", 4, 3, 3, 3)], "y", name="ct", group=2))
    r = check_fold(g.model(), g.feeds, folded=1, gone=AFFINE)
    assert r.report.folded[0].pattern == "Mul+ConvTranspose"
    g = G()
    x = g.input("x", [2, 4, 5, 5])
    g.output(g.node("ConvTranspose", [g.bn(x, 4, "bn"), g.randn("W", 4, 3, 3, 3)], "y", name="ct", group=2))
    r = fold_onnx(g.model())
    assert not r.report.folded and r.report.skipped[0].code == Code.SHIFT_TRANSPOSED


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("with_c", [False, True])
def test_bn_before_gemm(trans_b, with_c):
    g = G(seed=trans_b)
    x = g.input("x", [3, 5])
    ins = [g.bn(x, 5, "bn"), g.randn("B", *((6, 5) if trans_b else (5, 6)))] + ([g.randn("C", 6)] if with_c else [])
    g.output(g.node("Gemm", ins, "y", name="gemm", transB=trans_b, alpha=0.5, beta=2.0))
    r = check_fold(g.model(), g.feeds, folded=1)
    assert r.report.folded[0].pattern == "BatchNormalization+Gemm"


def test_affine_before_gemm_trans_a():
    g = G()
    x = g.input("x", [5, 3])  # A = x^T: channels (K = 5) on axis 0
    y = g.node("Mul", [x, g.randn("s", 5, 1)], "m", name="mul")
    y = g.node("Add", [y, g.randn("t", 5, 1)], "a", name="add")
    g.output(g.node("Gemm", [y, g.randn("B", 5, 6), g.randn("C", 6)], "y", name="gemm", transA=1))
    check_fold(g.model(), g.feeds, folded=1, gone=AFFINE)


@pytest.mark.parametrize("bias", [False, True])
def test_bn_before_matmul(bias):
    g = G(seed=int(bias))
    x = g.input("x", [3, 5])
    y = g.node("MatMul", [g.bn(x, 5, "bn"), g.randn("Wm", 5, 6)], "mm", name="mm")
    if bias:
        y = g.node("Add", [y, g.randn("b", 6)], "y", name="add")
    g.output(y)
    r = check_fold(g.model(), g.feeds, folded=1)
    assert ops(r.model) == ["MatMul", "Add"]
    assert r.model.graph.node[-1].output[0] == ("y" if bias else "mm")


def test_affine_before_matmul_rank3():
    g = G()
    x = g.input("x", [2, 3, 5])
    y = g.node("Add", [g.node("Mul", [x, g.randn("s", 5)], "m", name="mul"), g.randn("t", 1, 5)], "a", name="add")
    g.output(g.node("MatMul", [y, g.randn("Wm", 5, 6)], "y", name="mm"))
    r = check_fold(g.model(), g.feeds, folded=1, gone=("Mul", "Sub", "Div"))
    assert ops(r.model) == ["MatMul", "Add"]


def test_bn_output_with_another_user_is_skipped():
    g = G()
    x = g.input("x", [2, 4, 6, 6])
    y = g.bn(x, 4, "bn")
    g.output(g.node("Conv", [y, g.randn("W", 6, 4, 1, 1)], "y", name="conv"), g.node("Relu", [y], "r", name="relu"))
    r = fold_onnx(g.model())
    (s,) = r.report.skipped
    # the fan-out rule: one user cannot take the fold
    assert s.code == Code.FANOUT_NOT_ALL_LAYERS, s


@pytest.mark.parametrize("padded_first", [False, True])
def test_a_fanout_refused_by_a_shape_says_so_whatever_the_order(padded_first):
    """A shifting BatchNorm before two convs, one padded (the shift cannot fold into it) and one whose folded weight
    would overflow float32: the refusal reported is the padding's, read from shapes before any weight is read, in
    either order of the consumers (the overflow is only found by reading the weight).  Nothing is folded."""
    g = G()
    x = g.input("x", [1, 4, 6, 6])
    y = g.bn(x, 4, "bn")
    padded = g.node("Conv", [y, g.randn("WB", 4, 4, 3, 3)], "yb", name="padded", pads=[1, 1, 1, 1])
    huge = g.node("Conv", [y, g.init("WA", np.full((4, 4, 1, 1), 3e38, np.float32))], "ya", name="huge")
    g.output(*((padded, huge) if padded_first else (huge, padded)))
    m = g.model()
    r = fold_onnx(m)
    (s,) = r.report.skipped
    assert s.norm == "bn" and s.code == Code.SHIFT_PADDING, s
    assert not r.report.folded and r.model.SerializeToString() == m.SerializeToString()


def test_a_constant_refused_for_its_rank_is_not_converted(monkeypatch):
    """A Mul whose constant broadcasts ``x`` to another rank stops the chain from its shapes: the constant is never
    made a float64 tensor (with 4ba0eb9 a 128 MiB one was converted, and kept, before the same refusal)."""
    import bnfold.onnx.graph as onnx_graph

    g = G()
    x = g.input("x", [1, 4, 6, 6])
    y = g.node("Conv", [x, g.randn("W", 4, 4, 1, 1)], "c", name="conv")
    m = g.node("Mul", [y, g.randn("big", 2, 1, 1, 1, 1)], "m", name="mul")
    g.output(g.bn(m, 4, "bn"))
    converted, real = [], onnx_graph.to_torch
    monkeypatch.setattr(onnx_graph, "to_torch", lambda t, *a, **k: converted.append(t.shape) or real(t, *a, **k))
    r = fold_onnx(g.model())
    assert [s.code for s in r.report.skipped] == [Code.NO_LAYER] and not r.report.folded, r.report.skipped
    assert (2, 1, 1, 1, 1) not in converted, converted
