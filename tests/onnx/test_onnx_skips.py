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
from bnfold.report import Code


def _skip(m: onnx.ModelProto, code: Code, norm: str = "bn", producer: str | None = None):
    """Fold ``m``, expect nothing folded, the model unchanged and one skip with ``code``."""
    r = fold_onnx(m)
    assert not r.report.folded, r.report
    assert r.model.SerializeToString() == m.SerializeToString()
    (s,) = r.report.skipped
    assert s.norm == norm and s.node == norm
    assert s.code == code, s
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
    _skip(g.model(), Code.SHARED_VALUE, producer="conv")


def test_producer_output_is_graph_output():
    g = G()
    y = _conv_bn(g)
    g.output(y, "c")
    _skip(g.model(), Code.SHARED_VALUE)


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
    _skip(g.model(), Code.SHARED_VALUE)


def test_weight_is_graph_input():
    g = G()
    w = g.input("W", [4, 3, 3, 3])
    g.output(_conv_bn(g, weight=w))
    _skip(g.model(), Code.LAYER_WEIGHTS)


def test_weight_is_initializer_and_graph_input():
    g = G()
    w = g.randn("W", 4, 3, 3, 3)
    g.output(_conv_bn(g, weight=w))
    m = g.model()
    m.graph.input.append(h.make_tensor_value_info("W", TensorProto.FLOAT, [4, 3, 3, 3]))
    _skip(m, Code.LAYER_WEIGHTS)


def test_weight_computed_by_a_node():
    g = G()
    w = g.node("Abs", [g.randn("W0", 4, 3, 3, 3)], "W", name="wabs")
    g.output(_conv_bn(g, weight=w))
    _skip(g.model(), Code.LAYER_WEIGHTS)


@pytest.mark.parametrize("shape", [(4, 2), (1,), (8,)])
def test_conv_bias_of_another_length_than_the_output_channels(shape):
    """ONNX requires a Conv bias of one value per output channel; onnxscript's torch_lib writes [C, 2] for a
    bias-less Conv3d (``reparam_onnx.conv3d_translation``).  The reason says so, not a fold-math message."""
    g = G()
    x = g.input("x", [2, 3, 5, 5])
    y = g.node("Conv", [x, g.randn("W", 4, 3, 3, 3), g.randn("B", *shape)], "c", name="conv")
    g.output(g.bn(y, 4, "bn", out="y"))
    s = _skip(g.model(), Code.LAYER_WEIGHTS, producer="conv")
    assert s.reason == (
        f"cannot fold into Conv 'conv' (Conv): its bias has shape {list(shape)}, not [4]: ONNX requires a Conv "
        "bias of one value per output channel, so the model is invalid"
    )


def test_matmul_weight_not_constant():
    g = G()
    a, b = g.input("a", [3, 5]), g.input("b", [5, 6])
    g.output(g.bn(g.node("MatMul", [a, b], "mm", name="mm"), 6, "bn", out="y"))
    _skip(g.model(), Code.LAYER_WEIGHTS)


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
    _skip(m, Code.NOT_CONSTANT)
    assert y == "y"


def test_training_mode():
    g = G()
    x = g.input("x", [2, 3, 5, 5])
    y = g.node("Conv", [x, g.randn("W", 4, 3, 3, 3)], "c", name="conv")
    g.output(g.bn(y, 4, "bn", out="y", training_mode=1))
    _skip(g.model(opset=15), Code.TRAINING_MODE)


def test_training_outputs_used():
    g = G()
    x = g.input("x", [2, 3, 5, 5])
    y = g.node("Conv", [x, g.randn("W", 4, 3, 3, 3)], "c", name="conv")
    g.output(g.node("BatchNormalization", [y, *g.bn_stats("bn", 4)], ["y", "rm", "rv"], name="bn", training_mode=1))
    g.output("rm")
    _skip(g.model(opset=15), Code.TRAINING_MODE)


def test_channel_mismatch():
    g = G()
    x = g.input("x", [2, 3, 5, 5])
    y = g.node("Conv", [x, g.randn("W", 4, 3, 3, 3)], "c", name="conv")
    g.output(g.node("BatchNormalization", [y, *g.bn_stats("bn", 5)], ["y"], name="bn"))
    m = g.model()
    _skip(m, Code.CHANNEL_MISMATCH)


def test_channel_axis_mismatch_after_unsqueeze():
    g = G()
    x = g.input("x", [3, 5])
    y = g.node("Gemm", [x, g.randn("Wg", 6, 5)], "gm", name="gemm", transB=1)
    y = g.node("Unsqueeze", [y, g.init("ax", np.array([0]), np.int64)], "u", name="unsq")  # [1, 3, 6]
    g.output(g.node("BatchNormalization", [y, *g.bn_stats("bn", 3)], ["y"], name="bn"))
    _skip(g.model(), Code.AXIS_MISMATCH)


def test_reshape_that_moves_channels():
    g = G()
    x = g.input("x", [2, 3, 5, 5])
    y = g.node("Conv", [x, g.randn("W", 4, 3, 3, 3)], "c", name="conv")  # [2, 4, 3, 3]
    y = g.node("Reshape", [y, g.init("shape", np.array([2, 3, 12]), np.int64)], "r", name="reshape")
    g.output(g.node("BatchNormalization", [y, *g.bn_stats("bn", 3)], ["y"], name="bn"))
    _skip(g.model(), Code.AXIS_LOST)


def test_squeeze_removes_channel_axis():
    g = G()
    x = g.input("x", [2, 3, 5, 5])
    y = g.node("Conv", [x, g.randn("W", 1, 3, 3, 3)], "c", name="conv")  # [2, 1, 3, 3]
    y = g.node("Squeeze", [y, g.init("ax", np.array([1]), np.int64)], "s", name="squeeze")  # [2, 3, 3]
    g.output(g.node("BatchNormalization", [y, *g.bn_stats("bn", 3)], ["y"], name="bn"))
    _skip(g.model(), Code.AXIS_LOST)


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
    _skip(g.model(), Code.NO_LAYER)


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
    _skip(m, Code.NOT_FINITE if bad == "nan_mean" else Code.UNDEFINED)


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
    _skip(g.model(opset=15), Code.CAST_RANGE)


def test_gemm_c_per_row_is_not_a_bias():
    g = G()
    x = g.input("x", [3, 5])
    y = g.node("Gemm", [x, g.randn("Wg", 6, 5), g.randn("C", 3, 6)], "gm", name="gemm", transB=1)
    g.output(g.bn(y, 6, "bn", out="y"))
    _skip(g.model(), Code.LAYER_WEIGHTS)


def test_affine_not_per_channel_is_reported():
    g = G()
    y = _conv_bn(g, bn=False)  # [2, 4, 3, 3]
    g.output(g.node("Mul", [y, g.randn("k", 1, 1, 3, 3)], "y", name="mul"))
    m = g.model()
    r = fold_onnx(m)
    assert not r.report.folded and not r.report.skipped, r.report  # a Mul is no normalization
    (k,) = r.report.kept_ops
    assert (k.op, k.node, k.code) == ("mul", "mul", Code.NOT_PER_CHANNEL), k
    assert r.model.SerializeToString() == m.SerializeToString()


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
    _skip(g.model(), Code.NO_LAYER, producer="")


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
    s = _skip(m, Code.LAYER_WEIGHTS)
    assert "load_onnx" in s.reason


def test_one_guard_does_not_block_other_folds():
    g = G()
    x = g.input("x", [2, 3, 5, 5])
    a = g.node("Conv", [x, g.randn("W1", 4, 3, 3, 3)], "a", name="conv1")
    ya = g.bn(a, 4, "bn1")
    b = g.node("Conv", [x, g.randn("W2", 4, 3, 3, 3)], "b", name="conv2")
    yb = g.bn(b, 4, "bn2")
    g.output(g.node("Add", [ya, yb], "y", name="add"), "b")
    r = check_fold(g.model(opset=15), g.feeds, folded=1, gone=(), skipped=1)
    assert r.report.folded[0].norm == "bn1" and r.report.skipped[0].norm == "bn2"
    # the sum of the two convs does not merge (conv2's value is a graph output): a note on the add
    assert [(k.op, k.code) for k in r.report.kept_ops] == [("add", Code.MERGE_SHARED)], r.report
