"""An ONNX op with no implementation here runs through ``onnx.reference.ReferenceEvaluator`` on its
one node, in float32 (integers int64, booleans bool, as the other ops get them).

Only the op types of :data:`REFERENCE_OPS` may: deterministic numeric ops whose outputs are no larger
than a product of their inputs' sizes, so the cost plan and the watchdog bound them.  Any other op
type without an implementation (random ops, image and string decoding, sizes read from the data such
as ``OneHot`` or the window ops, attributes that set an output size) refuses the model: a model file
must not choose which code of the reference evaluator runs."""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import helper

from .values import Ctx

#: op types without an implementation here that may run through the reference evaluator (an allowlist)
REFERENCE_OPS = frozenset(
    "Acosh Asinh Atanh BitShift BitwiseAnd BitwiseNot BitwiseOr BitwiseXor CumProd Compress DequantizeLinear "
    "QuantizeLinear DynamicQuantizeLinear Det EyeLike LpNormalization MatMulInteger MeanVarianceNormalization "
    "NonZero QLinearMatMul ReverseSequence Shrink Swish Unique".split()
)


class ReferenceNode:
    """Runs ``node`` (a default-domain op) with ``onnx.reference``; one evaluator per input signature."""

    def __init__(self, node: onnx.NodeProto, opset: int | None):
        self.node, self.opset = node, opset or onnx.defs.onnx_opset_version()
        self._evaluators: dict[tuple, object] = {}

    def _evaluator(self, ins: list[np.ndarray | None]):
        key = tuple(None if v is None else (v.dtype.str, v.ndim) for v in ins)
        ev = self._evaluators.get(key)
        if ev is None:
            from onnx.reference import ReferenceEvaluator

            names = [f"in{i}" if v is not None else "" for i, v in enumerate(ins)]
            outs = [f"out{i}" if o else "" for i, o in enumerate(self.node.output)]
            node = helper.make_node(self.node.op_type, names, outs, domain=self.node.domain)
            node.attribute.extend(self.node.attribute)
            inputs = [
                helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
                for n, v in zip(names, ins)
                if v is not None
            ]
            outputs = [helper.make_value_info(n, onnx.TypeProto()) for n in outs if n]
            graph = helper.make_graph([node], "node", inputs, outputs)
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
            ev = self._evaluators[key] = ReferenceEvaluator(model)
        return ev

    def __call__(self, ins: list, a: dict, c: Ctx) -> list:
        arrays = [None if v is None else _numpy(v) for v in ins]
        ev = self._evaluator(arrays)
        feeds = {f"in{i}": v for i, v in enumerate(arrays) if v is not None}
        outs = ev.run(None, feeds)
        return [_torch(np.asarray(o), c) for o in outs]


def _numpy(v) -> np.ndarray:
    if isinstance(v, torch.Tensor):
        t = v.detach()
        return (t.to(torch.float32) if t.is_floating_point() else t).numpy()
    a = np.asarray(v)
    return a.astype(np.float32) if a.dtype.kind == "f" else a


def _torch(a: np.ndarray, c: Ctx) -> torch.Tensor:
    if a.dtype.kind == "f":
        return torch.from_numpy(a.astype(np.float32)).to(c.float_dtype)
    if a.dtype == np.bool_:
        return torch.from_numpy(a.copy())
    return torch.from_numpy(a.astype(np.int64))
