"""The ONNX adapter's part of the fp16 range rewrite (``bnfold.engine.range``): nodes of the main graph as
``RangeOp`` s read from the op table's ``range`` facts, and the primitive edits (scale one node's constant input,
set a norm's epsilon, insert a ``Mul``).  Mixed into ``OnnxGraph``; it decides nothing."""

from __future__ import annotations

from typing import Any

import onnx
import torch

from .. import fold_math
from ..engine.graph import RangeOp
from .handles import Node, Value
from .nodes import attr
from .nodes import label as node_label
from .ops import op_of
from .params import add_initializer, new_node, safe
from .tensors import to_torch, torch_dtype

#: an ``invariant`` norm's epsilon attribute default
_EPS_DEFAULT = 1e-5


class OnnxRange:
    """``OnnxGraph``'s range methods (it provides ``index``, ``value``, ``users``, ``producer``, ``const``)."""

    def _main(self):
        return self.index.graphs[0]

    def ordered_nodes(self) -> list:
        gi = self._main()
        return [Node(p, gi) for p in gi.nodes if not self.index.is_dead(p)]

    def values(self) -> list:
        gi = self._main()
        names = [n for n in gi.inputs if n not in gi.inits]
        names += [o for p in gi.nodes if not self.index.is_dead(p) for o in p.output if o]
        return [Value(gi, n) for n in names]

    def value_name(self, value: Any) -> str:
        return value.name

    def range_op(self, node: Any) -> RangeOp | None:
        if not isinstance(node, Node) or node.gi is not self._main() or self.index.is_dead(node.proto):
            return None
        p = node.proto
        row = op_of(p)
        fact = row.range if row is not None else ""
        out = self.value(node.gi, p.output[0])
        if any(o and self.users(self.value(node.gi, o)) for o in p.output[1:]):
            fact = ""  # a second output read (a MaxPool's indices, a norm's statistics)
        operands = [(i, self.value(node.gi, name)) for i, name in enumerate(p.input) if name]
        if fact == "homogeneous" and p.op_type == "Pad" and len(p.input) > 2 and p.input[2]:
            fill = self.constant(operands[2][1]) if len(operands) > 2 else None
            if fill is None or bool((fill != 0).any()):
                fact = ""
        if fact == "power":
            degree = row.degree
            if degree is None:
                exponent = self.constant(operands[1][1]) if len(operands) > 1 else None
                if exponent is None or exponent.numel() != 1:
                    return RangeOp(node, "", out, operands)
                degree = float(exponent.reshape(()))
            return RangeOp(node, fact, out, operands[:1], degree=degree)
        if fact == "invariant":
            return RangeOp(node, fact, out, operands, eps=float(attr(p, "epsilon", _EPS_DEFAULT)))
        return RangeOp(node, fact, out, operands)

    def set_eps(self, node: Any, eps: float) -> None:
        p = node.proto
        for a in p.attribute:
            if a.name == "epsilon":
                a.f = eps
                break
        else:
            p.attribute.append(onnx.helper.make_attribute("epsilon", eps))
        self._edited()

    def scaled_operand(self, node: Any, slot: Any, exponent: int) -> torch.Tensor:
        c = self.const(self.value(node.gi, node.proto.input[slot]))
        dtype = torch_dtype(c.elem_type, "the constant")
        return fold_math.scale_pow2(to_torch(c.value), exponent, dtype, "constant")

    def scale_operand(self, node: Any, slot: Any, new: torch.Tensor) -> None:
        value = self.value(node.gi, node.proto.input[slot])
        name = add_initializer(self.index, node.gi, f"{safe(value.name)}_range", new)
        self.index.set_input(node.gi, node.proto, slot, name)
        self._edited()

    def insert_mul(self, value: Any, factor: float, readers: list | None = None) -> Any:
        index, gi = self.index, value.gi
        info = self.shape_info(value)
        dtype = info.dtype if isinstance(info.dtype, torch.dtype) else torch.float32
        const = add_initializer(index, gi, f"{safe(value.name)}_range_scale", torch.tensor(factor, dtype=dtype))
        found = gi.producer.get(value.name)
        anchor = found[0] if found is not None else None
        uses = list(index.visible_uses(gi, value.name))
        if readers is not None:
            wanted = {id(r.proto) if r is not None else None for r in readers}
            uses = [u for u in uses if (id(u.node) if u.node is not None else None) in wanted]
        base = f"{safe(value.name)}_range"
        if any(u.node is None for u in uses) and found is not None:  # a graph output keeps its name
            before = index.unique(f"{safe(value.name)}_unscaled")
            index.rename_output(gi, found[0], found[1], before)
            index.tracker.gone.discard(value.name)
            index.insert_after(gi, anchor, new_node(index, "Mul", [before, const], [value.name], base))
            for use in index.visible_uses(gi, value.name):
                if use.node is not None and all(use.node is not u.node for u in uses):
                    index.set_input(use.gi, use.node, use.idx, before)
            self._edited()
            return value
        out = index.unique(base)
        index.insert_after(gi, anchor, new_node(index, "Mul", [value.name, const], [out], base))
        for use in uses:
            if use.node is not None:
                index.set_input(use.gi, use.node, use.idx, out)
        self._edited()
        return self.value(gi, out)

    def mul_placed(self, node: Any) -> tuple[bool, Any]:
        return (False, None)  # an inserted node joins ``gi.nodes`` (``ordered_nodes``) when the model is read again

    def range_label(self, node: Any) -> str:
        return node_label(node.proto)
