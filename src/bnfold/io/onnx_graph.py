"""Checks on an untrusted ONNX graph before anything walks or evaluates it (needs onnx).

:func:`check_onnx_graph` refuses, with one-line ``ModelFileError`` messages:

* a graph that is not in topological order: a node reading a value that no
  graph input, initializer, earlier node or enclosing graph defines (this is
  how an Identity cycle shows), or two nodes writing the same value;
* graphs over :data:`MAX_NODES` nodes, or a chain of nodes deeper than
  :data:`MAX_DEPTH`;
* tensors whose dims are negative or whose element count overflows int64,
  or that would need more bytes than the byte budget;
* a ``ConstantOfShape`` or ``Expand`` whose constant shape (also through
  Identity / Cast / Reshape / ... of a constant) asks for more than the budget.

Every walk is iterative (an explicit stack), so no graph, however deep or
nested, reaches Python's recursion limit here.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx
from onnx import TensorProto

from ..errors import ModelFileError
from .limits import MAX_BYTES_HINT

MAX_NODES = 2_000_000
MAX_DEPTH = 200_000
MAX_ELEMENTS = 1 << 62


def tensor_elements(dims: list[int] | tuple[int, ...], where: str) -> int:
    """The element count of ``dims`` with Python integers (never wraps), refused when negative or huge."""
    n = 1
    for d in dims:
        if d < 0:
            raise ModelFileError(f"{where} has a negative dimension {d}")
        n *= d
        if n > MAX_ELEMENTS:
            raise ModelFileError(f"{where} declares more than 2**62 elements (its dims overflow); refused")
    return n


def itemsize(data_type: int) -> int:
    """Bytes per element (1 for packed and unknown types: a lower bound)."""
    try:
        return max(1, onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize)
    except (KeyError, ValueError, TypeError):
        return 1


def _graphs(model: onnx.ModelProto) -> Iterator[tuple[onnx.GraphProto, frozenset[str]]]:
    """Every graph of the model with the names its enclosing graphs define (subgraphs see outer values)."""
    stack: list[tuple[onnx.GraphProto, frozenset[str]]] = [(model.graph, frozenset())]
    for info in model.training_info:
        stack.append((info.initialization, frozenset()))
        stack.append((info.algorithm, frozenset()))
    while stack:
        graph, outer = stack.pop()
        yield graph, outer
        seen = set(outer | _defined(graph))
        for node in graph.node:
            subgraphs = [a.g for a in node.attribute if a.HasField("g")]
            subgraphs += [g for a in node.attribute for g in a.graphs]
            if subgraphs:
                inner = frozenset(seen)
                stack.extend((g, inner) for g in subgraphs)
            seen.update(node.output)


def _defined(graph: onnx.GraphProto) -> frozenset[str]:
    names = {i.name for i in graph.input}
    names.update(t.name for t in graph.initializer)
    names.update(sp.values.name for sp in graph.sparse_initializer)
    return frozenset(names)


def check_onnx_graph(model: onnx.ModelProto, path: str, budget: int, tensors: Iterator[TensorProto]) -> None:
    """Refuse a graph that is cyclic, unordered, too deep or asks for more memory than ``budget``."""
    for t in tensors:
        n = tensor_elements(list(t.dims), f"{path}: tensor {t.name!r}")
        if n * itemsize(t.data_type) > budget:
            raise ModelFileError(f"{path}: tensor {t.name!r} needs over {budget} bytes; {MAX_BYTES_HINT}")
    total = 0
    for graph, outer in _graphs(model):
        total += len(graph.node)
        if total > MAX_NODES:
            raise ModelFileError(f"{path}: the model has more than {MAX_NODES} nodes; refused")
        _check_order(graph, outer, path)
        _check_constant_of_shape(graph, path, budget)


def _check_order(graph: onnx.GraphProto, outer: frozenset[str], path: str) -> None:
    depth: dict[str, int] = dict.fromkeys(_defined(graph), 0)
    for node in graph.node:
        d = 0
        for name in node.input:
            if not name:
                continue  # an omitted optional input
            if name in depth:
                d = max(d, depth[name])
            elif name not in outer:
                raise ModelFileError(
                    f"{path}: node {node.name or node.op_type!r} reads {name!r} before anything writes it "
                    "(the graph is not in topological order, or has a cycle); refused"
                )
        d += 1
        if d > MAX_DEPTH:
            raise ModelFileError(f"{path}: a chain of more than {MAX_DEPTH} nodes; refused")
        for name in node.output:
            if not name:
                continue
            if name in depth:
                raise ModelFileError(f"{path}: value {name!r} is written twice (node {node.name!r}); refused")
            depth[name] = d


# ops whose output holds the same elements as their first input (what matters for a shape's product)
_SAME_ELEMENTS = ("Identity", "Cast", "CastLike", "Reshape", "Unsqueeze", "Squeeze", "Transpose")
# op -> index of the input that is a shape the frontend may fill (bnfold.onnx.consts evaluates these)
_SHAPE_INPUT = {"ConstantOfShape": 0, "Expand": 1}


def _check_constant_of_shape(graph: onnx.GraphProto, path: str, budget: int) -> None:
    """``ConstantOfShape`` / ``Expand`` of a constant shape may not ask for more than the budget."""
    from onnx import numpy_helper

    constants = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value" and a.HasField("t") and node.output:
                    constants[node.output[0]] = a.t
        elif node.op_type in _SAME_ELEMENTS and node.input and node.input[0] in constants and node.output:
            constants[node.output[0]] = constants[node.input[0]]
        elif node.op_type in _SHAPE_INPUT and len(node.input) > _SHAPE_INPUT[node.op_type]:
            name = node.input[_SHAPE_INPUT[node.op_type]]
            if name not in constants:
                continue
            t = constants[name]
            if tensor_elements(list(t.dims), f"{path}: shape of {node.name!r}") > 64:
                raise ModelFileError(f"{path}: {node.op_type} {node.name!r} has a shape of over 64 dims; refused")
            try:
                shape = [max(int(v), 0) for v in numpy_helper.to_array(t).reshape(-1)]
            except (ValueError, TypeError, OverflowError):
                raise ModelFileError(f"{path}: {node.op_type} {node.name!r} has a malformed shape") from None
            value_type = next((a.t.data_type for a in node.attribute if a.name == "value"), TensorProto.FLOAT)
            n = tensor_elements(shape, f"{path}: {node.op_type} {node.name!r}")
            if n * max(itemsize(value_type), 1) > budget:
                raise ModelFileError(
                    f"{path}: {node.op_type} {node.name!r} would fill {n} elements, over the budget of "
                    f"{budget} bytes; {MAX_BYTES_HINT}"
                )
