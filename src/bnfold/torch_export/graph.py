"""The engine's adapter for fx graphs: torch.export / edge programs and bare GraphModules.

``FxGraph`` answers the engine's questions about an fx graph through the op
tables in ``ops.py`` and keeps tensors through a tensor editor
(``ProgramEditor`` for a program, ``GraphModuleEditor`` for a GraphModule edited
in place).  It decides nothing about folding.
"""

from __future__ import annotations

from numbers import Number
from typing import Any, Iterator

import torch
from torch.fx import Node

from ..engine.graph import Binary, Hop, Layer, LayerWeights, Norm, ShapeInfo, Step
from .axes import follow_axis
from .ops import (
    BINARY_OPS,
    IDENTITY_HOPS,
    RESHAPE_HOPS,
    addmm_like,
    dropout_is_identity,
    node_key,
    op_name,
    parse_layer,
    parse_norm,
    reads_only_metadata,
)
from .tensors import FxTensors


class FxGraph:
    """The adapter over ``editor.graph``; ``editor`` reads and writes its tensors."""

    def __init__(self, editor: FxTensors):
        self.editor = editor
        self.graph = editor.graph

    # ------------------------------------------------------------------ classify

    def _live(self) -> Iterator[Node]:
        for node in list(self.graph.nodes):
            if node.op == "call_function" and not getattr(node, "_erased", False):
                yield node

    def layers(self) -> Iterator[Layer]:
        for node in self._live():
            layer = parse_layer(node)
            if layer is not None:
                yield layer

    def norms(self) -> Iterator[Norm]:
        for node in self._live():
            norm = parse_norm(node)
            if norm is not None:
                yield norm

    def layer(self, node: Any) -> Layer | None:
        return parse_layer(node) if isinstance(node, Node) else None

    def norm(self, node: Any) -> Norm | None:
        return parse_norm(node) if isinstance(node, Node) else None

    def binary(self, node: Any) -> Binary | None:
        op = BINARY_OPS.get(node_key(node)) if isinstance(node, Node) else None
        if op is None or len(node.args) < 2:
            return None
        return Binary(node, op, node.args[0], node.args[1], node, node.kwargs.get("alpha", 1))

    def hop(self, node: Any) -> Hop | None:
        if not isinstance(node, Node):
            return None
        key = node_key(node)
        if key not in IDENTITY_HOPS and key not in RESHAPE_HOPS:
            return None
        if not node.args or not isinstance(node.args[0], Node) or not dropout_is_identity(node):
            return None
        return Hop(node, node.args[0], node, op_name(node))

    def is_live(self, node: Any) -> bool:
        return isinstance(node, Node) and not getattr(node, "_erased", False)

    # ------------------------------------------------------------------ navigate

    def users(self, value: Any) -> list:
        if not isinstance(value, Node):
            return []
        out = []
        for user in value.users:
            if user.op == "output":
                out.append(None)
            elif not reads_only_metadata(user, value):
                out.append(user)
        return out

    def producer(self, value: Any) -> Any:
        if not isinstance(value, Node) or value.op != "call_function":
            return None
        if node_key(value) == "getitem":  # a batch norm's normalized output
            source = value.args[0]
            norm = parse_norm(source) if isinstance(source, Node) else None
            return source if norm is not None and norm.output is value else None
        return value

    # ------------------------------------------------------------------ read

    def constant(self, value: Any) -> torch.Tensor | None:
        if isinstance(value, bool):
            return None
        if isinstance(value, Number):
            return torch.tensor(float(value), dtype=torch.float64)
        return self.editor.constant_value(value)

    def weights(self, layer: Layer) -> LayerWeights | str:
        w = self.editor.tensor(layer.weight)
        if w is None:
            return f"its weight is not a constant of the program (it comes from {self.describe(layer.weight)})"
        if layer.extra.transposed:
            w = w.T
        b = None
        if layer.bias is not None:
            b = self.editor.tensor(layer.bias)
            if b is None:
                return f"its bias is not a constant of the program (it comes from {self.describe(layer.bias)})"
        return LayerWeights(w, b, w.dtype, (b if b is not None else w).dtype)

    def shape_info(self, value: Any) -> ShapeInfo:
        val = value.meta.get("val") if isinstance(value, Node) else None
        if isinstance(val, torch.Tensor):
            return ShapeInfo(val.dim(), val.dtype, tuple(val.shape))
        return ShapeInfo(None)

    def follow_axis(self, hop: Hop, axis: int, forward: bool) -> int | str:
        found = follow_axis(hop.node, self.shape_info(hop.input).shape, self.shape_info(hop.output).shape,
                            axis, forward)
        return f"{self.describe_node(hop.node)} moves or merges the channel axis" if found is None else found

    def describe(self, value: Any) -> str:
        return self.editor.describe(value)

    def describe_node(self, node: Any) -> str:
        return self.editor.describe(node)

    def node_name(self, node: Any) -> str:
        return node.name

    def norm_label(self, norm: Norm) -> str:
        if isinstance(norm.mean, Node):
            target = self.editor.target(norm.mean)
            if target.endswith(".running_mean"):
                return target[: -len(".running_mean")]
        return self.op_label(norm.node)

    def op_label(self, node: Any) -> str:
        stack = node.meta.get("nn_module_stack")
        if stack:
            path = list(stack.values())[-1][0]
            if path:
                return path
        return node.name

    # ------------------------------------------------------------------ write

    def write_layer(self, layer: Layer, weight: torch.Tensor, bias: torch.Tensor | None, label: str):
        """Store the folded weight and bias.  Returns the bytes added by private
        copies, and the bias still to be added after the layer (None if none)."""
        editor, wiring = self.editor, layer.extra
        if wiring.transposed:
            weight = weight.T.contiguous()
        extra = 0
        holder = wiring.views[-1] if wiring.views else layer.weight
        shared = editor.is_shared(layer.weight) or any(len(v.users) > 1 for v in wiring.views)
        if shared:
            new = editor.add_tensor(layer.weight, derived_target(editor.target(layer.weight), "weight", label), weight)
            extra += weight.numel() * weight.element_size()
            new_holder = self._copy_views(wiring.views, new, layer.node)
            layer.node.replace_input_with(holder, new_holder)
            for view in reversed(wiring.views):
                editor.erase_dead(view)
        else:
            editor.replace_tensor(layer.weight, weight)
        if bias is None:
            return extra, None
        if layer.bias is not None:
            if editor.is_shared(layer.bias):
                new_bias = editor.add_tensor(layer.bias, derived_target(editor.target(layer.bias), "bias", label), bias)
                extra += bias.numel() * bias.element_size()
                layer.node.replace_input_with(layer.bias, new_bias)
                editor.drop_if_unused(layer.bias)
            else:
                editor.replace_tensor(layer.bias, bias)
            return extra, None
        if not layer.takes_bias:
            return extra, bias  # bmm: the engine adds the bias after the chain
        target = derived_target(editor.target(layer.weight), "bias", label if shared else None)
        bias_node = editor.add_tensor(layer.weight, target, bias)
        if shared:
            extra += bias.numel() * bias.element_size()
        _set_bias(layer, bias_node)
        return extra, None

    def add_bias(self, layer: Layer, value: Node, bias: torch.Tensor, axis: int, rank: int | None) -> None:
        """Make every user of ``value`` read ``value + bias`` (bias along ``axis``)."""
        shape = [bias.numel()] + [1] * (rank - 1 - axis)
        target = derived_target(self.editor.target(layer.weight), "bias", None)
        node = self.editor.add_tensor(layer.weight, target, bias.reshape(shape))
        target = torch.ops.aten.add.Tensor
        if value.op == "call_function" and type(value.target).__name__ == "EdgeOpOverload":
            from executorch.exir.dialects._ops import ops as exir_ops

            target = exir_ops.edge.aten.add.Tensor
        users = list(value.users)
        with self.graph.inserting_after(value):
            add = self.graph.call_function(target, (value, node))
        add.meta = {k: v for k, v in value.meta.items() if k in ("val", "stack_trace", "nn_module_stack")}
        for user in users:
            if not reads_only_metadata(user, value):
                user.replace_input_with(value, add)

    def _copy_views(self, views: tuple, source: Node, before: Node) -> Node:
        for view in views:
            with self.graph.inserting_before(before):
                copy = self.graph.call_function(view.target, (source, *view.args[1:]), dict(view.kwargs))
            copy.meta = dict(view.meta)
            source = copy
        return source

    def remove_steps(self, steps: list[Step]) -> Any:
        """Take the affine steps out; returns the value that now stands where the chain ended."""
        editor, graph = self.editor, self.graph
        operands, replaced = [], {}
        end = steps[-1].output
        for step in steps:
            if step.affine is None:
                continue
            source = step.input
            while source in replaced:  # the step read the output of a step already removed
                source = replaced[source]
            replaced[step.output] = source
            step.output.replace_all_uses_with(source)
            operands.extend(v for v in step.operands if isinstance(v, Node))
            if step.norm is not None:
                for user in list(step.node.users):
                    graph.erase_node(user)
                tracked = self._num_batches_tracked(step.norm)
                if tracked is not None:
                    operands.append(tracked)
            graph.erase_node(step.node)
        for node in operands:
            editor.erase_dead(node)
        while end in replaced:
            end = replaced[end]
        return end

    def _num_batches_tracked(self, norm: Norm) -> Node | None:
        if not isinstance(norm.mean, Node):
            return None
        target = self.editor.target(norm.mean)
        if not target.endswith(".running_mean"):
            return None
        return self.editor.placeholder_for_target(target[: -len("running_mean")] + "num_batches_tracked")


def derived_target(target: str, role: str, label: str | None) -> str:
    """``conv.weight`` -> ``conv.bias`` / ``conv.weight_folded_bn1``; other names get a suffix."""
    module, _, leaf = target.rpartition(".")
    base = (module + "." if module else "") if leaf in ("weight", "bias") else target + "_"
    name = base + role
    return f"{name}_folded_{label}" if label else name


def _set_bias(layer: Layer, bias: Node) -> None:
    node, slot = layer.node, layer.extra.bias_slot
    if node_key(node) == "aten::mm.default":  # mm(x, w.T) becomes addmm(bias, x, w.T), keeping the node
        node.target = addmm_like(node.target)
        node.args = (bias, *node.args)
        return
    if "bias" in node.kwargs:
        node.kwargs = {**node.kwargs, "bias": bias}
        return
    args = list(node.args)
    while len(args) <= slot:
        args.append(None)
    args[slot] = bias
    node.args = tuple(args)

