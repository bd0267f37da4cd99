"""The clean-up after a fold (:func:`clean_up`): initializers, Constant nodes and constant-computing nodes the
fold left without users, and the value_info entries of values that no longer exist."""

from __future__ import annotations

import onnx

from .consts import CONST_OPS
from .editor import ModelEditor, drop_named, drop_value_infos
from .index import GraphInfo, Tracker
from .nodes import is_onnx_op


def clean_up(model: onnx.ModelProto, tracker: Tracker, shapes=None, index: ModelEditor | None = None):
    """Remove initializers and Constant nodes the fold left without users (and the
    nodes that computed a constant from them, see ``consts``), and value_info
    entries of values that no longer exist.  ``shapes`` (``onnx.shapes.Shapes``): what shape
    inference gave, for a ``CastLike`` to a type or a ``Shape`` of dims only inference knows.  ``index``: the
    fold's editor of ``model``, compacted (it indexes the model as it is), else one is made."""
    if index is None:
        index = ModelEditor(model, tracker)
        if shapes is not None:
            index.inferred_type, index.inferred_dims = shapes.elem_type, shapes.dims
    while True:
        removed = False
        for gi in index.graphs:
            unused = _remove_unused(index, gi, tracker)
            drop_named(gi.graph.initializer, unused)
            drop_value_infos(gi.graph, unused)
            removed = removed or bool(unused) or bool(index.dead)
        index.compact()  # the index reads the model again: the initializers dropped and the nodes gone
        if not removed:
            break
    for gi in index.graphs:
        defined: set[str] = set()
        for g in gi.chain():
            defined |= set(g.producer) | set(g.inits) | g.inputs
        drop_value_infos(gi.graph, {name for name in tracker.gone | tracker.touched if name not in defined})


def _remove_unused(index: ModelEditor, gi: GraphInfo, tracker: Tracker) -> set[str]:
    """Mark removed the constant-computing nodes of ``gi`` that the touched values lead to and nobody
    uses; return the initializers that nobody uses any more (for the caller to delete)."""
    unused: set[str] = set()
    todo = sorted(tracker.touched, reverse=True)
    while todo:  # a removed node's inputs are looked at next, in the same index
        name = todo.pop()
        if name not in tracker.touched or index.visible_uses(gi, name):
            continue
        if name in gi.inits and name not in gi.inputs:
            unused.add(name)
            tracker.touched.discard(name)
        elif name in gi.producer and not index.is_dead(node := gi.producer[name][0]):
            if is_onnx_op(node, "Constant") or (
                is_onnx_op(node, *CONST_OPS)
                and not isinstance(index.constant(gi, name, "x"), str)
                and not any(index.visible_uses(gi, o) for o in node.output if o)
            ):
                index.remove_node(gi, node)
                tracker.touched.discard(name)
                todo.extend(n for n in node.input if n)
    return unused
