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

from .nodes import subgraphs


class Shapes:
    """Inferred static shapes and element types by value name (computed on first use)."""

    def __init__(self, model: onnx.ModelProto, declared: bool = True):
        self._model = model
        self._declared = declared
        self._dims: dict[str, list | None] | None = None
        self._types: dict[str, int] = {}

    def dims(self, name: str) -> list | None:
        """``[int | str | None, ...]`` (str: symbolic, None: unknown), or None if the rank is unknown."""
        if self._dims is None:
            self._dims, self._types = _infer(self._model, self._declared)
        return self._dims.get(name)

    def rank(self, name: str) -> int | None:
        d = self.dims(name)
        return None if d is None else len(d)

    def elem_type(self, name: str) -> int | None:
        """The ONNX element type (``TensorProto.FLOAT``...), or None if unknown."""
        if self._dims is None:
            self._dims, self._types = _infer(self._model, self._declared)
        return self._types.get(name) or None


def _infer(model: onnx.ModelProto, declared: bool = True) -> tuple[dict[str, list | None], dict[str, int]]:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    graphs = [m.graph]
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
        for n in g.node:
            graphs.extend(sub for _, sub in subgraphs(n))
    try:
        m = onnx.shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - inference is best effort; hops then skip
        pass
    dims: dict[str, list | None] = {}
    types: dict[str, int] = {}
    graphs = [m.graph]
    while graphs:
        g = graphs.pop()
        for t in g.initializer:
            _put(dims, types, t.name, [int(d) for d in t.dims], t.data_type)
        for v in list(g.input) + list(g.output) + list(g.value_info):
            tt = v.type.tensor_type if v.type.HasField("tensor_type") else None
            if tt is None:
                continue
            if not tt.HasField("shape"):
                _put(dims, types, v.name, None, tt.elem_type)
                continue
            shape = []
            for d in tt.shape.dim:
                if d.HasField("dim_value"):
                    shape.append(int(d.dim_value))
                elif d.HasField("dim_param"):
                    shape.append(d.dim_param)
                else:
                    shape.append(None)
            _put(dims, types, v.name, shape, tt.elem_type)
        for n in g.node:
            graphs.extend(sub for _, sub in subgraphs(n))
    return dims, types


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
