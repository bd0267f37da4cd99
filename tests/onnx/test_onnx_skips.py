"""Every guard: the normalization stays, the model is unchanged, and the report
says why in words."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h
from onnx_testkit import G, check_fold

from bnfold.onnx import fold_onnx


def _skip(m: onnx.ModelProto, *words: str, norm: str = "bn", producer: str | None = None):
    """Fold ``m``, expect nothing folded, the model unchanged and one skip naming ``words``."""
    r = fold_onnx(m)
    assert not r.report.folded, r.report
    assert r.model.SerializeToString() == m.SerializeToString()
    (s,) = r.report.skipped
    assert s.norm == norm and s.node == norm
    for w in words:
        assert w in s.reason, s.reason
    if producer is not None:
        assert s.producer == producer
    return s


def _conv_bn(g: G, x_shape=(2, 3, 5, 5), c=4, weight=None, bn=True):
    x = g.input("x", list(x_shape))
    y = g.node("Conv", [x, weight or g.randn("W", c, x_shape[1], 3, 3)], "c", name="conv")
    return g.bn(y, c, "bn", out="y") if bn else y


def test_producer_output_has_two_users():
    g = G()
    y = _conv_bn(g)
    g.output(y, g.node("Relu", ["c"], "r", name="relu"))
    _skip(g.model(), "'c' (Conv), has 2 users;", producer="conv")


def test_producer_output_is_graph_output():
    g = G()
    y = _conv_bn(g)
    g.output(y, "c")
    _skip(g.model(), "'c' (Conv), has 2 users (1 of them a graph output or a subgraph)")


def test_producer_output_used_in_subgraph():
    g = G()
    _conv_bn(g)
    cond = g.input("cond", [], dtype=np.bool_, value=True)
    branch = h.make_graph(
        [h.make_node("Relu", ["c"], ["t"], name="inner")],
        "then",
        [],
        [h.make_tensor_value_info("t", TensorProto.FLOAT, [2, 4, 3, 3])],
    )
    other = h.make_graph(
        [h.make_node("Identity", ["y"], ["e"], name="inner2")],
        "else",
        [],
        [h.make_tensor_value_info("e", TensorProto.FLOAT, [2, 4, 3, 3])],
    )
    g.output(g.node("If", [cond], "z", name="if", then_branch=branch, else_branch=other))
    _skip(g.model(), "'c' (Conv), has 2 users (1 of them a graph output or a subgraph)")


def test_weight_is_graph_input():
    g = G()
    w = g.input("W", [4, 3, 3, 3])
    g.output(_conv_bn(g, weight=w))
    _skip(g.model(), "cannot fold into Conv 'conv' (Conv): weight 'W' is a graph input, not a constant")


def test_weight_is_initializer_and_graph_input():
    g = G()
    w = g.randn("W", 4, 3, 3, 3)
    g.output(_conv_bn(g, weight=w))
    m = g.model()
    m.graph.input.append(h.make_tensor_value_info("W", TensorProto.FLOAT, [4, 3, 3, 3]))
    _skip(m, "also a graph input", "override")


def test_weight_computed_by_a_node():
    g = G()
    w = g.node("Abs", [g.randn("W0", 4, 3, 3, 3)], "W", name="wabs")
    g.output(_conv_bn(g, weight=w))
    _skip(g.model(), "computed by Abs 'wabs'")


def test_matmul_weight_not_constant():
    g = G()
    a, b = g.input("a", [3, 5]), g.input("b", [5, 6])
    g.output(g.bn(g.node("MatMul", [a, b], "mm", name="mm"), 6, "bn", out="y"))
    _skip(g.model(), "'b' is a graph input")


@pytest.mark.parametrize("stat", [1, 2, 3, 4])
def test_statistics_not_constant(stat):
    g = G()
    y = _conv_bn(g)
    m = g.model()
    bn = m.graph.node[-1]
    name = bn.input[stat]
    init = next(t for t in m.graph.initializer if t.name == name)
    m.graph.initializer.remove(init)
    m.graph.input.append(h.make_tensor_value_info(name, TensorProto.FLOAT, [4]))
    _skip(m, "is not a constant", f"user input '{name}'")
    assert y == "y"


def test_training_mode():
    g = G()
    x = g.input("x", [2, 3, 5, 5])
    y = g.node("Conv", [x, g.randn("W", 4, 3, 3, 3)], "c", name="conv")
    g.output(g.bn(y, 4, "bn", out="y", training_mode=1))
    _skip(g.model(opset=15), "training_mode=1")


def test_training_outputs_used():
    g = G()
    x = g.input("x", [2, 3, 5, 5])
    y = g.node("Conv", [x, g.randn("W", 4, 3, 3, 3)], "c", name="conv")
    g.output(g.node("BatchNormalization", [y, *g.bn_stats("bn", 4)], ["y", "rm", "rv"], name="bn", training_mode=1))
    g.output("rm")
    _skip(g.model(opset=15), "training")


def test_channel_mismatch():
    g = G()
    x = g.input("x", [2, 3, 5, 5])
    y = g.node("Conv", [x, g.randn("W", 4, 3, 3, 3)], "c", name="conv")
    g.output(g.node("BatchNormalization", [y, *g.bn_stats("bn", 5)], ["y"], name="bn"))
    m = g.model()
    _skip(m, "it has 5 channels but the tensor it normalizes has 4")


def test_channel_axis_mismatch_after_unsqueeze():
    g = G()
    x = g.input("x", [3, 5])
    y = g.node("Gemm", [x, g.randn("Wg", 6, 5)], "gm", name="gemm", transB=1)
    y = g.node("Unsqueeze", [y, g.init("ax", np.array([0]), np.int64)], "u", name="unsq")  # [1, 3, 6]
    g.output(g.node("BatchNormalization", [y, *g.bn_stats("bn", 3)], ["y"], name="bn"))
    _skip(g.model(), "axis 2")


def test_reshape_that_moves_channels():
    g = G()
    x = g.input("x", [2, 3, 5, 5])
    y = g.node("Conv", [x, g.randn("W", 4, 3, 3, 3)], "c", name="conv")  # [2, 4, 3, 3]
    y = g.node("Reshape", [y, g.init("shape", np.array([2, 3, 12]), np.int64)], "r", name="reshape")
    g.output(g.node("BatchNormalization", [y, *g.bn_stats("bn", 3)], ["y"], name="bn"))
    _skip(g.model(), "'reshape' (Reshape) does not keep the channel axis")


def test_squeeze_removes_channel_axis():
    g = G()
    x = g.input("x", [2, 3, 5, 5])
    y = g.node("Conv", [x, g.randn("W", 1, 3, 3, 3)], "c", name="conv")  # [2, 1, 3, 3]
    y = g.node("Squeeze", [y, g.init("ax", np.array([1]), np.int64)], "s", name="squeeze")  # [2, 3, 3]
    g.output(g.node("BatchNormalization", [y, *g.bn_stats("bn", 3)], ["y"], name="bn"))
    _skip(g.model(), "removes the channel axis")


def test_dropout_in_training_mode():
    g = G()
    x = g.input("x", [2, 3, 5, 5])
    y = g.node("Conv", [x, g.randn("W", 4, 3, 3, 3)], "c", name="conv")
    y = g.node(
        "Dropout",
        [y, g.init("ratio", np.float32(0.5)), g.input("train", [], dtype=np.bool_, value=False)],
        "d",
        name="drop",
    )
    g.output(g.bn(y, 4, "bn", out="y"))
    _skip(g.model(), "'d' (Dropout: it may run in training mode (training_mode is not a constant false))")


@pytest.mark.parametrize("bad", ["nan_mean", "negative_var"])
def test_invalid_statistics(bad):
    g = G()
    g.output(_conv_bn(g))
    m = g.model()
    name = "bn_mean" if bad == "nan_mean" else "bn_var"
    t = next(t for t in m.graph.initializer if t.name == name)
    v = onnx.numpy_helper.to_array(t).copy()
    v[1] = np.nan if bad == "nan_mean" else -1.0
    t.CopyFrom(onnx.numpy_helper.from_array(v, name))
    _skip(m, "NaN" if bad == "nan_mean" else "running_var + eps <= 0")


@pytest.mark.parametrize("what", ["overflow", "underflow"])
def test_fp16_overflow_and_underflow(what):
    g = G()
    x = g.input("x", [2, 3, 5, 5], dtype=np.float16)
    y = g.node("Conv", [x, g.init("W", np.full((4, 3, 3, 3), 0.5), np.float16)], "c", name="conv")
    gamma = 1e6 if what == "overflow" else 1e-9  # float32 statistics, float16 weights
    g.output(
        g.node(
            "BatchNormalization",
            [
                y,
                g.init("s", np.full(4, gamma)),
                g.init("b", np.zeros(4)),
                g.init("m", np.zeros(4)),
                g.init("v", np.ones(4)),
            ],
            "y",
            name="bn",
        )
    )
    _skip(g.model(opset=15), what + "s" if what == "overflow" else "underflows", "float16")


def test_gemm_c_per_row_is_not_a_bias():
    g = G()
    x = g.input("x", [3, 5])
    y = g.node("Gemm", [x, g.randn("Wg", 6, 5), g.randn("C", 3, 6)], "gm", name="gemm", transB=1)
    g.output(g.bn(y, 6, "bn", out="y"))
    _skip(g.model(), "cannot fold into Gemm 'gemm' (Gemm): its C has shape [3, 6], not a per-output-channel bias")


def test_affine_not_per_channel_is_reported():
    g = G()
    y = _conv_bn(g, bn=False)  # [2, 4, 3, 3]
    g.output(g.node("Mul", [y, g.randn("k", 1, 1, 3, 3)], "y", name="mul"))
    _skip(g.model(), "its constant of shape [1, 1, 3, 3] is not per-channel along axis 1", norm="mul")


def test_affine_next_to_nothing_is_not_reported():
    g = G()
    x = g.input("x", [2, 3])
    g.output(g.node("Mul", [g.node("Relu", [x], "r", name="relu"), g.randn("k", 3)], "y", name="mul"))
    r = fold_onnx(g.model())
    assert not r.report.folded and not r.report.skipped


def test_bn_next_to_no_layer():
    g = G()
    x = g.input("x", [2, 3, 4, 4])
    y = g.node("Relu", [x], "r", name="relu")
    g.output(g.node("Relu", [g.bn(y, 3, "bn")], "y", name="relu2"))
    _skip(g.model(), "no conv, transposed conv or linear next to it", "'r' (Relu)", "'relu2' (Relu)", producer="")


def test_unloaded_external_data_is_not_read(tmp_path):
    """A ModelProto whose weights still point to an external file: the fold never opens it."""
    g = G()
    g.output(_conv_bn(g))
    m = g.model()
    t = next(t for t in m.graph.initializer if t.name == "W")
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    e = t.external_data.add()
    e.key, e.value = "location", "W.bin"
    s = _skip(m, "external file that was not loaded")
    assert "load_onnx" in s.reason


def test_one_guard_does_not_block_other_folds():
    g = G()
    x = g.input("x", [2, 3, 5, 5])
    a = g.node("Conv", [x, g.randn("W1", 4, 3, 3, 3)], "a", name="conv1")
    ya = g.bn(a, 4, "bn1")
    b = g.node("Conv", [x, g.randn("W2", 4, 3, 3, 3)], "b", name="conv2")
    yb = g.bn(b, 4, "bn2")
    g.output(g.node("Add", [ya, yb], "y", name="add"), "b")
    r = check_fold(g.model(opset=15), g.feeds, folded=1, gone=(), skipped=2)  # bn2, and the add's merge (reparam)
    assert r.report.folded[0].norm == "bn1" and r.report.skipped[0].norm == "bn2"
    assert r.report.skipped[1].norm == "add" and "has another user" in r.report.skipped[1].reason
