"""Where the channels are: the channel axis of a value, followed through the
shape-only hops (Identity, Dropout, Unsqueeze, Squeeze, Reshape, Transpose).

Static shapes come from ONNX shape inference, run once and only when a hop
needs them, on a copy of the original model whose large weights are left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np
import onnx
from onnx import NodeProto

from .graph import GraphInfo, ModelIndex
from .nodes import attr, is_onnx_op, label, subgraphs

HOPS = ("Identity", "Dropout", "Unsqueeze", "Squeeze", "Reshape", "Transpose")


@dataclass(frozen=True)
class Chan:
    """A value of rank ``rank`` whose ``channels`` channels lie along ``axis``.

    When the rank is unknown, ``axis`` is -1: the channels are the last axis.
    """

    rank: int | None
    axis: int
    channels: int

    def describe(self) -> str:
        return "the last axis" if self.rank is None else f"axis {self.axis}"


class Shapes:
    """Inferred static shapes by value name (computed lazily)."""

    def __init__(self, model: onnx.ModelProto):
        self._model = model
        self._dims: dict[str, list | None] | None = None

    def dims(self, name: str) -> list | None:
        """``[int | str | None, ...]`` (str: symbolic, None: unknown), or None if the rank is unknown."""
        if self._dims is None:
            self._dims = _infer(self._model)
        return self._dims.get(name)

    def rank(self, name: str) -> int | None:
        d = self.dims(name)
        return None if d is None else len(d)


def _infer(model: onnx.ModelProto) -> dict[str, list | None]:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    graphs = [m.graph]
    while graphs:  # weights are not needed for shapes, only their dims
        g = graphs.pop()
        for t in g.initializer:
            if t.data_type not in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) and len(t.raw_data) > 4096:
                t.ClearField("raw_data")
        for n in g.node:
            graphs.extend(sub for _, sub in subgraphs(n))
    try:
        m = onnx.shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - inference is best effort; hops then skip
        pass
    out: dict[str, list | None] = {}
    graphs = [m.graph]
    while graphs:
        g = graphs.pop()
        for t in g.initializer:
            _put(out, t.name, [int(d) for d in t.dims])
        for v in list(g.input) + list(g.output) + list(g.value_info):
            tt = v.type.tensor_type if v.type.HasField("tensor_type") else None
            if tt is None or not tt.HasField("shape"):
                continue
            dims = []
            for d in tt.shape.dim:
                if d.HasField("dim_value"):
                    dims.append(int(d.dim_value))
                elif d.HasField("dim_param"):
                    dims.append(d.dim_param)
                else:
                    dims.append(None)
            _put(out, v.name, dims)
        for n in g.node:
            graphs.extend(sub for _, sub in subgraphs(n))
    return out


def _put(out: dict, name: str, dims: list) -> None:
    if name in out and out[name] != dims:
        out[name] = None  # the same name in two sibling subgraphs: unknown
    elif name not in out:
        out[name] = dims


def _product(dims: list):
    """A comparable product of dims: (int part, sorted symbols), or None if a dim is unknown."""
    if any(d is None for d in dims):
        return None
    return prod(d for d in dims if isinstance(d, int)), tuple(sorted(d for d in dims if isinstance(d, str)))


def _axes(index: ModelIndex, gi: GraphInfo, node: NodeProto) -> list[int] | None | str:
    """The ``axes`` of Squeeze/Unsqueeze (attribute before opset 13, input after)."""
    if len(node.input) > 1 and node.input[1]:
        c = index.constant(gi, node.input[1], f"{node.op_type} axes")
        if isinstance(c, str):
            return c
        return [int(a) for a in np.asarray(c.value).reshape(-1)]
    a = attr(node, "axes")
    return None if a is None else [int(x) for x in a]


def hop_forward(index: ModelIndex, gi: GraphInfo, node: NodeProto, chan: Chan, shapes: Shapes) -> Chan | str:
    """The channel placement after the hop ``node``, or why it does not keep the channel axis."""
    what = f"{node.op_type} '{label(node)}'"
    if is_onnx_op(node, "Identity"):
        return chan
    if is_onnx_op(node, "Dropout"):
        if attr(node, "is_test", 0 if index.opset < 7 else 1) == 0:  # opset < 7 defaults to training
            return f"{what} has is_test=0 (training mode)"
        if len(node.input) > 2 and node.input[2]:
            c = index.constant(gi, node.input[2], f"{what} training_mode")
            if isinstance(c, str) or np.asarray(c.value).any():
                return f"{what} may run in training mode (training_mode is not a constant false)"
        return chan
    rank = chan.rank if chan.rank is not None else shapes.rank(node.input[0])
    if rank is None:
        return f"the rank before {what} is unknown, so the channel axis cannot be followed"
    axis = chan.axis % rank
    if is_onnx_op(node, "Unsqueeze"):
        axes = _axes(index, gi, node)
        if isinstance(axes, str) or axes is None:
            return f"{what} has no constant axes" if axes is None else axes
        out_rank = rank + len(axes)
        inserted = {a % out_rank for a in axes}
        kept = [i for i in range(out_rank) if i not in inserted]
        return Chan(out_rank, kept[axis], chan.channels)
    if is_onnx_op(node, "Squeeze"):
        axes = _axes(index, gi, node)
        if isinstance(axes, str):
            return axes
        if axes is None:
            dims = shapes.dims(node.input[0])
            if dims is None or any(not isinstance(d, int) for d in dims):
                return f"{what} squeezes every size-1 axis and the shape before it is not static"
            axes = [i for i, d in enumerate(dims) if d == 1]
        removed = {a % rank for a in axes}
        if axis in removed:
            return f"{what} removes the channel axis"
        return Chan(rank - len(removed), axis - sum(1 for a in removed if a < axis), chan.channels)
    if is_onnx_op(node, "Transpose"):
        perm = attr(node, "perm")
        perm = list(range(rank - 1, -1, -1)) if perm is None else [int(p) % rank for p in perm]
        if sorted(perm) != list(range(rank)):
            return f"{what} has a perm that does not match the rank {rank}"
        return Chan(rank, perm.index(axis), chan.channels)
    if is_onnx_op(node, "Reshape"):
        return _reshape(index, gi, node, Chan(rank, axis, chan.channels), shapes, what)
    return f"{what} is not a shape-only hop"


def _reshape(index: ModelIndex, gi: GraphInfo, node: NodeProto, chan: Chan, shapes: Shapes, what: str) -> Chan | str:
    src = shapes.dims(node.input[0])
    if src is None or len(src) != chan.rank:
        return f"the shape before {what} is unknown, so the channel axis cannot be followed"
    dst = shapes.dims(node.output[0])
    c = index.constant(gi, node.input[1], f"{what} shape") if len(node.input) > 1 else "no shape"
    if not isinstance(c, str):
        target = [int(s) for s in np.asarray(c.value).reshape(-1)]
        allowzero = attr(node, "allowzero", 0)
        built = []
        for i, s in enumerate(target):
            if s == 0 and not allowzero:
                built.append(src[i] if i < len(src) else None)
            elif s == -1:
                built.append(None)
            else:
                built.append(s)
        if dst is not None and len(dst) == len(built):
            built = [b if b is not None else d for b, d in zip(built, dst)]
        dst = built
    if dst is None:
        return f"the shape after {what} is unknown, so the channel axis cannot be followed"
    a = chan.axis
    for k, d in enumerate(dst):
        if d != chan.channels:
            continue
        pre_src, pre_dst = _product(src[:a]), _product(dst[:k])
        post_src, post_dst = _product(src[a + 1 :]), _product(dst[k + 1 :])
        if (pre_src is not None and pre_src == pre_dst) or (post_src is not None and post_src == post_dst):
            return Chan(len(dst), k, chan.channels)
    return f"{what} does not keep the channel axis (shape {_fmt(src)} -> {_fmt(dst)}, channels on axis {a})"


def _fmt(dims: list) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"
