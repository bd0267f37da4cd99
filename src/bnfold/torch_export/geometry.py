"""What the re-parameterization (``bnfold.engine.reparam``) reads of an fx graph besides the fold's
op tables: how a conv or an average pool slides over its input (the conv rows of ``ops.LAYERS`` and
the ``ops.AVG_POOLS`` rows, read into ``ConvGeometry`` / ``Pool``), and the in-place sums
(``out += branch(x)``) the training IR keeps."""

from __future__ import annotations

from typing import Any

from torch.fx import Node

from ..engine.graph import Binary, ConvGeometry, Layer, Pool
from .ops import AVG_POOLS, INPLACE_BINARY_OPS, LAYERS, node_arg, node_key, op_name


def _tuple(value: Any, rank: int, what: str) -> tuple | str:
    if isinstance(value, (list, tuple)):
        if len(value) == 1:
            value = value[0]
        elif len(value) == rank:
            return tuple(int(v) for v in value)
        else:
            return f"its {what} {list(value)} does not match the kernel's {rank} spatial axes"
    return (int(value),) * rank


#: Where every conv row of ``ops.LAYERS`` holds its stride, padding and dilation (``conv2d`` and
#: ``convolution`` alike: ``(input, weight, bias, stride, padding, dilation, ...)``); groups are in the Layer.
CONV_ARGS = (3, 4, 5)


def conv_geometry(layer: Layer, kernel: tuple | None) -> ConvGeometry | str:
    node = layer.node
    if node_key(node) not in LAYERS or layer.kind != "conv":
        return f"{op_name(node.target)} is not a conv"
    if kernel is None:
        return "the shape of its weight is not known"
    rank = len(kernel)
    s_at, p_at, d_at = CONV_ARGS
    stride = _tuple(node_arg(node, s_at, "stride", 1), rank, "stride")
    padding = node_arg(node, p_at, "padding", 0)
    dilation = _tuple(node_arg(node, d_at, "dilation", 1), rank, "dilation")
    if isinstance(dilation, str) or isinstance(stride, str):
        return dilation if isinstance(dilation, str) else stride
    if padding == "same":  # torch pads d*(k-1) in all, the odd one at the end
        totals = [d * (k - 1) for d, k in zip(dilation, kernel)]
        pads = tuple((t // 2, t - t // 2) for t in totals)
    elif isinstance(padding, str):
        if padding != "valid":
            return f"padding={padding!r}"
        pads = ((0, 0),) * rank
    else:
        padding = _tuple(padding, rank, "padding")
        if isinstance(padding, str):
            return padding
        pads = tuple((p, p) for p in padding)
    return ConvGeometry(tuple(kernel), stride, dilation, pads, layer.groups)


def parse_pool(node: Node) -> Pool | None:
    rank = AVG_POOLS.get(node_key(node))
    if rank is None or not node.args or not isinstance(node.args[0], Node):
        return None
    kernel = _tuple(node.args[1], rank, "kernel")
    stride = node_arg(node, 2, "stride", [])
    stride = kernel if stride in ([], (), None) else _tuple(stride, rank, "stride")
    padding = _tuple(node_arg(node, 3, "padding", 0), rank, "padding")
    if any(isinstance(v, str) for v in (kernel, stride, padding)):
        return None
    return Pool(
        node,
        node.args[0],
        node,
        op_name(node.target),
        kernel,
        stride,
        tuple((p, p) for p in padding),
        bool(node_arg(node, 5, "count_include_pad", True)),
        bool(node_arg(node, 4, "ceil_mode", False)),
        node_arg(node, 6, "divisor_override", None),
    )


#: In-place sums: ``out += branch(x)`` is ``aten.add_.Tensor`` in the training IR (run_decompositions
#: makes it ``add``).  Only the merge reads them, and only where nothing else reads what they mutate.
INPLACE_SUMS = {key: INPLACE_BINARY_OPS[key] for key in ("aten::add_.Tensor", "aten::sub_.Tensor")}


def parse_inplace_sum(node: Node) -> Binary | None:
    """``a += alpha * b`` (``a -= ...``) as a Binary whose output is the node (``a``, mutated)."""
    op = INPLACE_SUMS.get(node_key(node))
    if op is None or len(node.args) < 2:
        return None
    return Binary(node, op, node.args[0], node.args[1], node, node.kwargs.get("alpha", 1), op_name(node.target))
