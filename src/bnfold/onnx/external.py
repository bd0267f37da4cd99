"""Which models came from a file with external data, so that saving them keeps
their weights external.

A ModelProto takes no attributes and no weak references, so the mark lives in
a small table keyed by ``id(model)`` together with the names of the tensors
that were external; a lookup only counts when the model still holds those
names, so a new object that reuses a freed id is not mistaken for the model.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterator

import onnx
from onnx import TensorProto

DEFAULT_THRESHOLD = 1024  # bytes; onnx's own default for external data
_MAX_MARKS = 256


@dataclass(frozen=True)
class Mark:
    names: frozenset[str]  # tensors that were stored externally
    threshold: int  # the smallest of them, in bytes (at most DEFAULT_THRESHOLD)


_MARKS: "OrderedDict[int, Mark]" = OrderedDict()


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    yield from graph.initializer
    for sp in graph.sparse_initializer:
        yield sp.values
        yield sp.indices
    for node in graph.node:
        yield from _node_tensors(node)


def _node_tensors(node: onnx.NodeProto) -> Iterator[TensorProto]:
    for a in node.attribute:
        if a.HasField("t"):
            yield a.t
        yield from a.tensors
        if a.HasField("sparse_tensor"):
            yield a.sparse_tensor.values
            yield a.sparse_tensor.indices
        for sp in a.sparse_tensors:
            yield sp.values
            yield sp.indices
        if a.HasField("g"):
            yield from _graph_tensors(a.g)
        for g in a.graphs:
            yield from _graph_tensors(g)


def all_tensors(model: onnx.ModelProto) -> Iterator[TensorProto]:
    """Every tensor of the model: initializers and attribute tensors, in subgraphs and functions too."""
    yield from _graph_tensors(model.graph)
    for f in model.functions:
        for node in f.node:
            yield from _node_tensors(node)


def initializers(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    """Initializers of ``graph`` and of all its subgraphs."""
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("g"):
                yield from initializers(a.g)
            for g in a.graphs:
                yield from initializers(g)


def remember(model: onnx.ModelProto, mark: Mark) -> None:
    _MARKS[id(model)] = mark
    _MARKS.move_to_end(id(model))
    while len(_MARKS) > _MAX_MARKS:
        _MARKS.popitem(last=False)


def forget(model: onnx.ModelProto) -> None:
    _MARKS.pop(id(model), None)


def recall(model: onnx.ModelProto) -> Mark | None:
    mark = _MARKS.get(id(model))
    if mark is None:
        return None
    present = {t.name for t in all_tensors(model)}
    return mark if mark.names <= present else None


def inherit(src: onnx.ModelProto, dst: onnx.ModelProto) -> None:
    """Mark ``dst`` (a fold of ``src``) as external when ``src`` was."""
    mark = recall(src)
    if mark is None:
        return
    tensors = list(all_tensors(dst))
    names = {t.name for t in tensors} & mark.names
    if not names:
        names = {t.name for t in tensors if len(t.raw_data) >= mark.threshold}
    remember(dst, Mark(frozenset(names), mark.threshold))
