"""Affine chains (Mul/Div/Add/Sub by constants), shape-only hops and fixed-point
folding of several normalizations in a row."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx_testkit import G, check_fold, ops

from bnfold.onnx import fold_onnx
from bnfold.report import Code

AFFINE = ("BatchNormalization", "Mul", "Div", "Add", "Sub")


def _conv(g: G, c: int = 4):
    x = g.input("x", [2, 3, 5, 5])
    return g.node("Conv", [x, g.randn("W", c, 3, 3, 3), g.randn("B", c)], "c", name="conv", pads=[1, 1, 1, 1])


@pytest.mark.parametrize("shape", [(4, 1, 1), (1, 4, 1, 1), (), (1,), (1, 1, 1, 1)])
@pytest.mark.parametrize("op", ["Mul", "Div", "Add", "Sub", "RSub"])
def test_single_affine_after_conv(op, shape):
    g = G(seed=len(shape))
    c = _conv(g)
    k = g.init("k", g.rng.uniform(0.5, 2, shape) * np.where(g.rng.random(shape) < 0.5, -1, 1))
    ins = [k, c] if op == "RSub" else [c, k]
    g.output(g.node("Sub" if op == "RSub" else op, ins, "y", name="aff"))
    r = check_fold(g.model(), g.feeds, folded=1, gone=AFFINE)
    f = r.report.folded[0]
    assert (f.norm, f.into, f.side, f.node) == ("affine aff", "conv", "output", "aff")
    assert f.pattern == "Conv+" + ("Sub" if op == "RSub" else op)


def test_affine_chain_is_one_fold_and_named_readably():
    g = G()
    c = _conv(g)
    m = g.node("Mul", [c, g.randn("s", 4, 1, 1)], "m", name="scale")
    a = g.node("Add", [m, g.randn("t", 4, 1, 1)], "a", name="shift")
    g.output(g.node("Div", [a, g.init("d", np.float32(3.0))], "y", name="div"))
    r = check_fold(g.model(), g.feeds, folded=1, gone=AFFINE)
    f = r.report.folded[0]
    assert (f.norm, f.node, f.pattern) == ("affine scale+shift+div", "scale", "Conv+Mul+Add+Div")


def test_matmul_affine_on_last_axis():
    g = G()
    x = g.input("x", [2, 3, 5])
    y = g.node("MatMul", [x, g.randn("Wm", 5, 6)], "mm", name="mm")
    y = g.node("Mul", [y, g.randn("s", 6)], "m", name="mul")
    g.output(g.node("Sub", [y, g.randn("t", 1, 1, 6)], "y", name="sub"))
    r = check_fold(g.model(), g.feeds, folded=1, gone=("Mul", "Sub"))
    assert ops(r.model) == ["MatMul", "Add"]  # the shift became the MatMul's bias
    assert [n.name for n in r.model.graph.node] == ["mm", "mm_bias_add"]


# ----------------------------------------------------------------- fixed point
def test_conv_bn_bn():
    g = G()
    c = _conv(g)
    g.output(g.bn(g.bn(c, 4, "bn1"), 4, "bn2", out="y"))
    r = check_fold(g.model(), g.feeds, folded=2)
    assert [f.norm for f in r.report.folded] == ["bn1", "bn2"]
    assert ops(r.model) == ["Conv"]


def test_conv_affine_bn_affine_bn():
    g = G()
    c = _conv(g)
    y = g.node("Mul", [c, g.randn("s", 1, 4, 1, 1)], "m", name="mul")
    y = g.node("Add", [y, g.randn("t", 4, 1, 1)], "a", name="add")
    y = g.bn(y, 4, "bn1")
    y = g.node("Sub", [y, g.randn("u", 4, 1, 1)], "sub_out", name="sub")
    g.output(g.bn(y, 4, "bn2", out="y"))
    r = check_fold(g.model(), g.feeds, folded=2, gone=AFFINE)  # one chain: an entry per BatchNormalization
    assert ops(r.model) == ["Conv"] and [f.norm for f in r.report.folded] == ["bn1", "bn2"]


def test_gemm_bn_unsqueeze_bn():
    g = G()
    x = g.input("x", [3, 5])
    y = g.node("Gemm", [x, g.randn("Wg", 6, 5), g.randn("C", 6)], "gm", name="gemm", transB=1)
    y = g.bn(y, 6, "bn1")
    y = g.node("Unsqueeze", [y, g.init("ax", np.array([2, 3]), np.int64)], "u", name="unsq")
    g.output(g.bn(y, 6, "bn2", out="y"))
    r = check_fold(g.model(opset=13), g.feeds, folded=2)
    assert r.report.folded[1].pattern == "Gemm+BatchNormalization+Unsqueeze+BatchNormalization"
    assert ops(r.model) == ["Gemm", "Unsqueeze"]


# ----------------------------------------------------------------------- hops
def test_hop_identity_dropout():
    g = G()
    c = _conv(g)
    y = g.node("Identity", [c], "i", name="id")
    y = g.node("Dropout", [y], "d", name="drop")
    g.output(g.bn(y, 4, "bn", out="y"))
    r = check_fold(g.model(opset=12), g.feeds, folded=1)
    assert r.report.folded[0].pattern == "Conv+Identity+Dropout+BatchNormalization"
    assert ops(r.model) == ["Conv", "Identity", "Dropout"]


@pytest.mark.parametrize("opset", [11, 13])
def test_hop_unsqueeze_squeeze(opset):
    g = G(seed=opset)
    x = g.input("x", [3, 5])
    y = g.node("Gemm", [x, g.randn("Wg", 6, 5)], "gm", name="gemm", transB=1)
    if opset >= 13:
        y = g.node("Unsqueeze", [y, g.init("ax", np.array([-1, 0]), np.int64)], "u", name="unsq")  # [1, N, C, 1]
        y = g.node("Squeeze", [y, g.init("ax0", np.array([0]), np.int64)], "sq", name="sq")  # [N, C, 1]
    else:
        y = g.node("Unsqueeze", [y], "u", name="unsq", axes=[0, 3])
        y = g.node("Squeeze", [y], "sq", name="sq", axes=[0])
    g.output(g.bn(y, 6, "bn", out="y"))
    check_fold(g.model(opset=opset), g.feeds, folded=1)


def test_hop_reshape_keeps_channels():
    g = G()
    c = _conv(g)  # [2, 4, 5, 5]
    y = g.node("Reshape", [c, g.init("shape", np.array([0, 4, -1]), np.int64)], "r", name="reshape")  # [2, 4, 25]
    y = g.node("Mul", [y, g.randn("s", 4, 1)], "m", name="mul")
    g.output(g.bn(y, 4, "bn", out="y"))
    r = check_fold(g.model(), g.feeds, folded=1, gone=AFFINE)  # Mul and BN: one chain, reported by the BN
    assert ops(r.model) == ["Conv", "Reshape"] and r.report.folded[0].pattern == "Conv+Reshape+Mul+BatchNormalization"


def test_hop_reshape_with_dynamic_batch():
    g = G()
    x = g.input("x", ["N", 5])
    y = g.node("Gemm", [x, g.randn("Wg", 6, 5)], "gm", name="gemm", transB=1)
    y = g.node("Reshape", [y, g.init("shape", np.array([-1, 6, 1, 1]), np.int64)], "r", name="reshape")
    g.output(g.bn(y, 6, "bn", out="y"))
    check_fold(g.model(), g.feeds, folded=1)


# ----------------------------------------------------------------- property
_CONST_SHAPES = [(4, 1, 1), (1, 4, 1, 1), (), (1,), (1, 1, 1)]


@st.composite
def _chains(draw):
    steps = draw(
        st.lists(
            st.sampled_from(["bn", "Mul", "Div", "Add", "Sub", "RSub", "Identity", "Reshape"]), min_size=1, max_size=6
        )
    )
    shapes = [draw(st.sampled_from(_CONST_SHAPES)) for _ in steps]
    signs = [draw(st.sampled_from([-1.0, 1.0])) for _ in steps]
    kind = draw(st.sampled_from(["Conv", "ConvTranspose"]))
    return kind, steps, shapes, signs


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_chains())
def test_random_chains_fold_completely(chain):
    kind, steps, shapes, signs = chain
    g = G(seed=len(steps))
    x = g.input("x", [2, 4, 4, 4])
    w = g.randn("W", 4, 4, 3, 3) if kind == "Conv" else g.randn("W", 4, 2, 3, 3)
    y = g.node(kind, [x, w], "c", name="layer", group=1 if kind == "Conv" else 2)
    for i, (step, shape, sign) in enumerate(zip(steps, shapes, signs)):
        if step == "bn":
            y = g.bn(y, 4, f"bn{i}")
        elif step == "Identity":
            y = g.node("Identity", [y], f"h{i}", name=f"id{i}")
        elif step == "Reshape":
            y = g.node("Reshape", [y, g.init(f"sh{i}", np.array([0, 4, 0, -1]), np.int64)], f"h{i}", name=f"rs{i}")
        else:
            k = g.init(f"k{i}", g.rng.uniform(0.5, 1.5, shape) * sign)
            ins = [k, y] if step == "RSub" else [y, k]
            y = g.node("Sub" if step == "RSub" else step, ins, f"a{i}", name=f"aff{i}")
    g.output(g.node("Identity", [y], "y", name="out"))
    r = check_fold(g.model(), g.feeds, gone=AFFINE)
    assert ops(r.model)[0] == kind and set(ops(r.model)[1:]) <= {"Identity", "Reshape"}
    assert bool(r.report.folded) == any(s not in ("Identity", "Reshape") for s in steps)


def test_only_filters_layers():
    g = G()
    c = _conv(g)
    g.output(g.bn(c, 4, "bn", out="y"))
    m = g.model()
    r = fold_onnx(m, only={"linear"})
    assert not r.report.folded and r.report.skipped[0].code == Code.NOT_REQUESTED
    assert len(fold_onnx(m, only={"conv"}).report.folded) == 1


def test_hop_transpose_bn1d_over_tokens():
    """Linear -> transpose -> BatchNorm1d -> transpose, as PyTorch models normalize tokens."""
    g = G()
    x = g.input("x", [2, 5, 4])
    y = g.node("MatMul", [x, g.randn("Wm", 4, 6)], "mm", name="fc")
    y = g.node("Add", [y, g.randn("b", 6)], "fc_out", name="fc_bias")
    y = g.node("Transpose", [y], "t", name="t1", perm=[0, 2, 1])  # [2, 6, 5]: channels on axis 1
    y = g.bn(y, 6, "bn")
    g.output(g.node("Transpose", [y], "y", name="t2", perm=[0, 2, 1]))
    r = check_fold(g.model(), g.feeds, folded=1)
    assert r.report.folded[0].pattern == "MatMul+Transpose+BatchNormalization"
    assert ops(r.model) == ["MatMul", "Add", "Transpose", "Transpose"]


def test_affine_after_attention_scores_is_not_reported():
    g = G()
    q, k = g.input("q", [2, 3, 4]), g.input("k", [2, 4, 3])
    s = g.node("MatMul", [q, k], "s", name="scores")
    g.output(g.node("Mul", [s, g.init("scale", np.float32(0.5))], "y", name="scale_mul"))
    r = fold_onnx(g.model())
    assert not r.report.folded and not r.report.skipped


def test_two_input_sum_is_an_add():
    """``Sum`` of two inputs (how Caffe-converted models write an elementwise add) folds like ``Add``;
    a ``Sum`` of three stays."""
    g = G()
    c = _conv(g)
    y = g.node("Sum", [c, g.randn("t", 4, 1, 1)], "s", name="sum")
    g.output(g.node("Sum", [y, g.randn("u", 4, 1, 1), g.randn("v", 4, 1, 1)], "y", name="sum3"))
    r = check_fold(g.model(), g.feeds, folded=1, gone=())
    f = r.report.folded[0]
    assert (f.norm, f.pattern) == ("affine sum", "Conv+Sum")
    assert ops(r.model) == ["Conv", "Sum"]
