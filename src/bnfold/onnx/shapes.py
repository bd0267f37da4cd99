"""What ONNX shape inference knows of each value: its dims and element type.

Inference runs once, lazily, on a copy of what it reads of the original model,
whose large weights are copied without their data (only their dims matter).
With ``declared=False`` (the cost model: sizes that decide what bnfold
allocates) what the file states about its values is not believed: the copy
leaves out its ``value_info`` and graph-output shapes, so every shape comes from
the ops (shape inference keeps a stated shape when one is there); only the graph
inputs' declared dims are kept, as the inputs' contract.  The fold (ranks and axes of the values it rewrites) keeps
them: an exporter's ``value_info`` is what tells it the rank behind a ``view``.  A fold never changes a
value's shape, and keeps value names, so the answers stay valid while the
model is folded; names the fold makes up are simply unknown.
"""

from __future__ import annotations

import math

import onnx


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


def _for_inference(model: onnx.ModelProto, declared: bool, inputs: dict[str, tuple]) -> tuple[onnx.ModelProto, bool]:
    """The model inference runs on, and whether any of its nodes holds a subgraph: what inference reads of
    ``model`` (its graph, opset imports, IR version and functions), each graph copied by :func:`_copy_graph`,
    with the dims ``inputs`` gives those graph inputs.  A new model, built without the large weights' data
    rather than copied whole: copying a model of tens of MiB (through its serialized bytes or ``CopyFrom``)
    costs more than inferring its shapes."""
    m = onnx.ModelProto(ir_version=model.ir_version)
    m.opset_import.extend(model.opset_import)
    m.functions.extend(model.functions)
    nested = _copy_graph(model.graph, m.graph, declared)
    for v in m.graph.input:
        if v.name in inputs and v.type.HasField("tensor_type"):
            dims = v.type.tensor_type.shape.dim
            del dims[:]
            for d in inputs[v.name]:
                dims.add().dim_value = d
    return m, nested


def _copy_graph(g: onnx.GraphProto, copy: onnx.GraphProto, declared: bool) -> bool:
    """Copy into the empty ``copy`` what inference reads of graph ``g``: its nodes, inputs, outputs and
    initializers, the large weights (:func:`_large`: initializers, tensor attributes such as a Constant's
    value) without their data, and its stated ``value_info`` only if ``declared`` (else the outputs' shapes
    are left out too: stated shapes are not believed, but recomputed from the ops).  Returns whether a node
    holds a subgraph (copied the same way)."""
    copy.name = g.name
    copy.input.extend(g.input)
    copy.output.extend(g.output)
    copy.initializer.extend(_without_data(t) if _large(t) else t for t in g.initializer)
    copy.sparse_initializer.extend(g.sparse_initializer)
    if declared:
        copy.value_info.extend(g.value_info)
    else:
        for v in copy.output:
            if v.type.HasField("tensor_type"):
                v.type.tensor_type.ClearField("shape")
    nested = False
    same: list[onnx.NodeProto] = []  # nodes copied as they are (in one call, until a node that is not)
    for n in g.node:
        for a in n.attribute:
            kind = a.type
            if kind == _GRAPH or kind == _GRAPHS or (kind == _TENSOR and _large(a.t)):
                break
        else:
            same.append(n)
            continue
        copy.node.extend(same)
        same = []
        nested |= _copy_node(n, copy.node.add(), declared)
    copy.node.extend(same)
    return nested


def _copy_node(n: onnx.NodeProto, copy: onnx.NodeProto, declared: bool) -> bool:
    """:func:`_copy_graph` of a node with a subgraph or a large tensor attribute; returns whether it holds a
    subgraph."""
    copy.op_type, copy.domain, copy.name, copy.overload = n.op_type, n.domain, n.name, n.overload
    copy.input.extend(n.input)
    copy.output.extend(n.output)
    nested = False
    for a in n.attribute:
        kind = a.type
        if kind == _GRAPH:
            nested = True
            _copy_graph(a.g, copy.attribute.add(name=a.name, type=kind).g, declared)
        elif kind == _GRAPHS:
            nested = True
            graphs = copy.attribute.add(name=a.name, type=kind).graphs
            for g in a.graphs:
                _copy_graph(g, graphs.add(), declared)
        elif kind == _TENSOR and _large(a.t):
            copy.attribute.add(name=a.name, type=kind, t=_without_data(a.t))
        else:
            copy.attribute.append(a)
    return nested


def _large(t: onnx.TensorProto) -> bool:
    """Whether inference needs only ``t``'s dims: a tensor of more than 1024 elements that holds no shape
    (not int32 / int64; a shape inference reads is short)."""
    return t.data_type not in _SHAPE_TYPES and math.prod(t.dims) > 1024


def _without_data(t: onnx.TensorProto) -> onnx.TensorProto:
    """``t``'s name, dims and type: all inference reads of a tensor whose data it does not read."""
    return onnx.TensorProto(name=t.name, dims=t.dims, data_type=t.data_type)


_SHAPE_TYPES = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
_GRAPH, _GRAPHS, _TENSOR = onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS, onnx.AttributeProto.TENSOR


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


def _infer(
    model: onnx.ModelProto, declared: bool = True, inputs: dict[str, tuple] | None = None
) -> tuple[dict[str, list | None], dict[str, int]]:
    m, nested = _for_inference(model, declared, inputs or {})
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
            _put(dims, types, t.name, list(t.dims), t.data_type)
        for values in (g.input, g.output, g.value_info):
            for v in values:
                ty = v.type
                key = ty.SerializeToString()
                said = read.get(key)
                if said is None:
                    said = read[key] = _read(ty)
                if said:
                    shape, elem_type = said
                    name = v.name
                    if shape is not None and name not in types:  # the first word on a value (as _put)
                        dims[name], types[name] = list(shape), elem_type
                    else:
                        _put(dims, types, name, None if shape is None else list(shape), elem_type)
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
