"""ONNX op semantics, written once: the table :data:`IMPLS` (one row per op type: its implementation
and the facts about it that do not depend on a precision), read by the fp16 emulator
(:mod:`bnfold.numerics.onnx_program`), the constant evaluator (:mod:`bnfold.onnx.consts`) and the
tests' float64 interpreter.

An implementation is ``fn(inputs, attributes, ctx)``: torch tensors in (floats in the run's dtype,
integers int64, booleans bool; ``None`` for an omitted optional input; a sequence: a list of them), a
tensor or a list of outputs out.  Values known ahead of time (shapes, axes, pads) may also arrive as
numpy arrays; the ops read them as Python numbers (:func:`~.values.ints`).  :func:`bind` gives a
node's callable: its row's function, or, for an op type with no row (or a form a row refuses), the node
run by ``onnx.reference`` in float32 (:class:`~.reference.ReferenceNode`), marked not emulated.

``python -m bnfold.onnx.semantics`` prints the op types of the table (README's list).
"""

from __future__ import annotations

import onnx

from .elementwise import ELEMENTWISE
from .layers import LAYERS
from .norms import NORMS
from .pools import POOLS
from .reduce import REDUCTIONS
from .reference import ReferenceNode
from .resize import RESIZE
from .sequences import SEQUENCES
from .shapes import SHAPES
from .values import Ctx, OpImpl, attrs, constant, opset_of

__all__ = ["IMPLS", "OpImpl", "Bound", "Ctx", "bind", "attrs", "constant", "opset_of", "supported", "STATIC_ARGS"]


#: Every op type implemented here -> its row.  Supporting another is one row (and its generated case).
IMPLS: dict[str, OpImpl] = {**ELEMENTWISE, **SHAPES, **LAYERS, **POOLS, **NORMS, **REDUCTIONS, **RESIZE, **SEQUENCES}

#: ops whose inputs after the first are shapes, axes or bounds (read as Python numbers)
STATIC_ARGS = frozenset(name for name, op in IMPLS.items() if op.static and 0 not in op.static)


class Bound:
    """A node's op ready to run: ``bound(inputs, attributes, float_dtype)`` -> list of outputs.
    ``emulated``: False when the node runs through the reference evaluator (``why`` says why)."""

    def __init__(self, node: onnx.NodeProto, opset: int | None):
        self.op_type, self.opset, self.n_out = node.op_type, opset, len(node.output)
        row = IMPLS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        why = None if row is not None else "no implementation"
        if row is not None and row.refuses is not None:
            why = row.refuses(attrs(node), node)
        self.emulated, self.why = why is None, why
        self.fn = row.fn if why is None else ReferenceNode(node, opset)

    def __call__(self, ins: list, a: dict, float_dtype) -> list:
        out = self.fn(ins, a, Ctx(self.opset, self.n_out, float_dtype))
        return list(out) if isinstance(out, (list, tuple)) else [out]


def bind(node: onnx.NodeProto, opset: int | None) -> Bound:
    """``node``'s op for a model of default-domain ``opset``."""
    return Bound(node, opset)


def supported() -> list[str]:
    """The op types computed by an implementation of their own (sorted)."""
    return sorted(IMPLS)
