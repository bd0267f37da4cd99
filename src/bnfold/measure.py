"""Model sizes for ``report.stats``: graph nodes, parameter elements and parameter bytes.

Torch-free at import.  ``fx_sizes`` reads a program (its parameters, buffers and constants) or a
GraphModule (its state_dict); ``onnx_sizes`` reads an ONNX model's main graph: its initializers
and the tensors held in its ``Constant`` nodes (paddle2onnx keeps weights there), so a fold that
turns a Constant-held weight into an initializer saves nothing it did not remove.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from .report import FoldResult, FoldStats

#: ``(graph nodes, parameter elements, parameter bytes)``
Sizes = tuple[int, int, int]


def fx_sizes(model: Any) -> Sizes:
    """The sizes of a ``torch.export.ExportedProgram`` or a ``torch.fx.GraphModule``."""
    graph = model.graph
    if hasattr(model, "graph_signature"):  # an ExportedProgram
        tensors = [*model.state_dict.values(), *model.constants.values()]
    else:
        tensors = [*model.state_dict().values()]
    tensors = [t for t in tensors if hasattr(t, "numel")]
    return len(graph.nodes), sum(t.numel() for t in tensors), sum(t.numel() * t.element_size() for t in tensors)


def onnx_sizes(model: Any) -> Sizes:
    """The sizes of an ``onnx.ModelProto``: main-graph nodes, initializers and Constant-node tensors."""
    from onnx import helper

    params = nbytes = 0
    for init in model.graph.initializer:
        n = math.prod(init.dims)
        params += n
        nbytes += n * helper.tensor_dtype_to_np_dtype(init.data_type).itemsize
    for node in model.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            n, b = _constant_size(node)
            params += n
            nbytes += b
    return len(model.graph.node), params, nbytes


def _constant_size(node: Any) -> tuple[int, int]:
    """Elements and bytes of the tensor a ``Constant`` node holds (its one value attribute)."""
    from onnx import AttributeProto, helper

    for a in node.attribute:
        if a.type == AttributeProto.TENSOR:
            n = math.prod(a.t.dims)
            return n, n * helper.tensor_dtype_to_np_dtype(a.t.data_type).itemsize
        if a.type == AttributeProto.SPARSE_TENSOR:
            n = math.prod(a.sparse_tensor.values.dims)
            return n, n * helper.tensor_dtype_to_np_dtype(a.sparse_tensor.values.data_type).itemsize
        if a.type in (AttributeProto.FLOAT, AttributeProto.INT):
            return 1, 4 if a.type == AttributeProto.FLOAT else 8
        if a.type in (AttributeProto.FLOATS, AttributeProto.INTS):
            n = len(a.floats) if a.type == AttributeProto.FLOATS else len(a.ints)
            return n, n * (4 if a.type == AttributeProto.FLOATS else 8)
    return 0, 0


def timed(before: Any, run: Callable[[], FoldResult], sizes: Callable[[Any], Sizes]) -> FoldResult:
    """``run()``'s result with ``report.stats``: ``sizes`` of ``before`` and of the folded model, and the time."""
    nodes_b, params_b, bytes_b = sizes(before)  # first: an in-place fold consumes ``before``
    start = time.perf_counter()
    result = run()
    seconds = time.perf_counter() - start
    nodes_a, params_a, bytes_a = sizes(result.model)
    result.report.stats = FoldStats(nodes_b, nodes_a, params_b, params_a, bytes_b, bytes_a, seconds)
    return result
