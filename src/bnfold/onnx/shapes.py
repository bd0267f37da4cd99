"""What ONNX shape inference knows of each value: its dims and element type.

Inference runs once, lazily, on a copy of the original model whose large
weights are left out (only their dims matter).  With ``declared=False`` (the
cost model: sizes that decide what bnfold allocates) what the file states about
its values is not believed: the copy's ``value_info`` and graph-output shapes are
removed first, so every shape comes from the ops (shape inference keeps a stated
shape when one is there); only the graph inputs' declared dims are kept, as the
inputs' contract.  The fold (ranks and axes of the values it rewrites) keeps
them: an exporter's ``value_info`` is what tells it the rank behind a ``view``.  A fold never changes a
value's shape, and keeps value names, so the answers stay valid while the
model is folded; names the fold makes up are simply unknown.
"""

from __future__ import annotations

import onnx
from google.protobuf.message import EncodeError


class Shapes:
    """Inferred static shapes and element types by value name (computed on first use).

    ``inputs`` (``{graph input: dims}``) sets those inputs' dims in the copy inference runs on (the cost
    model's check of a run on batches of known shapes); the model itself is never changed."""

    def __init__(self, model: onnx.ModelProto, declared: bool = True, inputs: dict[str, tuple] | None = None):
        self._model = model
        self._declared = declared
        self._inputs = inputs or {}
        self._dims: dict[str, list | None] | None = None
        self._types: dict[str, int] = {}

    def dims(self, name: str) -> list | None:
        """``[int | str | None, ...]`` (str: symbolic, None: unknown), or None if the rank is unknown."""
        if self._dims is None:
            self._dims, self._types = _infer(self._model, self._declared, self._inputs)
        return self._dims.get(name)

    def rank(self, name: str) -> int | None:
        d = self.dims(name)
        return None if d is None else len(d)

    def elem_type(self, name: str) -> int | None:
        """The ONNX element type (``TensorProto.FLOAT``...), or None if unknown."""
        if self._dims is None:
            self._dims, self._types = _infer(self._model, self._declared, self._inputs)
        return self._types.get(name) or None


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model``: through its serialized bytes (several times faster than ``CopyFrom``), or
    ``CopyFrom`` for a model too large to serialize (2 GiB; inference then runs on the copy without its
    large weights)."""
    try:
        data = model.SerializeToString()
    except (EncodeError, ValueError):
        m = onnx.ModelProto()
        m.CopyFrom(model)
        return m
    return onnx.ModelProto.FromString(data)


def _with_subgraphs(g: onnx.GraphProto) -> list[onnx.GraphProto]:
    """The subgraphs of ``g``'s nodes (the graph attributes of any node, not only If / Loop / Scan)."""
    found = []
    for n in g.node:
        for a in n.attribute:
            if a.type == _GRAPH:
                found.append(a.g)
            elif a.type == _GRAPHS:
                found.extend(a.graphs)
    return found


_GRAPH, _GRAPHS = onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS


def _infer(
    model: onnx.ModelProto, declared: bool = True, inputs: dict[str, tuple] | None = None
) -> tuple[dict[str, list | None], dict[str, int]]:
    m = _copy(model)
    for v in m.graph.input:
        if v.name in (inputs or {}) and v.type.HasField("tensor_type"):
            dims = v.type.tensor_type.shape.dim
            del dims[:]
            for d in inputs[v.name]:
                dims.add().dim_value = d
    graphs = [m.graph]
    nested = False  # whether any node holds a subgraph: else the result's nodes need no second walk
    while graphs:  # weights are not needed for shapes, only their dims
        g = graphs.pop()
        if not declared:  # stated shapes: not believed, recomputed from the ops
            del g.value_info[:]
            for v in g.output:
                if v.type.HasField("tensor_type"):
                    v.type.tensor_type.ClearField("shape")
        for t in g.initializer:
            if t.data_type not in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) and len(t.raw_data) > 4096:
                t.ClearField("raw_data")
        subs = _with_subgraphs(g)
        nested = nested or bool(subs)
        graphs.extend(subs)
    try:
        m = onnx.shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - inference is best effort; hops then skip
        pass
    dims: dict[str, list | None] = {}
    types: dict[str, int] = {}
    read: dict[bytes, tuple] = {}  # a value's type as serialized -> what it says (most values share a few)
    graphs = [m.graph]
    while graphs:
        g = graphs.pop()
        for t in g.initializer:
            _put(dims, types, t.name, [int(d) for d in t.dims], t.data_type)
        for values in (g.input, g.output, g.value_info):
            for v in values:
                ty = v.type
                key = ty.SerializeToString()
                said = read.get(key)
                if said is None:
                    said = read[key] = _read(ty)
                if said:
                    shape, elem_type = said
                    _put(dims, types, v.name, None if shape is None else list(shape), elem_type)
        if nested:
            graphs.extend(_with_subgraphs(g))
    return dims, types


def _read(ty: onnx.TypeProto) -> tuple:
    """What a value's type says: ``(dims or None, element type)``, or ``()`` for a type that is no tensor."""
    if ty.WhichOneof("value") != "tensor_type":
        return ()
    tt = ty.tensor_type
    if not tt.HasField("shape"):
        return None, tt.elem_type
    shape = tuple(
        d.dim_value if (k := d.WhichOneof("value")) == "dim_value" else d.dim_param if k else None for d in tt.shape.dim
    )
    return shape, tt.elem_type


def _put(dims: dict, types: dict, name: str, shape: list | None, elem_type: int) -> None:
    if shape is None:  # a type without a shape says nothing of the dims
        pass
    elif name in dims and dims[name] != shape:
        dims[name] = None  # the same name in two sibling subgraphs: unknown
    elif name not in dims:
        dims[name] = shape
    if types.get(name, elem_type) != elem_type:
        types[name] = 0
    else:
        types.setdefault(name, elem_type)
