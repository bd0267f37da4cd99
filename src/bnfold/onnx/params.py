"""Writing a folded parameter back into an ONNX graph, as an initializer of
the layer's dtype: in place under its own name when only this node reads
it, as a private copy when others do, as a new initializer when there was none.
"""

from __future__ import annotations

import re

import onnx
import torch
from onnx import NodeProto

from .editor import ModelEditor
from .index import GraphInfo
from .nodes import label
from .tensors import elem_type, from_torch, nbytes


def safe(s: str) -> str:
    """``s`` as a piece of a tensor or node name."""
    return re.sub(r"[^A-Za-z0-9_.:/-]+", "_", s).strip("_") or "node"


def set_param(
    index: ModelEditor, gi: GraphInfo, node: NodeProto, idx: int, value: torch.Tensor, owner: NodeProto | None = None
) -> int:
    """Make ``node.input[idx]`` hold ``value`` (in its dtype); returns the bytes of a private copy, if one was made.

    A parameter only this node uses is overwritten under its own name (a
    Constant node, or a node computing a constant, becomes an initializer of
    the same name).  A shared one gets a private copy named
    ``<name>_folded_<owner>`` (the layer the parameter is for, ``node`` by
    default); the others keep the original.
    """
    owner = node if owner is None else owner
    kind = elem_type(value.dtype)
    old = node.input[idx] if idx < len(node.input) else ""
    extra = 0
    if old:
        c = index.constant(gi, old, "parameter")
        assert not isinstance(c, str), c
        others = [u for u in index.live_uses(c.gi, old) if not (u.node is node and u.idx == idx)]
        if not others and c.gi is gi:
            t = from_torch(value, old, kind)
            if c.node is None:
                index.replace_initializer(gi, t)
            else:
                index.remove_node(gi, c.node)
                index.add_initializer(gi, t)
                if tuple(c.value.shape) != tuple(t.dims):
                    index.forget_shape(gi, old)
            index.tracker.touched.discard(old)
            return 0
        new = index.unique(f"{safe(old)}_folded_{safe(label(owner))}")
        t = from_torch(value, new, kind)
        if others:
            extra = nbytes(t)
    else:
        new = index.unique(f"{safe(label(owner))}_bias")
        t = from_torch(value, new, kind)
    index.add_initializer(gi, t)
    index.set_input(gi, node, idx, new)
    return extra


def add_initializer(index: ModelEditor, gi: GraphInfo, base: str, value: torch.Tensor) -> str:
    """A new initializer holding ``value``, named after ``base``; returns its name."""
    name = index.unique(safe(base))
    index.add_initializer(gi, from_torch(value, name, elem_type(value.dtype)))
    return name


def filled_initializer(
    index: ModelEditor, gi: GraphInfo, base: str, shape: tuple, dtype: torch.dtype, fill: float
) -> str:
    """A new initializer of ``shape`` and ``dtype`` holding ``fill`` everywhere; returns its name."""
    return add_initializer(index, gi, base, torch.full(shape, fill, dtype=dtype))


def new_node(
    index: ModelEditor, op_type: str, inputs: list[str], outputs: list[str], base: str, like: NodeProto | None = None
) -> NodeProto:
    """A node with a model-unique name; ``like``: copy its attributes and domain."""
    node = onnx.helper.make_node(op_type, inputs, outputs, name=index.unique_node_name(safe(base)))
    if like is not None:
        node.attribute.extend(like.attribute)
        node.domain = like.domain
    return node
