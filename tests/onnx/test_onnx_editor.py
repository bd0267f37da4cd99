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


def test_a_second_compact_places_nothing_twice():
    """What ``compact`` placed and dropped is done: a second ``compact`` (after more edits) neither inserts the
    first edits' nodes again nor drops by their stale marks (before: a node inserted first in the graph was placed
    again at each compact)."""
    editor, model = _editor()
    gi = editor.graphs[0]
    editor.insert_after(gi, None, h.make_node("Abs", ["x"], ["h"], name="head"))
    editor.insert_after(gi, model.graph.node[0], h.make_node("Abs", ["r"], ["a"], name="a"))
    editor.compact()
    assert _names(model) == ["head", "relu", "a", "neg"]
    editor.compact()
    assert _names(model) == ["head", "relu", "a", "neg"]


def test_a_node_removed_through_a_wrapper_nobody_holds_is_the_one_dropped():
    """protobuf's (upb) Python wrapper of a repeated message's element lives only while something holds it, and the
    next wrapper made may take its ``id`` (with protobuf's upb here, ``[id(model.graph.node[i]) for i in range(3)]``
    gave one id three times).  The
    editor holds what it marks removed or anchors on, so a mark made through a wrapper nothing else holds still
    names that node: after a ``compact`` that placed an insert (the graph's nodes new elements, no wrapper of them
    held), a node removed and an anchor given through ``model.graph.node[i]``, every other reference dropped and
    ``gc.collect()`` run, then new nodes built, the next ``compact`` drops that node and places the inserts after
    that anchor (before: the wrappers ``compact`` made took the ids, and it dropped or anchored on whichever node
    that was)."""
    import gc

    editor, model = _editor()
    gi = editor.graphs[0]
    editor.insert_after(gi, model.graph.node[0], h.make_node("Abs", ["r"], ["a"], name="a"))
    editor.compact()  # the graph's nodes are new elements now: the index holds no wrapper of them
    assert _names(model) == ["relu", "a", "neg"]
    editor.remove_node(gi, model.graph.node[2])  # 'neg', through a wrapper nobody holds
    gc.collect()
    for i in range(2):
        editor.insert_after(gi, model.graph.node[1], h.make_node("Abs", ["a"], [f"t{i}"], name=f"t{i}"))  # after 'a'
        gc.collect()
    editor.compact()
    assert _names(model) == ["relu", "a", "t0", "t1"]


def test_the_index_is_read_again_after_compact():
    """``compact`` builds a node list again where it places an insert (its elements new protos): before, the index
    still named the old ones after it, so an edit through it reached no node of the model (here 'neg' rewired
    through the index's uses of 'r' kept reading 'r'); now the index is read again: its nodes, producers and
    uses are the model's, and an edit through it lands."""
    editor, model = _editor()
    gi = editor.graphs[0]
    editor.insert_after(gi, model.graph.node[0], h.make_node("Abs", ["r"], ["a"], name="a"))
    editor.compact()
    assert _names(model) == ["relu", "a", "neg"]
    gi = editor.graphs[0]
    assert [n.name for n in gi.nodes] == _names(model)
    assert all(any(n is m for m in model.graph.node) for n in gi.nodes)
    assert gi.producer["a"][0] is model.graph.node[1]
    neg = next(u.node for u in editor.uses["r"] if u.node.name == "neg")
    editor.set_input(gi, neg, 0, "a")
    assert list(model.graph.node[2].input) == ["a"]
    assert [u.node.name for u in editor.uses["a"]] == ["neg"]
