"""The engine's handles on an ONNX model: a value is a name in a graph scope,
a node is a ``NodeProto`` of one graph.

Both are hashable and compare equal exactly when they name the same value or
node, as the engine requires.  They stay valid for a whole fold: node protos
leave their graph only in ``ModelEditor.compact``, after the engine is done.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx import NodeProto

from .index import GraphInfo
from .nodes import label


@dataclass(frozen=True)
class Value:
    """The value ``name`` of the graph ``gi`` that defines it (GraphInfo compares by identity)."""

    gi: GraphInfo
    name: str

    def __repr__(self) -> str:
        return f"Value({self.name!r} in {self.gi.path})"


def value(gi: GraphInfo, name: str) -> Value:
    """The value ``name`` as the graph ``gi`` sees it: held by the innermost enclosing graph that defines it."""
    for g in gi.chain():
        if name in g.producer or name in g.inits or name in g.inputs:
            return Value(g, name)
    return Value(gi, name)


class Node:
    """A node of the graph ``gi``; equal to another handle on the same proto."""

    __slots__ = ("gi", "proto")

    def __init__(self, proto: NodeProto, gi: GraphInfo):
        self.proto, self.gi = proto, gi

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Node) and other.proto is self.proto

    def __hash__(self) -> int:
        return id(self.proto)

    def __repr__(self) -> str:
        return f"Node({self.proto.op_type} {label(self.proto)!r})"
