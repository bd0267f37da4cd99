"""What the cost model and the audit read of an ONNX file without running it: inferred shapes
(``bnfold.onnx.shapes``: the batch's input dims set on the copy inference runs on, stated shapes not
believed), tensor values and attributes (``semantics.values.array`` and ``attrs``: what ``onnx.numpy_helper`` and
``onnx.helper`` read)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as h

from bnfold.onnx.semantics.values import array, attrs
from bnfold.onnx.shapes import Shapes

RNG = np.random.default_rng(0)


def _stored(a: np.ndarray, raw: bool) -> TensorProto:
    """``a`` as a tensor holding its values in raw bytes or in the typed field (``float_data``...)."""
    t = numpy_helper.from_array(a, "t")
    if not raw and t.data_type != TensorProto.STRING:
        t = h.make_tensor("t", t.data_type, a.shape, a.reshape(-1).tolist())
    return t


@pytest.mark.parametrize("raw", [True, False])
@pytest.mark.parametrize(
    "a",
    [
        RNG.standard_normal((3,)).astype(np.float32),
        RNG.standard_normal((4, 5, 6)).astype(np.float32),  # more values than the short path reads
        np.float32(2.5).reshape(()),
        np.zeros((0, 3), np.float32),
        RNG.standard_normal((2, 3)),
        np.arange(-5, 7, dtype=np.int64).reshape(3, 4),
        np.arange(-5, 7, dtype=np.int32),
        RNG.standard_normal((5,)).astype(np.float16),  # not read here: numpy_helper's
        np.array([True, False, True]),
    ],
    ids=["f32", "f32-many", "f32-scalar", "f32-empty", "f64", "i64", "i32", "f16", "bool"],
)
def test_array_is_to_array(a, raw):
    t = _stored(a, raw)
    got, want = array(t), numpy_helper.to_array(t)
    assert got.dtype == want.dtype and got.shape == want.shape == a.shape
    np.testing.assert_array_equal(got, want)
    if not raw:  # a copy of the field's values: the tensor keeps its own
        got[...] = 0 if got.size else got
        np.testing.assert_array_equal(numpy_helper.to_array(t), a)


def test_array_refuses_what_to_array_refuses():
    t = h.make_tensor("t", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    t.dims[:] = [2, 2]  # 3 values for 4 elements
    with pytest.raises(ValueError):
        numpy_helper.to_array(t)
    with pytest.raises(ValueError):
        array(t)


def _model(stated_dims: list) -> onnx.ModelProto:
    """x -> Relu -> Flatten, its input stated as ``stated_dims`` and a lie in value_info and the output."""
    x = h.make_tensor_value_info("x", TensorProto.FLOAT, stated_dims)
    y = h.make_tensor_value_info("y", TensorProto.FLOAT, [7, 7])
    nodes = [h.make_node("Relu", ["x"], ["r"]), h.make_node("Flatten", ["r"], ["y"])]
    graph = h.make_graph(nodes, "g", [x], [y], value_info=[h.make_tensor_value_info("r", TensorProto.FLOAT, [9])])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def test_shapes_take_the_batch_dims_on_their_copy():
    m = _model(["N", 3, "H", "W"])
    before = m.SerializeToString()
    shapes = Shapes(m, declared=False, inputs={"x": (2, 3, 4, 5)})
    assert shapes.dims("x") == [2, 3, 4, 5]
    assert shapes.dims("r") == [2, 3, 4, 5]  # from the op, not the stated [9]
    assert shapes.dims("y") == [2, 60]  # not the stated [7, 7]
    assert shapes.elem_type("y") == TensorProto.FLOAT
    assert m.SerializeToString() == before  # the model itself is never changed


def test_shapes_without_batch_dims_keep_the_stated_inputs():
    m = _model(["N", 3, 4, 5])
    assert Shapes(m, declared=False).dims("y") == ["N", 60]
    assert Shapes(m).dims("r") == [9]  # declared: the fold's reading keeps what the file states


def test_shapes_read_subgraphs():
    then = h.make_graph(
        [h.make_node("Relu", ["x"], ["t"])], "then", [], [h.make_tensor_value_info("t", TensorProto.FLOAT, None)]
    )
    other = h.make_graph(
        [h.make_node("Neg", ["x"], ["e"])], "else", [], [h.make_tensor_value_info("e", TensorProto.FLOAT, None)]
    )
    x = h.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    c = h.make_tensor_value_info("c", TensorProto.BOOL, [])
    y = h.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
    m = h.make_model(h.make_graph([node], "g", [x, c], [y]), opset_imports=[h.make_opsetid("", 17)])
    shapes = Shapes(m, declared=False)
    assert shapes.dims("t") == [2, 3] and shapes.dims("e") == [2, 3] and shapes.dims("y") == [2, 3]


def test_attrs_read_as_onnx_reads_them():
    g = h.make_graph([], "g", [], [])
    node = h.make_node(
        "Custom",
        ["x"],
        ["y"],
        f=1.5,
        i=3,
        s=b"nearest",
        t=numpy_helper.from_array(np.ones((2,), np.float32)),
        fs=[1.0, 2.0],
        ints=[1, -1],
        ss=[b"a", b"b"],
        g=g,
        ts=[numpy_helper.from_array(np.zeros((1,), np.int64))],
    )
    got = attrs(node)
    assert list(got) == [a.name for a in node.attribute]
    for a in node.attribute:
        assert got[a.name] == h.get_attribute_value(a)
    ref = onnx.AttributeProto(name="alpha", ref_attr_name="alpha", type=onnx.AttributeProto.FLOAT)
    node.attribute.append(ref)
    with pytest.raises(ValueError, match="reference attribute"):
        attrs(node)
