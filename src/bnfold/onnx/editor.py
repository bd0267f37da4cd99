"""The edits a fold makes to an ONNX model (:class:`ModelEditor`): each goes to the protos at once and keeps
the index consistent; removed nodes are only marked and leave their graph in :meth:`ModelEditor.compact`."""

from __future__ import annotations

import onnx
from onnx import GraphProto, NodeProto, TensorProto

from .index import GraphInfo, ModelIndex, Use


class ModelEditor(ModelIndex):
    """A :class:`~.index.ModelIndex` that edits its model."""

    def set_input(self, gi: GraphInfo, node: NodeProto, idx: int, name: str) -> None:
        self._edited()
        while len(node.input) <= idx:
            node.input.append("")
        old = node.input[idx]
        if old:
            self._unuse(old, node, idx)
            self.tracker.touched.add(old)
        node.input[idx] = name
        self._use(name, Use(gi, node, idx))

    def clear_input(self, gi: GraphInfo, node: NodeProto, idx: int) -> None:
        """Leave the optional input ``idx`` of ``node`` empty (trailing empty inputs are dropped)."""
        self._edited()
        old = node.input[idx]
        if old:
            self._unuse(old, node, idx)
            self.tracker.touched.add(old)
        node.input[idx] = ""
        while node.input and not node.input[-1]:
            del node.input[-1]

    def rename_output(self, gi: GraphInfo, node: NodeProto, idx: int, new: str) -> None:
        self._edited()
        old = node.output[idx]
        if gi.producer.get(old, (None,))[0] is node:
            del gi.producer[old]
        node.output[idx] = new
        gi.producer[new] = (node, idx)
        self.names.add(new)
        self.tracker.gone.add(old)

    def remove_node(self, gi: GraphInfo, node: NodeProto) -> None:
        self._dead.clear()  # the values of the nodes that stay do not change
        for i, name in enumerate(node.input):
            if name:
                self._unuse(name, node, i)
                self.tracker.touched.add(name)
        for name in node.output:
            if name and gi.producer.get(name, (None,))[0] is node:
                del gi.producer[name]
                self.tracker.gone.add(name)
        self.dead.add(id(node))
        self._marked.append(node)

    def insert_after(self, gi: GraphInfo, anchor: NodeProto | None, node: NodeProto) -> None:
        """Add ``node`` right after ``anchor`` (None: first in ``gi``'s graph), placed at :meth:`compact`."""
        self._edited()
        self.inserts.setdefault(id(gi.graph) if anchor is None else id(anchor), []).append(node)
        self._marked.append(gi.graph if anchor is None else anchor)
        self._index_node(gi, node)

    def add_initializer(self, gi: GraphInfo, t: TensorProto) -> None:
        self._edited()
        gi.graph.initializer.append(t)
        gi.inits[t.name] = gi.graph.initializer[len(gi.graph.initializer) - 1]
        self.names.add(t.name)
        if self.ir_version < 4 and gi.parent is None:
            # IR < 4 lists every initializer among the graph inputs.
            gi.graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
            gi.inputs.add(t.name)

    def replace_initializer(self, gi: GraphInfo, t: TensorProto) -> None:
        """Overwrite the initializer named ``t.name`` in place (same name, same slot)."""
        self._edited()
        old = gi.inits[t.name]
        changed_shape = list(old.dims) != list(t.dims)
        old.CopyFrom(t)
        if changed_shape:
            self.forget_shape(gi, t.name)
            for v in gi.graph.input:
                if v.name == t.name:
                    v.CopyFrom(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))

    def forget_shape(self, gi: GraphInfo, name: str) -> None:
        """Drop the recorded shape of ``name`` (its value changed shape)."""
        drop_value_infos(gi.graph, {name})

    # --------------------------------------------------------------- finishing
    def compact(self) -> None:
        """Drop the removed nodes and place the inserted ones; deepest graphs first.  The marks are done with
        then: a second ``compact`` places only what was inserted or removed after this one.  The index is read
        again from the model as it now is (:meth:`~.index.ModelIndex.read_again`): a node list ``compact`` built
        again holds new elements, and an edit through a node the index held before would reach none of them."""
        try:
            self._compact()
        finally:
            self.dead.clear()
            self.inserts.clear()
            self._marked.clear()
            self.read_again()

    def _compact(self) -> None:
        for gi in sorted(self.graphs, key=lambda g: -g.depth):
            nodes = list(gi.graph.node)
            first = self.inserts.get(id(gi.graph), [])
            if not first and not any(id(n) in self.dead or id(n) in self.inserts for n in nodes):
                continue
            if not first and not any(id(n) in self.inserts for n in nodes):
                for i in range(len(nodes) - 1, -1, -1):
                    if id(nodes[i]) in self.dead:
                        del gi.graph.node[i]
                continue
            kept = self._placed(first + nodes)
            gi.graph.ClearField("node")
            gi.graph.node.extend(kept)

    def _placed(self, nodes: list[NodeProto]) -> list[NodeProto]:
        """``nodes`` less the removed ones, each followed by the nodes inserted after it, in the order they were
        inserted, and after each of those the nodes inserted after it in turn (an explicit stack: any depth)."""
        kept: list[NodeProto] = []
        todo = nodes[::-1]
        while todo:
            n = todo.pop()
            if id(n) not in self.dead:
                kept.append(n)
            todo.extend(self.inserts.get(id(n), [])[::-1])
        return kept


def drop_value_infos(graph: GraphProto, names: set[str]) -> None:
    """Drop the value_info entries of ``names`` (one pass over the graph's value_info)."""
    drop_named(graph.value_info, names)


def drop_named(entries, names: set[str]) -> None:
    """Delete the entries of a repeated proto field whose ``name`` is in ``names``: one pass to find
    them, then deletions from the end (each moves pointers in C, nothing is copied)."""
    if names:
        for i in [i for i, e in enumerate(entries) if e.name in names][::-1]:
            del entries[i]
