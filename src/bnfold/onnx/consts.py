"""Evaluate the few shape and cast ops exporters put between a stored constant
and the layer that reads it (Identity aliases, a zero bias built with
Shape/Expand/CastLike, a Reshape of statistics, a ConstantOfShape fill), so
such values count as constants.  Plain numpy; nothing here is fold arithmetic.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import NodeProto

from .nodes import attr

CONST_OPS = (
    "Identity",
    "Cast",
    "CastLike",
    "Expand",
    "Shape",
    "Reshape",
    "Unsqueeze",
    "Squeeze",
    "ConstantOfShape",
    "Transpose",
)


def evaluate(node: NodeProto, inputs: list[np.ndarray | None], meter=None) -> np.ndarray | None:
    """The value of ``node``'s first output, or None when it cannot be computed here.

    ``inputs`` holds the constant inputs; for CastLike the second one may be an
    empty array that only carries the target dtype.  ``meter``
    (``bnfold.io.cost.Meter``) is charged with the bytes of the result before
    it is made (the broadcast result for Expand, the fill for ConstantOfShape).
    """
    op = node.op_type
    x = inputs[0] if inputs else None
    if op == "Shape":  # only the shape of the input is needed, not its value
        return None if x is None else _shape(x.shape, node)
    if x is None or any(v is None for v in inputs[1:]):
        return None
    if meter is not None:
        nbytes = result_bytes(node, inputs)
        if nbytes is None:
            return None
        meter.charge(f"{op} '{node.name or node.output[0]}'", nbytes)
    if op == "Identity":
        return x
    if op == "Transpose":
        perm = attr(node, "perm")
        return np.ascontiguousarray(np.transpose(x, None if perm is None else [int(p) for p in perm]))
    if op == "ConstantOfShape":
        v = attr(node, "value")
        fill = np.zeros(1, np.float32) if v is None else onnx.numpy_helper.to_array(v).reshape(-1)
        return np.full([int(d) for d in x.reshape(-1)], fill[0], dtype=fill.dtype)
    if op == "Cast":
        return x.astype(onnx.helper.tensor_dtype_to_np_dtype(int(attr(node, "to"))))
    if op == "CastLike":
        return x.astype(inputs[1].dtype)
    if op == "Expand":
        shape = [int(s) for s in inputs[1].reshape(-1)]
        return np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(shape))).copy()
    if op == "Reshape":
        shape = [int(s) for s in inputs[1].reshape(-1)]
        if not attr(node, "allowzero", 0):
            shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
        return x.reshape(shape)
    if op in ("Unsqueeze", "Squeeze"):
        axes = [int(a) for a in inputs[1].reshape(-1)] if len(inputs) > 1 else attr(node, "axes")
        if op == "Squeeze":
            return np.squeeze(x, axis=None if axes is None else tuple(axes))
        out = x
        rank = x.ndim + len(axes)
        for a in sorted(a % rank for a in axes):
            out = np.expand_dims(out, a)
        return out
    return None


def result_bytes(node: NodeProto, inputs: list[np.ndarray]) -> int | None:
    """The bytes ``evaluate`` allocates for ``node``'s result (0 for an alias), without making it."""
    from ..io.cost import elements

    op, x = node.op_type, inputs[0]
    if op == "Identity":
        return 0
    if op == "ConstantOfShape":
        v = attr(node, "value")
        size = 4 if v is None else onnx.helper.tensor_dtype_to_np_dtype(v.data_type).itemsize
        return elements(int(d) for d in x.reshape(-1)) * size
    if op == "Expand":
        shape = tuple(int(s) for s in inputs[1].reshape(-1))
        if len(shape) > 64 or any(s < 0 for s in shape):
            return None
        return elements(np.broadcast_shapes(x.shape, shape)) * x.dtype.itemsize
    itemsize = x.dtype.itemsize
    if op == "Cast":
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(int(attr(node, "to"))).itemsize
    elif op == "CastLike":
        itemsize = inputs[1].dtype.itemsize
    return x.size * itemsize


def _shape(shape, node: NodeProto) -> np.ndarray:
    r = len(shape)
    start = int(attr(node, "start", 0))
    end = attr(node, "end", None)
    end = r if end is None else int(end)
    start, end = max(0, start + r if start < 0 else start), min(r, end + r if end < 0 else end)
    return np.array(shape[start:end], dtype=np.int64)


def inputs_needed(node: NodeProto) -> list[int]:
    """Which inputs must be constant (CastLike's second input only gives a dtype)."""
    if node.op_type == "CastLike":
        return [0]
    return [i for i, n in enumerate(node.input) if n]
