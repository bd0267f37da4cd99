"""How an ONNX Conv or AveragePool slides over its input (re-parameterization,
``bnfold.engine.reparam``): attributes read into ``ConvGeometry`` / ``Pool``."""

from __future__ import annotations

from typing import Any

from ..engine.graph import ConvGeometry, Layer, Pool
from .nodes import attr, is_onnx_op
from .ops import AVG_POOLS  # (``count_include_pad`` defaults to 0 in ONNX)


def _auto_pad(p) -> str:
    value = attr(p, "auto_pad", b"NOTSET")
    return value.decode() if isinstance(value, bytes) else value


def _window(p, kernel: tuple) -> tuple | str:
    """(stride, dilation, pads) of a Conv / pool node with this ``kernel``, or why not known."""
    rank = len(kernel)
    stride = tuple(int(v) for v in (attr(p, "strides", None) or [1] * rank))
    dilation = tuple(int(v) for v in (attr(p, "dilations", None) or [1] * rank))
    auto_pad = _auto_pad(p)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return f"auto_pad={auto_pad}"
    pads = [0] * (2 * rank) if auto_pad == "VALID" else [int(v) for v in (attr(p, "pads", None) or [0] * (2 * rank))]
    if len(stride) != rank or len(dilation) != rank or len(pads) != 2 * rank:
        return "its strides, dilations or pads do not match its kernel"
    return stride, dilation, tuple((pads[i], pads[i + rank]) for i in range(rank))


def conv_geometry(layer: Layer, weight_dims: list | None) -> ConvGeometry | str:
    p = layer.node.proto
    if not is_onnx_op(p, "Conv"):
        return f"{p.op_type} is not a Conv"
    kernel = attr(p, "kernel_shape", None)
    if kernel is None:
        if weight_dims is None or not all(isinstance(d, int) for d in weight_dims):
            return "the shape of its weight is not known"
        kernel = weight_dims[2:]
    kernel = tuple(int(k) for k in kernel)
    window = _window(p, kernel)
    if isinstance(window, str):
        return window
    return ConvGeometry(kernel, window[0], window[1], window[2], layer.groups)


def parse_pool(graph: Any, node: Any) -> Pool | None:
    p = node.proto
    if not is_onnx_op(p, *AVG_POOLS) or len(p.input) != 1 or len(p.output) != 1:
        return None
    kernel = tuple(int(k) for k in (attr(p, "kernel_shape", None) or []))
    window = _window(p, kernel) if kernel else "no kernel_shape"
    if isinstance(window, str) or any(d != 1 for d in window[1]):
        return None
    v = graph.value
    return Pool(
        node,
        v(node.gi, p.input[0]),
        v(node.gi, p.output[0]),
        p.op_type,
        kernel,
        window[0],
        window[2],
        bool(int(attr(p, "count_include_pad", 0))),
        bool(int(attr(p, "ceil_mode", 0))),
    )
