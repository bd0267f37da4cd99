"""BatchNormalization after each layer op and attribute combination folds, and
the folded model computes what the original computes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx_testkit import G, check_fold, ops


def _conv_bn(op, x_shape, w_shape, c_out, bias=True, bn_kw=None, **attrs):
    g = G(seed=len(attrs) + c_out)
    x = g.input("x", x_shape)
    ins = [x, g.randn("W", *w_shape)] + ([g.randn("B", c_out)] if bias else [])
    y = g.node(op, ins, "c", name="layer", **attrs)
    g.output(g.bn(y, c_out, "bn", out="y", **(bn_kw or {})))
    return g


CONV_CASES = {
    "plain": dict(),
    "groups_strides_pads": dict(group=2, strides=[2, 1], pads=[1, 0, 2, 1]),
    "dilations": dict(dilations=[2, 1], pads=[2, 1, 2, 1]),
    "same_upper": dict(auto_pad="SAME_UPPER", strides=[2, 2]),
    "same_lower": dict(auto_pad="SAME_LOWER"),
    "valid": dict(auto_pad="VALID"),
    "depthwise": dict(group=4),
}


@pytest.mark.parametrize("case", sorted(CONV_CASES))
@pytest.mark.parametrize("bias", [True, False])
def test_conv2d_bn(case, bias):
    attrs = CONV_CASES[case]
    groups = attrs.get("group", 1)
    c_out = 8 if groups != 4 else 4
    g = _conv_bn("Conv", [2, 4, 7, 6], [c_out, 4 // groups, 3, 3], c_out, bias=bias, **attrs)
    r = check_fold(g.model(), g.feeds, folded=1)
    f = r.report.folded[0]
    assert (f.norm, f.into, f.pattern, f.side, f.node) == ("bn", "layer", "Conv+BatchNormalization", "output", "bn")


@pytest.mark.parametrize("nd", [1, 3])
def test_conv_1d_3d(nd):
    g = _conv_bn("Conv", [2, 3] + [5] * nd, [4, 3] + [3] * nd, 4, pads=[1] * (2 * nd))
    check_fold(g.model(), g.feeds, folded=1)


CONVT_CASES = {
    "plain": dict(),
    "groups2": dict(group=2),
    "strides_outpad_pads": dict(group=2, strides=[2, 3], output_padding=[1, 2], pads=[1, 0, 0, 1]),
    "dilations": dict(dilations=[2, 1], strides=[1, 2]),
    "same_upper": dict(auto_pad="SAME_UPPER", strides=[2, 2], output_padding=[1, 1]),
    "valid": dict(auto_pad="VALID", strides=[2, 2]),
}


@pytest.mark.parametrize("case", sorted(CONVT_CASES))
@pytest.mark.parametrize("bias", [True, False])
def test_conv_transpose_bn(case, bias):
    attrs = CONVT_CASES[case]
    groups = attrs.get("group", 1)
    # weight [in, out/groups, k, k]: with groups=2 and out/groups=3, a dim-0 channel mapping is wrong
    g = _conv_bn("ConvTranspose", [2, 4, 5, 4], [4, 6 // groups, 3, 3], 6, bias=bias, **attrs)
    check_fold(g.model(), g.feeds, folded=1)


def test_conv_transpose_groups_distinct_stats_guard():
    """groups=2, out/groups=3: each output channel gets its own scale (a dim-0 mapping fails)."""
    g = G(seed=3)
    x = g.input("x", [1, 4, 3, 3])
    y = g.node("ConvTranspose", [x, g.randn("W", 4, 3, 2, 2)], "c", name="ct", group=2)
    g.output(
        g.node(
            "BatchNormalization",
            [
                y,
                g.init("s", np.arange(1, 7) * 1.5),
                g.init("b", np.arange(6) - 2.0),
                g.init("m", np.linspace(-1, 1, 6)),
                g.init("v", np.linspace(0.5, 3, 6)),
            ],
            "y",
            name="bn",
        )
    )
    check_fold(g.model(), g.feeds, folded=1)


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (6,), (1, 6), (1,)])
def test_gemm_bn(trans_a, trans_b, c_shape):
    g = G(seed=trans_a * 2 + trans_b)
    x = g.input("x", [5, 3] if trans_a else [3, 5])
    ins = [x, g.randn("B", *((6, 5) if trans_b else (5, 6)))]
    if c_shape is not None:
        ins.append(g.randn("C", *c_shape))
    y = g.node("Gemm", ins, "gemm_out", name="gemm", transA=trans_a, transB=trans_b, alpha=0.75, beta=1.5)
    g.output(g.bn(y, 6, "bn", out="y"))
    r = check_fold(g.model(), g.feeds, folded=1)
    assert r.report.folded[0].pattern == "Gemm+BatchNormalization"


def test_gemm_default_alpha_beta_keeps_attributes_free():
    g = G()
    x = g.input("x", [3, 5])
    y = g.node("Gemm", [x, g.randn("B", 6, 5), g.randn("C", 6)], "gemm_out", name="gemm", transB=1)
    g.output(g.bn(y, 6, "bn", out="y"))
    r = check_fold(g.model(), g.feeds, folded=1)
    gemm = next(n for n in r.model.graph.node if n.op_type == "Gemm")
    assert {a.name for a in gemm.attribute} == {"transB"}
    assert list(gemm.input) == ["x", "B", "C"]  # weights replaced in place, names kept


@pytest.mark.parametrize("bias", ["none", "vector", "row"])
@pytest.mark.parametrize("rank", [2, 3])
def test_matmul(bias, rank):
    g = G(seed=rank)
    x = g.input("x", [3, 5] if rank == 2 else [2, 3, 5])
    y = g.node("MatMul", [x, g.randn("Wt", 5, 6)], "mm", name="mm")
    if bias != "none":
        y = g.node("Add", [y, g.randn("bias", *((6,) if bias == "vector" else (1, 6)))], "mm_b", name="mm_add")
    if rank == 2:
        g.output(g.bn(y, 6, "bn", out="y"))
        gone = ("BatchNormalization",)
    else:  # BN over [N, C, L] normalizes axis 1, not the MatMul's channels: use an affine on the last axis
        y = g.node("Mul", [y, g.randn("s", 6)], "m", name="mul")
        g.output(g.node("Add", [y, g.randn("t", 6)], "y", name="add"))
        gone = ("Mul",)
    r = check_fold(g.model(), g.feeds, folded=1, gone=gone)
    assert ops(r.model).count("Add") == 1  # exactly one bias Add: the original or a new one


@st.composite
def _conv_attrs(draw):
    op = draw(st.sampled_from(["Conv", "ConvTranspose"]))
    groups = draw(st.sampled_from([1, 2, 3]))
    c_in = groups * draw(st.integers(1, 2))
    per_group_out = draw(st.integers(1, 3))
    k = draw(st.lists(st.integers(1, 3), min_size=2, max_size=2))
    strides = draw(st.lists(st.integers(1, 3), min_size=2, max_size=2))
    dil = draw(st.lists(st.integers(1, 2), min_size=2, max_size=2))
    pads = draw(st.lists(st.integers(0, 1), min_size=4, max_size=4))
    attrs = dict(group=groups, strides=strides, dilations=dil, pads=pads)
    if op == "ConvTranspose":
        attrs["output_padding"] = [draw(st.integers(0, s - 1)) for s in strides]  # ORT wants < stride
        w_shape = [c_in, per_group_out] + k
    else:
        w_shape = [groups * per_group_out, c_in // groups] + k
    return op, c_in, groups * per_group_out, w_shape, attrs, draw(st.booleans())


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_conv_attrs())
def test_random_conv_attributes(case):
    op, c_in, c_out, w_shape, attrs, bias = case
    g = _conv_bn(op, [2, c_in, 7, 6], w_shape, c_out, bias=bias, **attrs)
    check_fold(g.model(), g.feeds, folded=1)
