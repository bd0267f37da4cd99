"""The engine's adapter for fx graphs: torch.export / edge programs and bare GraphModules.

``FxGraph`` answers the engine's questions about an fx graph through the op
tables in ``ops.py`` and keeps tensors through a tensor editor
(``ProgramEditor`` for a program, ``GraphModuleEditor`` for a GraphModule edited
in place).  It decides nothing about folding.
"""

from __future__ import annotations

from collections.abc import Iterator
from numbers import Number
from typing import Any

import torch
from torch.fx import Node

from ..engine.graph import Binary, ChainStep, ConvGeometry, Hop, Layer, LayerWeights, Norm, Pool, ShapeInfo
from ..report import CONSTANT_NORM_REASON, Code
from .axes import follow_axis
from .geometry import conv_geometry, parse_inplace_sum, parse_pool
from .ops import (
    BINARY_OPS,
    HOPS,
    INPLACE_BINARY_OPS,
    OPS,
    addmm_like,
    hop_is_exact,
    in_dialect_of,
    module_path,
    node_key,
    op_name,
    parse_layer,
    parse_norm,
    parse_norm_affine,
    parse_plain_norm,
    reads_only_metadata,
    values_of,
)
from .range import FxRange
from .tensors import FxTensors


class FxGraph(FxRange):
    """The adapter over ``editor.graph``; ``editor`` reads and writes its tensors (the fp16 range rewrite's
    reads and edits: ``FxRange``)."""

    #: new per-channel tensors are ``[1, C, 1, 1]``: nothing left for a backend to broadcast
    full_rank_constants = True
    #: what ``exclude`` patterns match, for the message about a pattern that matches nothing
    label_names = "module paths (node names where a node has none)"

    def __init__(self, editor: FxTensors):
        self.editor = editor
        self.graph = editor.graph
        self._layers: dict[Node, tuple] = {}  # node -> (target, args, kwargs parsed, Layer | None)

    # ------------------------------------------------------------------ classify

    def _live(self) -> Iterator[Node]:
        for node in list(self.graph.nodes):
            if node.op == "call_function" and not getattr(node, "_erased", False):
                yield node

    def layers(self) -> Iterator[Layer]:
        for node in self._live():
            layer = self._parse_layer(node)
            if layer is not None:
                yield layer

    def _parse_layer(self, node: Node) -> Layer | None:
        """``parse_layer(node)``, kept while the node's target and arguments stay the same objects (an
        edit gives a node new ``args``; a layer's reading depends only on them and their weight path)."""
        target, args, kwargs = node.target, node.args, node.kwargs
        hit = self._layers.get(node)
        if hit is not None and hit[0] is target and hit[1] is args and hit[2] is kwargs:
            return hit[3]
        layer = parse_layer(node)
        self._layers[node] = (target, args, kwargs, layer)
        return layer

    def norms(self) -> Iterator[Norm]:
        for node in self._live():
            norm = self.norm(node)
            if norm is not None:
                yield norm

    def plain_norms(self) -> Iterator[Norm]:
        for node in self._live():
            norm = self.plain_norm(node)
            if norm is not None:
                yield norm

    def layer(self, node: Any) -> Layer | None:
        return self._parse_layer(node) if isinstance(node, Node) else None

    def plain_norm(self, node: Any) -> Norm | None:
        return parse_plain_norm(node) if isinstance(node, Node) else None

    def norm(self, node: Any) -> Norm | None:
        if not isinstance(node, Node):
            return None
        norm = parse_norm(node) or parse_norm_affine(node)
        if norm is not None and norm.problem and self.editor.is_constant(norm.input):
            # weight standardization: batch statistics of a parameter
            norm.problem, norm.problem_code = CONSTANT_NORM_REASON, Code.CONSTANT_NORM
        return norm

    def binary(self, node: Any) -> Binary | None:
        if not isinstance(node, Node):
            return None
        key = node_key(node)
        op = BINARY_OPS.get(key)
        if op is None and (op := INPLACE_BINARY_OPS.get(key)) is not None and not self._private(node):
            return None  # an in-place op whose mutation another op (or the graph's output) sees
        if op is None or len(node.args) < 2:
            return None
        return Binary(node, op, node.args[0], node.args[1], node, node.kwargs.get("alpha", 1))

    def _private(self, node: Node) -> bool:
        """Whether the value an in-place op mutates is computed in the graph and read by that op alone."""
        target = node.args[0] if node.args else None
        return _computed(target) and self.users(target) == [node]

    def hop(self, node: Any) -> Hop | None:
        if not isinstance(node, Node):
            return None
        key = node_key(node)
        if key not in HOPS:
            return None
        if not node.args or not isinstance(node.args[0], Node) or not hop_is_exact(node):
            return None
        output = values_of(node) if isinstance(node.meta.get("val"), (tuple, list)) else node
        if output is None:
            return None
        return Hop(
            node,
            node.args[0],
            output,
            op_name(node.target),
            monotone=OPS[key].monotone,
            identity=HOPS[key] == "identity",
        )

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
        if node_key(value) == "getitem":  # a batch norm's normalized output, a max-pool's values
            source = value.args[0]
            norm = self.norm(source) or self.plain_norm(source)
            if norm is not None:
                return source if norm.output is value else None
            hop = self.hop(source)
            return source if hop is not None and hop.output is value else None
        return value

    # ------------------------------------------------------------------ read

    def constant(self, value: Any, values: bool = True) -> torch.Tensor | None:  # values read always (in memory)
        if isinstance(value, bool):
            return None
        if isinstance(value, Number):
            return torch.tensor(float(value), dtype=torch.float64)
        t = self.editor.constant_value(value)  # the program's own tensor, or one computed from them (in float64)
        self.editor.release(value)  # a large computed one is not kept for the next call
        return t

    def stored_key(self, value: Any) -> None:
        """None: a program's constants are in memory, none is left on disk."""
        return None

    def is_constant(self, value: Any) -> bool:
        """Whether :meth:`constant` gives a tensor for ``value``, no tensor of the program copied."""
        if isinstance(value, bool):
            return False
        return isinstance(value, Number) or self.editor.is_constant(value)

    def weights(self, layer: Layer, values: bool = True) -> LayerWeights | str:  # values read always
        w = self._parameter(layer.weight, not layer.extra.views)
        if w is None:
            return f"its weight is not a constant of the program (it comes from {self.describe(layer.weight)})"
        if layer.extra.transposed:
            w = w.T
        b = None
        if layer.bias is not None:
            b = self._parameter(layer.bias, True)
            if b is None:
                return f"its bias is not a constant of the program (it comes from {self.describe(layer.bias)})"
        return LayerWeights(w, b, w.dtype, (b if b is not None else w).dtype)

    def _parameter(self, node: Any, computed_ok: bool) -> torch.Tensor | None:
        """A layer's weight or bias: a tensor of the program, or (``computed_ok``) a value computed
        only from such tensors (``w.unsqueeze(2)``), evaluated and cast back to its dtype."""
        t = self.editor.tensor(node)
        if t is not None or not computed_ok or not _computed(node):
            return t
        value, info = self.editor.constant_value(node), self.shape_info(node)
        self.editor.release(node)
        if value is None or info.dtype is None or tuple(value.shape) != tuple(info.shape or ()):
            return None
        return value.to(info.dtype)

    def _materialize(self, layer: Layer, node: Node, value: torch.Tensor, role: str, label: str) -> int:
        """Replace a computed weight or bias of ``layer`` by a new tensor holding ``value`` (named after
        the tensor it was computed from); returns the bytes added."""
        editor = self.editor
        source = _tensor_node(node)
        old = editor.tensor(source)
        new = editor.add_tensor(source, f"{editor.target(source)}_folded_{label}", value)
        layer.node.replace_input_with(node, new)
        editor.erase_dead(node)
        dropped = old.numel() * old.element_size() if getattr(source, "_erased", False) else 0
        return value.numel() * value.element_size() - dropped

    def shape_info(self, value: Any) -> ShapeInfo:
        val = value.meta.get("val") if isinstance(value, Node) else None
        if isinstance(val, torch.Tensor):
            return ShapeInfo(val.dim(), val.dtype, tuple(val.shape))
        return ShapeInfo(None)

    def follow_axis(self, hop: Hop, axis: int, forward: bool) -> int | str:
        found = follow_axis(
            hop.node, self.shape_info(hop.input).shape, self.shape_info(hop.output).shape, axis, forward
        )
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
        return module_path(node)

    # ------------------------------------------------------------------ write

    def write_layer(self, layer: Layer, weight: torch.Tensor, bias: torch.Tensor | None, label: str):
        """Store the folded weight and bias.  Returns the bytes added by private
        copies, and the bias still to be added after the layer (None if none)."""
        if layer.extra.transposed:
            weight = weight.T.contiguous()
        extra, shared = self._write_weight(layer, weight, label)
        if bias is None:
            return extra, None
        if layer.bias is not None:
            return extra + self._write_existing_bias(layer, bias, label), None
        if not layer.takes_bias:
            return extra, bias  # bmm: the engine adds the bias after the chain
        editor = self.editor
        like = _tensor_node(layer.node.args[1]) if _computed(layer.weight) else layer.weight
        target = derived_target(editor.target(like), "bias", label if shared else None)
        bias_node = editor.add_tensor(like, target, bias)
        if shared:
            extra += bias.numel() * bias.element_size()
        _set_bias(layer, bias_node)
        return extra, None

    def _write_weight(self, layer: Layer, weight: torch.Tensor, label: str) -> tuple[int, bool]:
        """The folded weight into ``layer``: in place, as a private copy of a shared tensor, or as a
        new tensor for a computed one.  Returns the bytes added and whether a copy was made."""
        editor, wiring = self.editor, layer.extra
        if _computed(layer.weight) and not wiring.views:
            return self._materialize(layer, layer.weight, weight, "weight", label), False
        holder = wiring.views[-1] if wiring.views else layer.weight
        if not (editor.is_shared(layer.weight) or any(len(v.users) > 1 for v in wiring.views)):
            editor.replace_tensor(layer.weight, weight)
            return 0, False
        new = editor.add_tensor(layer.weight, derived_target(editor.target(layer.weight), "weight", label), weight)
        layer.node.replace_input_with(holder, self._copy_views(wiring.views, new, layer.node))
        for view in reversed(wiring.views):
            editor.erase_dead(view)
        return weight.numel() * weight.element_size(), True

    def _write_existing_bias(self, layer: Layer, bias: torch.Tensor, label: str) -> int:
        editor = self.editor
        if _computed(layer.bias):
            return self._materialize(layer, layer.bias, bias, "bias", label)
        if not editor.is_shared(layer.bias):
            editor.replace_tensor(layer.bias, bias)
            return 0
        new_bias = editor.add_tensor(layer.bias, derived_target(editor.target(layer.bias), "bias", label), bias)
        layer.node.replace_input_with(layer.bias, new_bias)
        editor.drop_if_unused(layer.bias)
        return bias.numel() * bias.element_size()

    def add_bias(self, layer: Layer, value: Node, bias: torch.Tensor) -> None:
        """Make every user of ``value`` read ``value + bias`` (``bias`` shaped by the engine)."""
        target = derived_target(self.editor.target(layer.weight), "bias", None)
        node = self.editor.add_tensor(layer.weight, target, bias)
        target = in_dialect_of(value.target, torch.ops.aten.add.Tensor)
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

    def remove_node(self, step: ChainStep, source: Any) -> bool:
        """Erase the step's node (and a batch norm's ``getitem`` outputs); its users read ``source``."""
        graph = self.graph
        step.output.replace_all_uses_with(source)
        tracked = None
        if step.norm is not None:
            for user in list(step.node.users):
                graph.erase_node(user)
            tracked = self._num_batches_tracked(step.norm)
        graph.erase_node(step.node)
        if tracked is not None:
            self.editor.erase_dead(tracked)
        return False

    def strip_affine(self, norm: Norm) -> None:
        _strip_affine(norm)

    def drop_unused(self, values: list) -> None:
        for value in values:
            if isinstance(value, Node):
                self.editor.erase_dead(value)

    def lower_norm(self, norm: Norm, scale: torch.Tensor, shift: torch.Tensor) -> None:
        """Replace a batch norm by ``x * scale + shift`` (the constants shaped ``[1, C, 1, ...]`` by the engine)."""
        editor, graph = self.editor, self.graph
        like = next(v for v in (norm.mean, norm.var, norm.weight, norm.bias) if isinstance(v, Node))
        base = self.norm_label(norm)
        s_node = editor.add_tensor(like, f"{base}.lowered_scale", scale)
        t_node = editor.add_tensor(like, f"{base}.lowered_shift", shift)
        mul_op = in_dialect_of(norm.node.target, torch.ops.aten.mul.Tensor)
        add_op = in_dialect_of(norm.node.target, torch.ops.aten.add.Tensor)
        with graph.inserting_before(norm.node):
            mul = graph.call_function(mul_op, (norm.input, s_node))
            add = graph.call_function(add_op, (mul, t_node))
        keep = ("val", "stack_trace", "nn_module_stack", "source_fn_stack")
        for new in (mul, add):
            new.meta = {k: v for k, v in norm.output.meta.items() if k in keep}
        norm.output.replace_all_uses_with(add)
        operands = [v for v in (norm.weight, norm.bias, norm.mean, norm.var) if isinstance(v, Node)]
        tracked = self._num_batches_tracked(norm)
        for user in list(norm.node.users):
            graph.erase_node(user)
        graph.erase_node(norm.node)
        for node in operands + ([tracked] if tracked is not None else []):
            editor.erase_dead(node)

    def _num_batches_tracked(self, norm: Norm) -> Node | None:
        if not isinstance(norm.mean, Node):
            return None
        target = self.editor.target(norm.mean)
        if not target.endswith(".running_mean"):
            return None
        return self.editor.placeholder_for_target(target[: -len("running_mean")] + "num_batches_tracked")

    # ------------------------------------------------------------------ re-parameterization (engine/reparam.py)

    def conv_geometry(self, layer: Layer) -> ConvGeometry | str:
        shape = self.shape_info(layer.weight).shape
        return conv_geometry(layer, None if shape is None else tuple(shape[2:]))

    def pool(self, node: Any) -> Pool | None:
        return parse_pool(node) if isinstance(node, Node) and self.is_live(node) else None

    def inplace_sum(self, node: Any) -> Binary | None:
        return parse_inplace_sum(node) if isinstance(node, Node) and self.is_live(node) else None

    def inputs(self, node: Any) -> list:
        return list(node.all_input_nodes) if isinstance(node, Node) else []

    def bypass(self, old: Any, new: Any, nodes: list) -> None:
        """Every reader of ``old`` reads ``new``; ``nodes`` go (last first), then their dead inputs."""
        old.replace_all_uses_with(new)
        order = {n: i for i, n in enumerate(self.graph.nodes)}
        inputs = []
        for node in sorted(nodes, key=lambda n: -order[n]):
            norm = self.norm(node)
            inputs.extend(node.all_input_nodes)
            if norm is not None and not norm.affine_only:
                tracked = self._num_batches_tracked(norm)
                if tracked is not None:
                    inputs.append(tracked)
            for user in list(node.users):  # a batch norm's getitems
                self.graph.erase_node(user)
            self.graph.erase_node(node)
        for node in inputs:
            self.editor.erase_dead(node)


def derived_target(target: str, role: str, label: str | None) -> str:
    """``conv.weight`` -> ``conv.bias`` / ``conv.weight_folded_bn1``; other names get a suffix."""
    module, _, leaf = target.rpartition(".")
    base = (module + "." if module else "") if leaf in ("weight", "bias") else target + "_"
    name = base + role
    return f"{name}_folded_{label}" if label else name


def _computed(node: Any) -> bool:
    """Whether ``node`` is a value computed in the graph (not a tensor of the program)."""
    return isinstance(node, Node) and node.op == "call_function"


def _tensor_node(node: Node) -> Node:
    """The first tensor (placeholder or get_attr) ``node`` is computed from, following first inputs."""
    while node.op == "call_function":
        node = next(n for n in node.all_input_nodes)
    return node


def _strip_affine(norm: Norm) -> None:
    """``weight``/``bias`` of a LayerNorm-like node become None: the normalization alone stays."""
    args = list(norm.node.args)
    for value in (norm.weight, norm.bias):
        if value is not None:
            args = [None if a is value else a for a in args]
    norm.node.args = tuple(args)
    norm.node.kwargs = {k: (None if v is norm.weight or v is norm.bias else v) for k, v in norm.node.kwargs.items()}


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
