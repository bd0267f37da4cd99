"""The fx adapter's part of the fp16 range rewrite (``bnfold.engine.range``): nodes as ``RangeOp`` s read from
the op table's ``range`` facts, and the primitive edits (scale one node's constant operand, set a norm's eps,
insert a multiply).  Mixed into ``FxGraph``; it decides nothing."""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from .. import fold_math
from ..engine.graph import RangeOp
from .ops import NORM_EPS, OPS, in_dialect_of, node_arg, node_key, op_name, reads_only_metadata, values_of


def _is_float(value: Any) -> bool:
    if isinstance(value, Node):
        val = value.meta.get("val")
        return isinstance(val, torch.Tensor) and val.is_floating_point()
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _slots(node: Node) -> list[tuple[tuple, Any]]:
    """Every argument of ``node`` with its slot: ``(i,)`` positional, ``(i, j)`` inside a list, ``(name,)`` keyword."""
    out = []
    for i, arg in enumerate(node.args):
        if isinstance(arg, (list, tuple)):
            out += [((i, j), a) for j, a in enumerate(arg) if isinstance(a, Node)]
        else:
            out.append(((i,), arg))
    out += [((name,), arg) for name, arg in node.kwargs.items() if isinstance(arg, Node)]
    return out


def _get(node: Node, slot: tuple) -> Any:
    if isinstance(slot[0], str):
        return node.kwargs[slot[0]]
    arg = node.args[slot[0]]
    return arg[slot[1]] if len(slot) == 2 else arg


def _set(node: Node, slot: tuple, value: Any) -> None:
    if isinstance(slot[0], str):
        node.kwargs = {**node.kwargs, slot[0]: value}
        return
    args = list(node.args)
    if len(slot) == 2:
        inner = list(args[slot[0]])
        inner[slot[1]] = value
        args[slot[0]] = type(node.args[slot[0]])(inner)
    else:
        args[slot[0]] = value
    node.args = tuple(args)


class FxRange:
    """``FxGraph``'s range methods (it provides ``editor``, ``graph``, ``users``, ``constant``)."""

    def ordered_nodes(self) -> list:
        return [n for n in self.graph.nodes if n.op == "call_function"]

    def values(self) -> list:
        return [
            n
            for n in self.graph.nodes
            if (n.op == "call_function" or (n.op == "placeholder" and self.editor.is_user_input(n))) and _is_float(n)
        ]

    def value_name(self, value: Any) -> str:
        return value.name

    def range_op(self, node: Any) -> RangeOp | None:
        if not isinstance(node, Node) or node.op != "call_function":
            return None
        key = node_key(node)
        row = OPS.get(key)
        fact = row.range if row is not None else ""
        if fact and getattr(getattr(node.target, "_schema", None), "is_mutable", False) and not self._private(node):
            fact = ""  # an in-place op whose mutation another reader (or the graph's output) sees
        output = node
        if isinstance(node.meta.get("val"), (tuple, list)):
            output = values_of(node)
            if output is None:
                return None
        elif not _is_float(node):
            return None
        if key == "getitem":
            source = node.args[0]  # only a source holding several values can have this getitem as its output
            several = isinstance(source, Node) and isinstance(source.meta.get("val"), (tuple, list))
            src = self.range_op(source) if several else None  # (a getitem of a tensor: no walk down a chain)
            if src is not None and src.output is node:
                return None  # a multi-output op's value: part of that op
        slots = [(s, a) for s, a in _slots(node) if _is_float(a)]
        tensors = [(s, a) for s, a in slots if isinstance(a, Node)]
        if fact == "homogeneous":
            if op_name(node.target).startswith("constant_pad") and float(node_arg(node, 2, "value", 0.0)) != 0.0:
                return RangeOp(node, "", output, tensors)
            return RangeOp(node, fact, output, tensors) if tensors else None
        if fact in ("sum", "product", "quotient"):
            return RangeOp(node, fact, output, [(s, a) for s, a in slots if s[0] != "alpha"])
        if fact == "power":
            degree = row.degree
            if degree is None:
                exponent = node.args[1] if len(node.args) > 1 else None
                if not isinstance(exponent, (int, float)) or isinstance(exponent, bool) or not tensors:
                    return RangeOp(node, "", output, tensors)
                degree = float(exponent)
            return RangeOp(node, fact, output, tensors[:1], degree=degree)
        if fact == "invariant":
            return RangeOp(node, fact, output, tensors, eps=self._eps(node))
        return RangeOp(node, "", output, tensors)

    def _eps(self, node: Node) -> float | None:
        name = op_name(node.target).removesuffix("_copy")
        index, default = NORM_EPS.get(name, (None, None))
        if index is None:
            return None
        eps = node_arg(node, index, "eps", default)
        if eps is None:
            dtype = node.args[0].meta.get("val").dtype
            eps = torch.finfo(dtype).eps
        return float(eps)

    def set_eps(self, node: Any, eps: float) -> None:
        index, _ = NORM_EPS[op_name(node.target).removesuffix("_copy")]
        if len(node.args) > index:
            args = list(node.args)
            args[index] = eps
            node.args = tuple(args)
        else:
            node.kwargs = {**node.kwargs, "eps": eps}

    def scaled_operand(self, node: Any, slot: Any, exponent: int) -> Any:
        old = _get(node, slot)
        if not isinstance(old, Node):  # a Python number: a float64
            number = torch.tensor(float(old), dtype=torch.float64)
            return float(fold_math.scale_pow2(number, exponent, torch.float64, "constant"))
        value = self.constant(old)
        return fold_math.scale_pow2(value.reshape(old.meta["val"].shape), exponent, old.meta["val"].dtype, "constant")

    def scale_operand(self, node: Any, slot: Any, new: Any) -> None:
        old = _get(node, slot)
        if not isinstance(old, Node):
            _set(node, slot, new)
            return
        like = self._like(old)
        target = f"{self.editor.target(like)}_range"
        _set(node, slot, self.editor.add_tensor(like, target, new))
        self.editor.erase_dead(old)

    def _like(self, node: Node) -> Node:
        """A tensor node (placeholder or get_attr) whose kind a new tensor takes: ``node``'s own, else the
        program's first."""
        while node.op == "call_function" and node.all_input_nodes:
            node = node.all_input_nodes[0]
        if node.op in ("placeholder", "get_attr") and self.editor.tensor(node) is not None:
            return node
        return next(
            n for n in self.graph.nodes if n.op in ("placeholder", "get_attr") and self.editor.tensor(n) is not None
        )

    def insert_mul(self, value: Any, factor: float, readers: list | None = None) -> Any:
        users = [u for u in value.users if not reads_only_metadata(u, value)]
        if readers is not None:
            wanted = {id(r) for r in readers}
            users = [u for u in users if id(None if u.op == "output" else u) in wanted]
        val = value.meta["val"]
        like = self._like(value)
        const = self.editor.add_tensor(
            like, f"{self.editor.target(like)}_range_scale", torch.tensor(factor, dtype=val.dtype)
        )
        first = _first_of(value, users)
        target = in_dialect_of(_call_target(value, users), torch.ops.aten.mul.Tensor)
        with self.graph.inserting_before(first):
            mul = self.graph.call_function(target, (value, const))
        mul.meta = {k: v for k, v in value.meta.items() if k in ("val", "stack_trace", "nn_module_stack")}
        for user in users:
            user.replace_input_with(value, mul)
        return mul

    def mul_placed(self, node: Any) -> tuple[bool, Any]:
        return _placed(node)


def _placed(node: Node) -> tuple[bool, Node | None]:
    """``node``'s place among the call_function nodes (``ordered_nodes``): the one right before it (None: first),
    walked back over the placeholders and constants between them."""
    prev = node.prev
    while prev.op not in ("call_function", "root"):
        prev = prev.prev
    return (True, prev if prev.op == "call_function" else None)


def _first_of(value: Node, users: list) -> Node:
    """The first of ``users`` in graph order: walked forward from ``value`` (every reader is after it)."""
    pending, node = set(users), value.next
    while node not in pending:
        if node.op == "root":
            raise ValueError(f"no reader of {value.name} to scale")
        node = node.next
    return node


def _call_target(value: Node, users: list) -> Any:
    """An op target of the program's dialect (an edge op in an edge program)."""
    for node in [value, *users]:
        if node.op == "call_function" and not isinstance(node.target, type(len)):
            return node.target
    return torch.ops.aten.mul.Tensor
