"""Small helpers to read ONNX nodes."""

from __future__ import annotations

from typing import Iterator

import onnx
from onnx import GraphProto, NodeProto


def label(node: NodeProto) -> str:
    """A readable node name: its own, or ``Op(first output)`` when it has none."""
    return node.name or f"{node.op_type}({node.output[0] if node.output else ''})"


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
