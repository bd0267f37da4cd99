"""Where ``ModelEditor.compact`` places the nodes ``insert_after`` added: right after their anchor, an inserted
node an anchor too, a removed one dropped (its own inserts placed)."""

from __future__ import annotations

import onnx
from onnx import TensorProto
from onnx import helper as h

from bnfold.onnx.editor import ModelEditor
from bnfold.onnx.index import Tracker


def _editor() -> tuple[ModelEditor, onnx.ModelProto]:
    x = h.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = h.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    nodes = [h.make_node("Relu", ["x"], ["r"], name="relu"), h.make_node("Neg", ["r"], ["y"], name="neg")]
    model = h.make_model(h.make_graph(nodes, "g", [x], [y]), opset_imports=[h.make_opsetid("", 17)])
    return ModelEditor(model, Tracker()), model


def _names(model: onnx.ModelProto) -> list[str]:
    return [n.name for n in model.graph.node]


def test_a_node_inserted_after_an_inserted_node_is_placed_after_it():
    editor, model = _editor()
    gi = editor.graphs[0]
    relu = model.graph.node[0]
    a = h.make_node("Abs", ["r"], ["a"], name="a")
    b = h.make_node("Abs", ["a"], ["b"], name="b")  # anchored on an inserted node
    c = h.make_node("Abs", ["r"], ["c"], name="c")
    head = h.make_node("Abs", ["x"], ["h"], name="head")
    after_head = h.make_node("Abs", ["h"], ["h2"], name="after_head")
    editor.insert_after(gi, relu, a)
    editor.insert_after(gi, relu, c)
    editor.insert_after(gi, a, b)
    editor.insert_after(gi, None, head)
    editor.insert_after(gi, head, after_head)
    editor.compact()
    assert _names(model) == ["head", "after_head", "relu", "a", "b", "c", "neg"]


def test_an_inserted_node_removed_again_is_dropped_and_its_inserts_stay():
    editor, model = _editor()
    gi = editor.graphs[0]
    a = h.make_node("Abs", ["r"], ["a"], name="a")
    b = h.make_node("Abs", ["r"], ["b"], name="b")
    editor.insert_after(gi, model.graph.node[0], a)
    editor.insert_after(gi, a, b)
    editor.remove_node(gi, a)
    editor.compact()
    assert _names(model) == ["relu", "b", "neg"]
