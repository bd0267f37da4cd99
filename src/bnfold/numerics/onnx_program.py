"""An ONNX model as a ``torch.export`` program, so the ONNX audit is the ``.pt2`` audit.

:func:`onnx_program` builds a module whose forward runs the ONNX graph with the
reference interpreter's ops (:mod:`bnfold.numerics.onnx_ops`) and exports it:
float initializers become the module's constants (lifted, as in any exported
model), so a ``Conv`` is an ``aten.conv2d`` reading its weight, and a
``BatchNormalization`` an ``aten.batch_norm`` reading its running statistics.
The emulator, the fold, the risk model, the table and the plot then run
unchanged.  Values known ahead of time (integer initializers, ``Constant``,
``Shape`` and what is computed from them alone) are evaluated here, once.

Each ONNX node runs inside a submodule named after it, so the audit's layer
and norm names are the ONNX node names (``/`` and ``.`` read as ``_``).
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ..onnx.semantics import OPS, STATIC_ARGS, attrs, bind, constant, opset_of

_FLOAT = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16)


def _safe(name: str, taken: set) -> str:
    base = re.sub(r"\W", "_", name).strip("_") or "node"
    if base[0].isdigit():
        base = "n_" + base
    out, i = base, 1
    while out in taken:
        i += 1
        out = f"{base}_{i}"
    taken.add(out)
    return out


class _Step(torch.nn.Module):
    """One ONNX node: ``forward(*inputs)`` runs its op."""

    def __init__(self, node: onnx.NodeProto, opset: int | None):
        super().__init__()
        self.op_type, self.attrs = node.op_type, attrs(node)
        if node.op_type not in OPS:
            raise NotImplementedError(f"ONNX op {node.op_type} (node {node.name!r}) is not supported by the audit")
        self.fn = bind(node, opset)

    def forward(self, *ins):
        if self.op_type not in STATIC_ARGS:
            ins = [torch.as_tensor(v, dtype=_torch_dtype(v)) if isinstance(v, np.ndarray) else v for v in ins]
        out = self.fn(ins, self.attrs, torch.float32)
        return out[0] if len(out) == 1 else out


def _torch_dtype(a: np.ndarray) -> torch.dtype:
    return torch.float32 if a.dtype.kind == "f" else torch.bool if a.dtype == np.bool_ else torch.int64


def _static(node: onnx.NodeProto, ins: list, a: dict, opset: int | None):
    """The node's output when every input is known ahead of time, else None."""
    if node.op_type == "Constant":
        return constant(a)
    if node.op_type == "Shape":
        x = ins[0]
        return np.array(list(x.shape)[a.get("start", 0) : a.get("end", None)], dtype=np.int64)
    if node.op_type == "Cast" and isinstance(ins[0], np.ndarray):
        to = onnx.helper.tensor_dtype_to_np_dtype(a["to"])
        return ins[0].astype(to)
    if ins and all(v is None or isinstance(v, np.ndarray) for v in ins) and node.op_type in OPS:
        with unset_fake_temporarily():  # known values are real tensors, also while export traces the module
            t = [None if v is None else torch.as_tensor(v.copy()) for v in ins]
            out = bind(node, opset)(t, a, torch.float32)
            return out[0].numpy() if len(out) == 1 else [o.numpy() for o in out]
    return None


class OnnxModule(torch.nn.Module):
    """The ONNX graph ``model`` as a module (static shapes, one output list)."""

    def __init__(self, model: onnx.ModelProto):
        super().__init__()
        g = model.graph
        taken: set = set()
        self._consts: dict[str, str] = {}  # ONNX name -> buffer name
        self._static: dict[str, np.ndarray] = {}
        for t in g.initializer:
            arr = numpy_helper.to_array(t)
            if arr.dtype.kind == "f":
                buf = _safe("c_" + t.name, taken)
                self.register_buffer(buf, torch.from_numpy(arr.astype(np.float32)))
                self._consts[t.name] = buf
            else:
                self._static[t.name] = arr
        init = {t.name for t in g.initializer}
        self.inputs = [i.name for i in g.input if i.name not in init]
        self.outputs = [o.name for o in g.output]
        self.plan: list[tuple[onnx.NodeProto, str | None]] = []
        self.opset = opset_of(model)
        for node in g.node:
            if node.op_type in ("If", "Loop", "Scan"):
                raise NotImplementedError(f"ONNX op {node.op_type} (subgraphs) is not supported by the audit")
            step = None
            if node.op_type not in ("Constant", "Shape", "Cast"):
                step = _safe(node.name or f"{node.op_type}_{len(self.plan)}", taken)
                self.add_module(step, _Step(node, self.opset))
            self.plan.append((node, step))

    def forward(self, *xs):
        env: dict = dict(self._static)
        env.update({k: getattr(self, v) for k, v in self._consts.items()})
        env.update(zip(self.inputs, xs))
        for node, step in self.plan:
            ins = [env[n] if n else None for n in node.input]
            a = attrs(node) if step is None else getattr(self, step).attrs
            out = _static(node, ins, a, self.opset)
            if out is None and node.op_type == "Cast":
                out = ins[0].to(torch.float32 if _is_float_type(a["to"]) else torch.int64)
            elif out is None:
                out = getattr(self, step)(*ins)
            outs = out if isinstance(out, (list, tuple)) else [out]
            for name, v in zip(node.output, outs):
                if name:
                    env[name] = v
        return tuple(env[o] for o in self.outputs)


def _is_float_type(t: int) -> bool:
    return t in _FLOAT


def example_inputs(model: onnx.ModelProto, batch: int = 1) -> tuple[torch.Tensor, ...]:
    """Zeros shaped like the graph's inputs (a symbolic dimension becomes ``batch`` in front, else 1)."""
    init = {t.name for t in model.graph.initializer}
    out = []
    for i in model.graph.input:
        if i.name in init:
            continue
        tt = i.type.tensor_type
        if tt.elem_type not in _FLOAT:
            raise NotImplementedError(f"input {i.name!r} is not floating point; the ONNX audit takes float inputs")
        dims = [
            d.dim_value if d.HasField("dim_value") else (batch if k == 0 else 1) for k, d in enumerate(tt.shape.dim)
        ]
        out.append(torch.zeros(dims))
    return tuple(out)


def onnx_program(model: onnx.ModelProto, inputs: tuple | None = None) -> torch.export.ExportedProgram:
    """``model`` as an exported program (traced with ``inputs``, or zeros shaped like its inputs)."""
    module = OnnxModule(model).eval()
    args = inputs if inputs is not None else example_inputs(model)
    return torch.export.export(module, tuple(args))
