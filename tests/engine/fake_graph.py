"""A fake graph and its engine adapter: plain Python objects, no torch.export, no onnx.

A ``FakeGraph`` holds nodes (``FNode``: an op, input value names, one output value name, attributes),
named constants (torch tensors) and the names of its inputs and outputs.  ``run`` evaluates it in
float64 with torch's functional ops, so a test can compare a graph before and after a fold.
``FakeAdapter`` implements ``bnfold.engine.GraphAdapter`` over it: nodes are ``FNode`` objects and
values are names.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from bnfold.engine.graph import Binary, ChainStep, ConvGeometry, Hop, Layer, LayerWeights, Norm, RangeOp, ShapeInfo
from bnfold.report import Code

LAYERS = {"conv": "conv", "conv_transpose": "conv_transpose", "linear": "linear", "bmm": "linear"}
BINARIES = ("mul", "add", "sub", "div")
HOPS = ("identity", "flatten", "maxpool")  # maxpool: 2x2, stride 2, a maximum (``Hop.monotone``)
#: the fp16 range rewrite's facts of the fake ops (``Op.range``); ``softmax`` has none
RANGE = {
    **dict.fromkeys(("relu", "identity", "flatten", "maxpool"), "homogeneous"),
    **dict.fromkeys(("add", "sub", "concat"), "sum"),
    "mul": "product",
    "div": "quotient",
    "group_norm": "invariant",
}


@dataclass(eq=False)
class FNode:
    name: str
    op: str
    inputs: list
    output: str
    attrs: dict = field(default_factory=dict)
    dead: bool = False

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return f"FNode({self.name}: {self.op})"


class FakeGraph:
    def __init__(self):
        self.nodes: list[FNode] = []
        self.consts: dict[str, torch.Tensor] = {}
        self.inputs: dict[str, tuple] = {}
        self.outputs: list[str] = []
        self.shapes: dict[str, tuple] = {}
        self._ids = itertools.count()

    # -- building
    def input(self, name: str, *shape: int) -> str:
        self.inputs[name] = shape
        self.shapes[name] = shape
        return name

    def const(self, name: str, t: torch.Tensor) -> str:
        self.consts[name] = t
        return name

    def node(self, op: str, inputs: list, name: str | None = None, **attrs) -> str:
        name = name or f"{op}_{next(self._ids)}"
        n = FNode(name, op, list(inputs), f"{name}_out", attrs)
        self.nodes.append(n)
        self.shapes[n.output] = tuple(self._eval(n, {v: self._example(v) for v in n.inputs}).shape)
        return n.output

    def _example(self, v):
        if v in self.consts:
            return self.consts[v].to(torch.float64)
        if v is None:
            return None
        return torch.zeros(self.shapes[v], dtype=torch.float64)

    def live(self) -> list[FNode]:
        return [n for n in self.nodes if not n.dead]

    def by_name(self, name: str) -> FNode:
        return next(n for n in self.nodes if n.name == name)

    def ops(self) -> list[str]:
        return [n.op for n in self.live()]

    # -- evaluation (float64)
    def run(self, feeds: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        env = {k: v.to(torch.float64) for k, v in feeds.items()}
        env.update({k: v.to(torch.float64) for k, v in self.consts.items()})
        for n in self.live():
            env[n.output] = self._eval(n, {v: env.get(v) for v in n.inputs})
        return [env[o] for o in self.outputs]

    def _eval(self, n: FNode, env: dict) -> torch.Tensor:
        a = [env[v] if v is not None else None for v in n.inputs]
        if n.op == "conv":
            return F.conv2d(
                a[0], a[1], a[2] if len(a) > 2 else None, padding=n.attrs.get("pad", 0), groups=n.attrs.get("groups", 1)
            )
        if n.op == "conv_transpose":
            return F.conv_transpose2d(a[0], a[1], a[2] if len(a) > 2 else None, groups=n.attrs.get("groups", 1))
        if n.op == "linear":
            return F.linear(a[0], a[1], a[2] if len(a) > 2 else None)
        if n.op == "bmm":  # a linear layer that cannot hold a bias
            return a[0] @ a[1].T
        if n.op == "bn":
            x, w, b, mean, var = a
            shape = [1, -1] + [1] * (x.dim() - 2)
            y = (x - mean.reshape(shape)) / torch.sqrt(var.reshape(shape) + n.attrs.get("eps", 1e-5))
            return y * w.reshape(shape) + b.reshape(shape)
        if n.op in BINARIES:
            return {"mul": torch.mul, "add": torch.add, "sub": torch.sub, "div": torch.div}[n.op](a[0], a[1])
        if n.op == "group_norm":  # statistics only: no affine of its own (``GraphAdapter.plain_norm``)
            return F.group_norm(a[0], n.attrs.get("groups", 1), eps=n.attrs.get("eps", 1e-5))
        if n.op == "softmax":
            return torch.softmax(a[0], 1)
        if n.op == "relu":
            return torch.relu(a[0])
        if n.op == "identity":
            return a[0]
        if n.op == "flatten":
            return a[0].reshape(a[0].shape[0], -1)
        if n.op == "maxpool":
            return F.max_pool2d(a[0], 2)
        if n.op == "concat":
            return torch.cat(a, 1)
        raise AssertionError(n.op)


class FakeAdapter:
    """The engine adapter over a ``FakeGraph``.  ``groups`` overrides what a layer reports
    (to drive the fold-math error path); ``removed`` and ``writes`` record the primitive edits."""

    full_rank_constants = True

    def __init__(self, g: FakeGraph, groups: dict[str, int] | None = None):
        self.g = g
        self.groups = groups or {}
        self.removed: list[str] = []  # node names, in the order remove_node saw them
        self.writes: list[str] = []  # layer names written

    # -- classify
    def layers(self):
        return [lay for n in self.g.live() if (lay := self.layer(n)) is not None]

    def norms(self):
        return [nm for n in self.g.live() if (nm := self.norm(n)) is not None]

    def layer(self, node) -> Layer | None:
        if not isinstance(node, FNode) or node.dead or node.op not in LAYERS:
            return None
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        groups = self.groups.get(node.name, node.attrs.get("groups", 1))
        return Layer(
            node,
            LAYERS[node.op],
            node.op,
            node.inputs[0],
            node.output,
            node.inputs[1],
            bias,
            groups=groups,
            zero_padding=node.attrs.get("pad", 0) == 0,
            in_axis=1 if node.op != "bmm" else -1,
            out_axis=1 if node.op != "bmm" else -1,
            takes_bias=node.op != "bmm",
        )

    def norm(self, node) -> Norm | None:
        if not isinstance(node, FNode) or node.dead or node.op != "bn":
            return None
        x, w, b, mean, var = node.inputs
        norm = Norm(node, x, node.output, w, b, mean, var, node.attrs.get("eps", 1e-5))
        if node.attrs.get("training"):
            norm.problem, norm.problem_code = "it runs in training mode", Code.TRAINING_MODE
        return norm

    def plain_norm(self, node) -> Norm | None:
        if not isinstance(node, FNode) or node.dead or node.op != "group_norm":
            return None
        x = node.inputs[0]
        return Norm(node, x, node.output, None, None, None, None, 1e-5, affine_only=True, kind="group_norm")

    def plain_norms(self):
        return [nm for n in self.g.live() if (nm := self.plain_norm(n)) is not None]

    def binary(self, node) -> Binary | None:
        if not isinstance(node, FNode) or node.dead or node.op not in BINARIES:
            return None
        return Binary(node, node.op, node.inputs[0], node.inputs[1], node.output)

    def hop(self, node) -> Hop | None:
        if not isinstance(node, FNode) or node.dead or node.op not in HOPS:
            return None
        return Hop(node, node.inputs[0], node.output, node.op, monotone=node.op == "maxpool")

    # -- navigate
    def users(self, value) -> list:
        out: list[Any] = [n for n in self.g.live() if value in n.inputs]
        out += [None] * self.g.outputs.count(value)
        return out

    def producer(self, value):
        return next((n for n in self.g.live() if n.output == value), None)

    # -- read
    def constant(self, value, values: bool = True):
        t = self.g.consts.get(value) if isinstance(value, str) else None
        return None if t is None else t.to(torch.float64)

    def is_constant(self, value) -> bool:
        return isinstance(value, str) and value in self.g.consts and self.g.consts[value] is not None

    def stored_key(self, value) -> None:
        return None  # every constant is in memory

    def weights(self, layer: Layer, values: bool = True):
        w = self.g.consts.get(layer.weight)
        if w is None:
            return f"its weight comes from {self.describe(layer.weight)}"
        b = self.g.consts.get(layer.bias) if layer.bias is not None else None
        return LayerWeights(w, b, w.dtype, (b if b is not None else w).dtype)

    def shape_info(self, value) -> ShapeInfo:
        shape = self.g.shapes.get(value)
        if shape is None:
            return ShapeInfo(None)
        return ShapeInfo(len(shape), torch.float64, shape)

    def follow_axis(self, hop: Hop, axis: int, forward: bool):
        return axis if hop.op != "flatten" else f"'{hop.node.name}' (flatten) merges the channel axis"

    def describe(self, value) -> str:
        node = self.producer(value)
        return f"'{value}' ({node.op})" if node is not None else f"input '{value}'"

    def node_name(self, node) -> str:
        return node.name

    def norm_label(self, norm) -> str:
        return norm.node.name

    def op_label(self, node) -> str:
        return node.name

    def describe_node(self, node) -> str:
        return f"'{node.name}' ({node.op})"

    def is_live(self, node) -> bool:
        return isinstance(node, FNode) and not node.dead

    # -- primitive edits
    def write_layer(self, layer: Layer, weight, bias, label: str):
        self.writes.append(layer.node.name)
        self.g.consts[layer.weight] = weight
        if bias is None:
            return 0, None
        if not layer.takes_bias:
            return 0, bias
        if layer.bias is None:
            name = f"{layer.node.name}_bias"
            layer.node.inputs = [*layer.node.inputs[:2], name]
            layer.bias = name
        self.g.consts[layer.bias] = bias
        return 0, None

    def _replace_uses(self, old: str, new: str, skip: FNode | None = None) -> None:
        for n in self.g.live():
            if n is not skip:
                n.inputs = [new if v == old else v for v in n.inputs]
        self.g.outputs = [new if v == old else v for v in self.g.outputs]

    def remove_node(self, step: ChainStep, source) -> bool:
        self.removed.append(step.node.name)
        step.node.dead = True
        self._replace_uses(step.output, source)
        return False

    def strip_affine(self, norm) -> None:
        raise AssertionError("the fake graph has no LayerNorm")

    def drop_unused(self, values) -> None:
        for v in values:
            if isinstance(v, str) and v in self.g.consts and not self.users(v):
                del self.g.consts[v]

    def add_bias(self, layer: Layer, value, bias) -> None:
        name = self.g.const(f"{layer.node.name}_added_bias", bias)
        node = FNode(f"{layer.node.name}_bias_add", "add", [value, name], f"{layer.node.name}_biased")
        self._replace_uses(value, node.output)
        self.g.nodes.insert(self.g.nodes.index(self.producer(value)) + 1, node)
        self.g.shapes[node.output] = self.g.shapes[value]

    def lower_norm(self, norm, scale, shift) -> None:
        node = norm.node
        s = self.g.const(f"{node.name}_scale", scale)
        t = self.g.const(f"{node.name}_shift", shift)
        mul = FNode(f"{node.name}_mul", "mul", [norm.input, s], f"{node.name}_scaled")
        add = FNode(f"{node.name}_add", "add", [mul.output, t], node.output)
        i = self.g.nodes.index(node)
        node.dead = True
        self.g.nodes[i + 1 : i + 1] = [mul, add]
        self.g.shapes[mul.output] = self.g.shapes[node.output]

    # -- re-parameterization (a 2-D conv: stride and dilation 1, ``pad`` on every side)
    def conv_geometry(self, layer: Layer):
        if layer.node.op != "conv":
            return f"{layer.node.op} is not a conv"
        kernel = tuple(self.g.consts[layer.weight].shape[2:])
        pad = layer.node.attrs.get("pad", 0)
        return ConvGeometry(kernel, (1, 1), (1, 1), ((pad, pad), (pad, pad)), layer.groups)

    def pool(self, node):
        return None  # the fake graph has no pooling op

    def inplace_sum(self, node):
        return None  # nor in-place ops

    def inputs(self, node) -> list:
        return [v for v in node.inputs if v is not None]

    def bypass(self, old, new, nodes) -> None:
        for node in nodes:
            self.removed.append(node.name)
            node.dead = True
        self._replace_uses(old, new)

    # -- the fp16 range rewrite
    def ordered_nodes(self) -> list:
        return self.g.live()

    def values(self) -> list:
        return list(self.g.inputs) + [n.output for n in self.g.live()]

    def value_name(self, value) -> str:
        return value

    def range_op(self, node):
        if node is None or node.op not in RANGE:
            return None if node is None else RangeOp(node, "", node.output, list(enumerate(node.inputs)))
        eps = node.attrs.get("eps", 1e-5) if node.op == "group_norm" else None
        return RangeOp(node, RANGE[node.op], node.output, list(enumerate(node.inputs)), eps=eps)

    def scaled_operand(self, node, slot, exponent):
        return self.g.consts[node.inputs[slot]] * 2.0**exponent

    def scale_operand(self, node, slot, new) -> None:
        old = node.inputs[slot]
        node.inputs[slot] = self.g.const(f"{old}_range_{node.name}", new)
        self.writes.append((node.name, slot, new))

    def set_eps(self, node, eps) -> None:
        node.attrs["eps"] = eps

    def insert_mul(self, value, factor, readers=None):
        const = self.g.const(f"{value}_range_scale_{len(self.g.consts)}", torch.tensor(factor, dtype=torch.float64))
        mul = FNode(f"{value}_range_mul_{len(self.g.nodes)}", "mul", [value, const], "")
        mul.output = f"{mul.name}_out"
        producer = self.producer(value)
        at = self.g.nodes.index(producer) + 1 if producer is not None else 0
        for n in self.g.live():
            if readers is None or n in readers:
                n.inputs = [mul.output if v == value else v for v in n.inputs]
        if readers is None or None in readers:
            self.g.outputs = [mul.output if o == value else o for o in self.g.outputs]
        self.g.nodes.insert(at, mul)
        self.g.shapes[mul.output] = self.g.shapes[value]
        return mul.output

    def mul_placed(self, node):
        at = self.g.nodes.index(node)
        return (True, next((n for n in reversed(self.g.nodes[:at]) if not n.dead), None))
