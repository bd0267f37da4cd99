"""Small helpers to read ONNX nodes (and a model's graph inputs)."""

from __future__ import annotations

from collections.abc import Iterator

import onnx
from onnx import GraphProto, NodeProto


def label(node: NodeProto) -> str:
    """A node's name in reports: its own, or its first output's when it has none."""
    return node.name or (node.output[0] if node.output else node.op_type)


def attr(node: NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def remove_attr(node: NodeProto, name: str) -> None:
    for i, a in enumerate(node.attribute):
        if a.name == name:
            del node.attribute[i]
            return


def is_onnx_op(node: NodeProto, *op_types: str) -> bool:
    return node.domain in ("", "ai.onnx") and node.op_type in op_types


def subgraphs(node: NodeProto) -> Iterator[tuple[str, GraphProto]]:
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            yield a.name, a.g
        elif a.type == onnx.AttributeProto.GRAPHS:
            for i, g in enumerate(a.graphs):
                yield f"{a.name}[{i}]", g


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The main graph's inputs that are no initializers: what a caller feeds."""
    init = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in init]
