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
        check_tensor_data(t, n, f"{path}: tensor {t.name!r}")
    for sp in _sparse_tensors(model):
        where = f"{path}: sparse tensor {sp.values.name!r}"
        n = tensor_elements(list(sp.dims), where)
        if n * itemsize(sp.values.data_type) > budget:
            raise ModelFileError(f"{where} has dims {list(sp.dims)}: over {budget} bytes dense; {MAX_BYTES_HINT}")
    init = {t.name for t in model.graph.initializer}
    for v in model.graph.input:
        dims = _declared(v)
        if v.name in init or dims is None:
            continue
        where = f"{path}: input {v.name!r}"
        n = tensor_elements(dims, where)
        if n * itemsize(v.type.tensor_type.elem_type) > budget:
            raise ModelFileError(f"{where} declares dims {dims}: over {budget} bytes; {MAX_BYTES_HINT}")
    total = 0
    for graph, outer in _graphs(model):
        total += len(graph.node)
        if total > MAX_NODES:
            raise ModelFileError(f"{path}: the model has more than {MAX_NODES} nodes; refused")
        _check_order(graph, outer, path)
        _check_constant_of_shape(graph, path, budget)


# ONNX element type -> (the typed field its values go in, values per element)
_TYPED = {
    TensorProto.FLOAT: ("float_data", 1), TensorProto.COMPLEX64: ("float_data", 2),
    TensorProto.DOUBLE: ("double_data", 1), TensorProto.COMPLEX128: ("double_data", 2),
    TensorProto.INT64: ("int64_data", 1), TensorProto.UINT32: ("uint64_data", 1),
    TensorProto.UINT64: ("uint64_data", 1),
    **{t: ("int32_data", 1) for t in (
        TensorProto.INT32, TensorProto.INT16, TensorProto.INT8, TensorProto.UINT16, TensorProto.UINT8,
        TensorProto.BOOL, TensorProto.FLOAT16, TensorProto.BFLOAT16,
    )},
}  # fmt: skip
_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")


def check_tensor_data(t: TensorProto, n: int, where: str) -> None:
    """A numeric tensor whose data is where and as long as its dims say: in ``raw_data`` (exactly the
    bytes of ``n`` elements) or in its typed field (exactly ``n`` values), not both; never a string tensor."""
    if t.data_type == TensorProto.STRING:
        raise ModelFileError(f"{where} holds strings; bnfold reads numeric tensors only; refused")
    if t.data_type == TensorProto.UNDEFINED or t.data_type not in TensorProto.DataType.values():
        raise ModelFileError(f"{where} has no known element type ({t.data_type}); refused")
    if t.data_location == TensorProto.EXTERNAL:
        return  # its length is checked against the data file when it is read
    typed = [f for f in _FIELDS if len(getattr(t, f))]
    has_raw = t.HasField("raw_data")
    if has_raw and typed:
        raise ModelFileError(f"{where} sets both raw_data and {typed[0]}; a tensor holds its data once; refused")
    if len(typed) > 1:
        raise ModelFileError(f"{where} sets {typed[0]} and {typed[1]}; a tensor holds its data once; refused")
    field, per = _TYPED.get(t.data_type, (None, 0))
    if field is None:  # packed sub-byte and float8 types: stored as raw bytes or int32_data, not checked here
        return
    if has_raw:
        expected = n * itemsize(t.data_type)
        if len(t.raw_data) != expected:
            raise ModelFileError(
                f"{where} has {len(t.raw_data)} bytes of raw_data, but its dims {list(t.dims)} need {expected}"
            )
        return
    count = len(getattr(t, typed[0])) if typed else 0
    if typed and typed[0] != field:
        raise ModelFileError(f"{where} keeps its values in {typed[0]}, not where its type puts them ({field})")
    if count != n * per:
        raise ModelFileError(f"{where} holds {count} values, but its dims {list(t.dims)} need {n * per}")


def _sparse_tensors(model: onnx.ModelProto) -> Iterator[onnx.SparseTensorProto]:
    """Every sparse tensor: sparse initializers and sparse attributes, in every graph."""
    for graph, _ in _graphs(model):
        yield from graph.sparse_initializer
        for node in graph.node:
            for a in node.attribute:
                if a.HasField("sparse_tensor"):
                    yield a.sparse_tensor
                yield from a.sparse_tensors


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
# element-wise ops whose output has the broadcast shape of their inputs
_BROADCAST = (
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Where", "And", "Or", "Xor",
    "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Mod", "PRelu", "BitShift",
)  # fmt: skip
_SMALL = 64  # values of at most this many elements are followed (shapes)


class _Known:
    """What the load check knows of a value: its dims (None: unknown) and, for a small integer one, its value."""

    __slots__ = ("dims", "value")

    def __init__(self, dims: list[int] | None, value: list[int] | None = None):
        self.dims, self.value = dims, value


def _check_constant_of_shape(graph: onnx.GraphProto, path: str, budget: int) -> None:
    """No node whose result's size the graph fixes (``ConstantOfShape``, ``Expand``, broadcast element-wise
    ops, also of shapes computed by ``Shape`` / ``Concat`` / ``Expand`` / arithmetic of constants) may ask for
    more than the budget: the broadcast result is counted, not the shape input."""
    known: dict[str, _Known] = {}
    for t in graph.initializer:
        known[t.name] = _Known([int(d) for d in t.dims], _small_value(t))
    for v in graph.input:
        if v.name not in known:
            known[v.name] = _Known(_declared(v))
    for node in graph.node:
        out = _propagate(node, known, path, budget)
        if out is not None and node.output and node.output[0]:
            known[node.output[0]] = out


def _declared(v: onnx.ValueInfoProto) -> list[int] | None:
    tt = v.type.tensor_type if v.type.HasField("tensor_type") else None
    if tt is None or not tt.HasField("shape"):
        return None
    # an open dim counts as 1; so does a negative dim_value, which paddle2onnx writes for a dynamic axis
    return [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else 1 for d in tt.shape.dim]


def _small_value(t: TensorProto) -> list[int] | None:
    from onnx import numpy_helper

    if t.data_type not in (TensorProto.INT64, TensorProto.INT32) or tensor_elements(list(t.dims), t.name) > _SMALL:
        return None
    if t.data_location == TensorProto.EXTERNAL:  # not read yet (and never through a path the file names)
        return None
    try:
        return [int(v) for v in numpy_helper.to_array(t).reshape(-1)]
    except (ValueError, TypeError, OverflowError):
        return None


def _broadcast(shapes: list[list[int]]) -> list[int] | None:
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            return None  # not broadcastable: the op fails when it runs
        out.append(dims.pop() if dims else 1)
    return out


def _refuse_if_big(node: onnx.NodeProto, dims: list[int], itemsize_: int, path: str, budget: int) -> None:
    n = tensor_elements(dims, f"{path}: {node.op_type} {node.name!r}")
    if n * itemsize_ > budget:
        raise ModelFileError(
            f"{path}: {node.op_type} {node.name!r} would make {n} elements ({dims}), over the budget of "
            f"{budget} bytes; {MAX_BYTES_HINT}"
        )


def _propagate(node: onnx.NodeProto, known: dict[str, _Known], path: str, budget: int) -> _Known | None:
    """What ``node``'s first output is, from what is known of its inputs; refused when too big."""
    op = node.op_type
    ins = [known.get(n) if n else None for n in node.input]
    first = ins[0] if ins else None
    if op == "Constant":
        for a in node.attribute:
            if a.name == "value" and a.HasField("t"):
                return _Known([int(d) for d in a.t.dims], _small_value(a.t))
            if a.name == "value_ints":
                return _Known([len(a.ints)], [int(i) for i in a.ints][:_SMALL] if len(a.ints) <= _SMALL else None)
            if a.name == "value_int":
                return _Known([], [int(a.i)])
        return None
    if op == "Shape":
        return None if first is None or first.dims is None else _Known([len(first.dims)], list(first.dims))
    if op in _SHAPE_INPUT:
        k = _SHAPE_INPUT[op]
        shape = ins[k] if len(ins) > k else None
        if shape is None or shape.value is None:
            if shape is not None and shape.dims is not None and tensor_elements(shape.dims, node.name) > _SMALL:
                raise ModelFileError(f"{path}: {op} {node.name!r} has a shape of over {_SMALL} dims; refused")
            return None
        dims = [max(int(v), 0) for v in shape.value]
        if op == "Expand":
            if first is None or first.dims is None:
                out = dims
            else:
                out = _broadcast([first.dims, dims])
                if out is None:
                    return None
            value = None
            if first is not None and first.value is not None and len(out) <= 1 and tensor_elements(out, "") <= _SMALL:
                value = (first.value * out[0]) if first.value and len(first.value) == 1 and out else first.value
            _refuse_if_big(node, out, 8, path, budget)
            return _Known(out, value)
        vt = next((a.t.data_type for a in node.attribute if a.name == "value"), TensorProto.FLOAT)
        _refuse_if_big(node, dims, itemsize(vt), path, budget)
        return _Known(dims, None)
    if op in _BROADCAST:
        shapes = [i.dims for i in ins if i is not None and i.dims is not None]
        if not shapes or len(shapes) != len([n for n in node.input if n]):
            return None
        out = _broadcast(shapes)
        if out is None:
            return None
        _refuse_if_big(node, out, 4, path, budget)
        value = None
        if op in ("Add", "Sub", "Mul") and all(i.value is not None for i in ins) and len(ins) == 2:
            a, b = ins[0].value, ins[1].value
            if len(a) == len(b) or len(a) == 1 or len(b) == 1:
                n = max(len(a), len(b))
                a, b = (a * n if len(a) == 1 else a), (b * n if len(b) == 1 else b)
                f = {"Add": lambda x, y: x + y, "Sub": lambda x, y: x - y, "Mul": lambda x, y: x * y}[op]
                value = [f(x, y) for x, y in zip(a, b)]
        return _Known(out, value)
    if op == "Concat" and ins and all(i is not None and i.value is not None for i in ins):
        value = [v for i in ins for v in i.value]
        return _Known([len(value)], value) if len(value) <= _SMALL else _Known([len(value)])
    if op in _SAME_ELEMENTS and first is not None:
        if op in ("Identity", "Cast", "CastLike"):
            return first
        return _Known(None, first.value if op in ("Reshape", "Unsqueeze", "Squeeze") else None)
    if op == "Tile" and first is not None and first.dims is not None and len(ins) > 1 and ins[1] is not None:
        reps = ins[1].value
        if reps is not None and len(reps) == len(first.dims):
            out = [d * max(int(r), 0) for d, r in zip(first.dims, reps)]
            _refuse_if_big(node, out, 4, path, budget)
            return _Known(out)
    return None
