"""The engine's adapter for ONNX models: ``OnnxGraph``.

It answers the engine's questions about a model (the main graph and every
If/Loop/Scan body) through the op tables in ``ops.py``, the model index
(``index.py``, its edits ``editor.py``) and inferred shapes (``shapes.py``), and makes the few edits a
fold needs.  Values are names in a graph scope, nodes are node protos (see
``handles.py``).  It decides nothing about folding.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import onnx
import torch

from .. import fold_math
from ..engine.graph import Binary, ChainStep, ConvGeometry, Hop, Layer, LayerWeights, Norm, Pool, ShapeInfo
from ..fold_math import FoldError, Product, affine, in_channels, out_channels
from ..report import Code
from .axes import consumer_dims, follow_axis, merge_dims, producer_rank
from .const_eval import Const
from .editor import ModelEditor
from .geometry import conv_geometry, parse_pool
from .handles import Node, Value, value
from .nodes import attr, is_onnx_op, remove_attr
from .nodes import label as node_label
from .ops import (
    LAYER_OPS,
    NORM_AFFINES,
    NORMS,
    PLAIN_NORMS,
    dropout_training,
    parse_binary,
    parse_hop,
    parse_layer,
    parse_norm,
    parse_plain_norm,
    reads_only_metadata,
    reads_only_type,
)
from .params import add_initializer, filled_initializer, new_node, safe, set_param
from .range import OnnxRange
from .shapes import Shapes
from .tensors import TORCH_DTYPES, is_external, spill_to_reader, stored_key, to_torch, torch_dtype

#: How far ``shape_info`` follows neighbouring values to complete a shape.
_MAX_DEPTH = 8


class OnnxGraph(OnnxRange):
    """The adapter over ``index.model``; ``shapes`` are those of the model before the fold."""

    #: new per-channel tensors are ``[C, 1, 1]``, trailing-aligned (ONNX broadcasting)
    full_rank_constants = False
    #: what ``exclude`` patterns match, for the message about a pattern that matches nothing
    label_names = "ONNX node names (a dynamo export's node names hold no module path)"

    def __init__(self, index: ModelEditor, shapes: Shapes):
        self.index = index
        self.shapes = shapes
        self._consts: dict[tuple, Const | str] = {}  # cleared by every edit
        self._is_const: dict[Value, bool] = {}  # cleared by every edit
        self._streamed_const: dict[tuple, bool] = {}  # (value, id of its streamed initializer): kept
        self._tensors: dict[Value, torch.Tensor | None] = {}
        self._shape_names: dict[str, str] = {}  # a name the fold made up -> the name whose shape it has
        self._depth = 0  # of shape_info asking about neighbouring values
        # shape_info answers by (value, depth they were asked at): an answer depends on the depth left to it
        # (cleared by every edit); without them, the neighbours' questions repeat exponentially in the depth
        self._infos: dict[tuple[Value, int], ShapeInfo] = {}
        self._filled: dict[tuple, str] = {}  # (graph, dtype, shape, fill) -> a constant initializer made here

    # ------------------------------------------------------------------ handles

    def value(self, gi, name: str) -> Value:
        return value(gi, name)

    def _nodes(self, op_types) -> Iterator[Node]:
        for gi in self.index.graphs:
            for proto in gi.nodes:
                if proto.op_type in op_types and not self.index.is_dead(proto):
                    yield Node(proto, gi)

    # ------------------------------------------------------------------ classify

    def layers(self) -> Iterator[Layer]:
        for node in self._nodes(LAYER_OPS):
            layer = parse_layer(self, node)
            if layer is not None:
                yield layer

    def norms(self) -> Iterator[Norm]:
        """The normalizations, less those of a constant that nobody reads any more (a standardized
        weight whose layer now holds the folded one: the clean-up removes them)."""
        for node in self._nodes(NORMS):
            norm = parse_norm(self, node)
            if norm is not None and not (
                norm.problem_code is Code.CONSTANT_NORM and self.index.unused_constant(node.gi, node.proto)
            ):
                yield norm

    def plain_norms(self) -> Iterator[Norm]:
        for node in self._nodes(PLAIN_NORMS):
            norm = parse_plain_norm(self, node)
            if norm is not None:
                yield norm

    def layer(self, node: Any) -> Layer | None:
        return parse_layer(self, node) if self.is_live(node) else None

    def plain_norm(self, node: Any) -> Norm | None:
        return parse_plain_norm(self, node) if self.is_live(node) else None

    def norm(self, node: Any) -> Norm | None:
        return parse_norm(self, node) if self.is_live(node) else None

    def binary(self, node: Any) -> Binary | None:
        return parse_binary(self, node) if self.is_live(node) else None

    def hop(self, node: Any) -> Hop | None:
        return parse_hop(self, node) if self.is_live(node) else None

    def is_live(self, node: Any) -> bool:
        return isinstance(node, Node) and not self.index.is_dead(node.proto)

    # ------------------------------------------------------------------ navigate

    def users(self, value: Any) -> list:
        """The nodes that read ``value`` (each once); None for a graph output or a use inside a subgraph.
        A node that reads only its shape (``Shape``, ``Size``) is no user."""
        if not isinstance(value, Value):
            return []
        out, seen = [], set()
        for use in self.index.visible_uses(value.gi, value.name):
            if use.node is None or use.gi is not value.gi:
                out.append(None)
            elif (
                not self.index.is_dead(use.node)
                and not reads_only_metadata(use.node)
                and not reads_only_type(use.node, use.idx)
                and id(use.node) not in seen
            ):
                seen.add(id(use.node))
                out.append(Node(use.node, use.gi))
        return out

    def producer(self, value: Any) -> Node | None:
        if not isinstance(value, Value):
            return None
        found = value.gi.producer.get(value.name)
        return None if found is None or self.index.is_dead(found[0]) else Node(found[0], value.gi)

    def is_parameter(self, value: Value) -> bool:
        """Whether ``value`` is a graph input or an initializer (no node computes it)."""
        return value.name in value.gi.inputs or value.name in value.gi.inits

    # ------------------------------------------------------------------ read

    def const_or_reason(self, value: Value, what: str) -> Const | str:
        """The stored constant behind ``value`` (initializer, Constant node, or computed from those), or why not."""
        key = (value, what)
        if key not in self._consts:
            found = self.index.constant(value.gi, value.name, what)
            if self._streamed(value) is not None:  # read again when needed, never held: one tensor at a time
                return found
            self._consts[key] = found
        return self._consts[key]

    def is_const(self, value: Value) -> bool:
        """Whether ``value`` is a stored constant (:meth:`const` is not None), without holding a streamed one
        (whose answer is kept across edits while its initializer is the same proto)."""
        streamed = self._streamed(value)
        key = (value, id(streamed)) if streamed is not None else value
        known = self._streamed_const if streamed is not None else self._is_const
        if key not in known:
            known[key] = self.const(value) is not None
        return known[key]

    def _streamed(self, value: Value) -> onnx.TensorProto | None:
        """The initializer behind ``value`` when a streamed load left its data on disk, else None."""
        for g in value.gi.chain():
            if value.name in g.inits:
                t = g.inits[value.name]
                return t if is_external(t) else None
        return None

    def const(self, value: Value) -> Const | None:
        c = self.const_or_reason(value, "value")
        return None if isinstance(c, str) else c

    def constant(self, value: Any, values: bool = True) -> torch.Tensor | None:
        """A floating-point constant as a float64 tensor, or None; kept for the next call but where a streamed load
        left it on disk and it is at least :data:`bnfold.fold_math.LARGE_BYTES` (such an initializer, which the range
        planner may ask about, is read again: its float64 copy is not held beside the model).  A chain's walk asks
        for the same constant at every step: a held one is converted once.  ``values=False``: a streamed initializer
        not held is a ``meta`` tensor of its shape (the dims the load checked against its data), nothing read."""
        if not isinstance(value, Value):
            return None
        if value in self._tensors:
            return self._tensors[value]
        c = self.const(value)
        if not values and c is not None and self._streamed(value) is not None:
            return torch.empty(c.shape, dtype=torch.float64, device="meta") if _floating(c) else None
        t = to_torch(c.value).to(torch.float64) if c is not None and _floating(c) else None
        if t is None or t.nbytes < fold_math.LARGE_BYTES or self._streamed(value) is None:
            self._tensors[value] = t
        return t

    def stored_key(self, value: Any) -> tuple | None:
        """What names the stored bytes of ``value``'s initializer where a streamed load left it on disk
        (:func:`.tensors.stored_key`), else None."""
        t = self._streamed(value) if isinstance(value, Value) else None
        return None if t is None else stored_key(t)

    def is_constant(self, value: Any) -> bool:
        """Whether :meth:`constant` gives a tensor for ``value``, told from the constant's dtype: a streamed
        initializer's from its element type, its data not read and nothing copied."""
        if not isinstance(value, Value):
            return False
        if value in self._tensors:
            return self._tensors[value] is not None
        c = self.const(value)
        return c is not None and _floating(c)

    def dims(self, value: Value) -> list | None:
        """The dims of ``value``: inferred, or those of the constant it holds."""
        dims = self.shapes.dims(self._shape_names.get(value.name, value.name))
        if dims is None and (t := self._streamed(value)) is not None and self.is_const(value):
            dims = list(t.dims)
        elif dims is None and (c := self.const(value)) is not None:
            dims = list(c.value.shape)
        return dims

    def shape_info(self, value: Any) -> ShapeInfo:
        """Inferred dims, completed by what the value's readers imply; else the rank its producer implies."""
        if not isinstance(value, Value):
            return ShapeInfo(None)
        key = (value, self._depth)
        if key not in self._infos:
            self._infos[key] = self._shape_info(value)
        return self._infos[key]

    def _shape_info(self, value: Value) -> ShapeInfo:
        dims = self.dims(value)
        kind = self.shapes.elem_type(self._shape_names.get(value.name, value.name))
        kind = TORCH_DTYPES.get(kind, kind)  # a float type as a torch dtype (what lowering casts to)
        if (dims is None or not all(isinstance(d, int) for d in dims)) and self._depth < _MAX_DEPTH:
            self._depth += 1
            try:
                dims = merge_dims(dims, consumer_dims(self, value))
                node = self.producer(value) if dims is None else None
                if node is not None and node.proto.output[0] == value.name:
                    return ShapeInfo(producer_rank(self, node), kind)
            finally:
                self._depth -= 1
        return ShapeInfo(None, kind) if dims is None else ShapeInfo(len(dims), kind, tuple(dims))

    def weights(self, layer: Layer, values: bool = True) -> LayerWeights | str:
        p, wiring = layer.node.proto, layer.extra
        c = self.const_or_reason(layer.weight, "weight")
        if isinstance(c, str):
            return c
        streamed = self._streamed(layer.weight)
        try:
            if not values and streamed is not None and c.elem_type in TORCH_DTYPES:  # its shape, not its bytes
                w = torch.empty(c.shape, dtype=TORCH_DTYPES[c.elem_type], device="meta")
            else:
                w = to_torch(c.value)
            dtype = torch_dtype(c.elem_type, "the weight")
            bias, bias_dtype, pre = None, dtype, None
            if p.op_type in ("Gemm", "MatMul"):
                if p.op_type == "Gemm" and self.index.opset < 7:
                    return "Gemm before opset 7 (with the broadcast attribute) is not supported"
                if w.dim() != 2:
                    return f"its weight has rank {w.dim()}; only a 2-D constant weight folds"
                if wiring.transposed:
                    w = w.T
            n_out = out_channels(layer.kind, tuple(w.shape), layer.groups)
            in_channels(layer.kind, tuple(w.shape), layer.groups)
            if layer.bias is not None:
                b = self.const_or_reason(layer.bias, "C" if p.op_type == "Gemm" else "bias")
                if isinstance(b, str):
                    return b
                bias, bias_dtype = to_torch(b.value), torch_dtype(b.elem_type, "the bias")
                if p.op_type in ("Conv", "ConvTranspose") and tuple(bias.shape) != (n_out,):
                    return (
                        f"its bias has shape {list(bias.shape)}, not [{n_out}]: ONNX requires a {p.op_type} bias "
                        "of one value per output channel, so the model is invalid"
                    )
                if p.op_type == "Gemm":
                    shape = tuple(bias.shape)
                    if bias.dim() > 2 or (bias.dim() == 2 and shape[0] != 1) or bias.numel() not in (1, n_out):
                        return f"its C has shape {list(shape)}, not a per-output-channel bias"
                bias = affine(None, bias, n_out).shift  # a scalar bias broadcasts to every channel
            if p.op_type == "Gemm" and (bias is not None or float(attr(p, "alpha", 1.0)) != 1.0):
                beta = float(attr(p, "beta", 1.0))
                pre = affine(float(attr(p, "alpha", 1.0)), None if bias is None else bias * beta, n_out)
                bias = None  # alpha and beta * C act after the product, as ``pre``
        except FoldError as err:
            return str(err)
        # a weight a streamed load left on disk is folded as a Product: made again from the weight read again where
        # it is read or saved (from_torch), else its checked blocks written to the scratch file as they are made
        # (spill_to_reader), else made again block by block where it is written
        deferred = (spill_to_reader(streamed.data_type, w) or True) if streamed is not None else False
        return LayerWeights(w, bias, dtype, bias_dtype, pre, deferred=deferred)

    def follow_axis(self, hop: Hop, axis: int, forward: bool) -> int | str:
        return follow_axis(self, hop, axis, forward)

    def describe(self, value: Any) -> str:
        if not isinstance(value, Value):
            return f"the value {value!r}"
        node = self.producer(value)
        if node is not None:
            training = dropout_training(self, node) if is_onnx_op(node.proto, "Dropout") else ""
            return f"'{value.name}' ({node.proto.op_type}{': ' + training if training else ''})"
        if value.name in value.gi.inits:
            return f"initializer '{value.name}'"
        if value.name in value.gi.inputs:
            return f"{'user' if value.gi.parent is None else 'subgraph'} input '{value.name}'"
        return f"'{value.name}'"

    def describe_node(self, node: Any) -> str:
        return f"'{self.node_name(node)}' ({node.proto.op_type})"

    def node_name(self, node: Any) -> str:
        return node_label(node.proto)

    def norm_label(self, norm: Norm) -> str:
        return self.node_name(norm.node)

    def op_label(self, node: Any) -> str:
        return self.node_name(node)

    # ------------------------------------------------------------------ write

    def _edited(self) -> None:
        self._consts.clear()
        self._is_const.clear()
        self._tensors.clear()
        self._infos.clear()

    def write_layer(self, layer: Layer, weight: torch.Tensor, bias: torch.Tensor | None, label: str):
        """Store the folded weight and bias in the layout and dtype they are stored in.  Returns the
        bytes added by private copies, and the bias still to be added after the layer (None if none).

        Private copies are named after the layer node (``W_folded_conv``), which is what makes them
        private, so ``label`` is not needed.  The bias goes first: an exporter may compute a zero
        bias from the weight's shape, and once that bias is replaced the weight is no longer shared.
        """
        index, node, gi, wiring = self.index, layer.node.proto, layer.node.gi, layer.extra
        self._edited()
        extra, pending = 0, None
        if node.op_type == "Gemm":  # alpha and beta are folded into the weight and C
            remove_attr(node, "alpha")
            remove_attr(node, "beta")
        if bias is not None and wiring.bias_node is None:
            pending = bias  # a MatMul without a bias Add: the engine adds one after the chain
        elif bias is not None:
            old = self.const(layer.bias) if layer.bias is not None else None
            shape = tuple(old.value.shape) if old is not None and old.value.size == bias.numel() else (bias.numel(),)
            extra += set_param(index, gi, wiring.bias_node, wiring.bias_slot, bias.reshape(shape))
        stored = weight.T if wiring.transposed else weight
        stored = stored if isinstance(stored, Product) else stored.contiguous()
        holder = node
        if wiring.expand is not None:
            holder = self._own_expand(layer)
        extra += set_param(index, gi, holder, 0 if wiring.expand is not None else 1, stored, owner=node)
        self._edited()
        return extra, pending

    def _own_expand(self, layer: Layer):
        """The ``Expand`` of the layer's weight, made private to the layer if another node reads it."""
        index, node, gi, expand = self.index, layer.node.proto, layer.node.gi, layer.extra.expand
        if [u.node for u in index.visible_uses(gi, expand.output[0])] == [node]:
            return expand
        out = index.unique(f"{safe(expand.output[0])}_folded_{safe(node_label(node))}")
        base = f"{node_label(expand)}_{node_label(node)}"
        copy = new_node(index, "Expand", list(expand.input), [out], base, like=expand)
        index.insert_after(gi, expand, copy)
        index.set_input(gi, node, 1, out)
        return copy

    def remove_node(self, step: ChainStep, source: Any) -> bool:
        """Remove the step's node, keeping every downstream name: returns whether the step's output
        name lives on (now holding ``source``'s data); if not, its users read ``source``."""
        self._edited()
        self.index.remove_node(step.node.gi, step.node.proto)
        lives = self._take_name(source, step.output, step)
        self._edited()
        return lives

    def strip_affine(self, norm: Norm) -> None:
        self._edited()
        self._strip_affine(norm)
        self._edited()

    def drop_unused(self, values: list) -> None:
        """Nothing now: ``clean_up`` drops every initializer and Constant that nothing reads after the fold."""

    def _strip_affine(self, norm: Norm) -> None:
        """Make a LayerNorm-like node's affine the identity.  A required scale (and GroupNormalization's
        required bias) becomes a shared initializer of ones (zeros) of its dtype and shape; an optional
        bias input is dropped.  The old parameters are left to the clean-up if nothing else reads them."""
        index, p, gi = self.index, norm.node.proto, norm.node.gi
        _, w_slot, b_slot = NORM_AFFINES[p.op_type]
        for slot, fill in ((w_slot, 1.0), (b_slot, 0.0)):
            if slot is None or slot >= len(p.input) or not p.input[slot]:
                continue
            if slot == b_slot and p.op_type == "LayerNormalization":  # B is optional
                index.clear_input(gi, p, slot)
                continue
            c = self.const(self.value(gi, p.input[slot]))
            assert c is not None, f"internal: {p.input[slot]} was folded but is not a constant"
            key = (id(gi), c.elem_type, tuple(c.value.shape), fill)
            if key not in self._filled:
                base = f"{'ones' if fill else 'zeros'}_{'x'.join(map(str, c.value.shape))}"
                dtype = torch_dtype(c.elem_type, "the normalization's parameter")
                self._filled[key] = filled_initializer(index, gi, base, tuple(c.value.shape), dtype, fill)
            index.set_input(gi, p, slot, self._filled[key])

    def _take_name(self, source: Value, out: Value, step: ChainStep) -> bool:
        """Let ``out`` stand for ``source`` now that the step between them is gone.  Returns whether
        the name ``out`` lives on; if not, its users now read ``source``."""
        index, gi = self.index, step.node.gi
        found = gi.producer.get(source.name) if source.gi is gi else None
        others = index.visible_uses(source.gi, source.name)
        leaves = any(u.node is None for u in index.visible_uses(out.gi, out.name))
        shape_readers = all(
            u.node is not None and (reads_only_metadata(u.node) or reads_only_type(u.node, u.idx)) for u in others
        )
        if found is not None and (not others or (leaves and shape_readers)):
            # the producer writes ``out`` itself; whoever else read ``source`` read only its shape
            index.rename_output(gi, found[0], found[1], out.name)
            for use in others:
                index.set_input(use.gi, use.node, use.idx, out.name)
            return True
        if leaves:  # a graph output keeps its name: copy the source into it
            copy = new_node(index, "Identity", [source.name], [out.name], f"{node_label(step.node.proto)}_identity")
            index.insert_after(gi, step.node.proto, copy)
            return True
        for use in list(index.visible_uses(out.gi, out.name)):
            index.set_input(use.gi, use.node, use.idx, source.name)
        return False

    def add_bias(self, layer: Layer, value: Value, bias: torch.Tensor) -> None:
        """Make ``value`` hold ``value + bias`` (``bias`` shaped by the engine): its producer's result is
        renamed and an ``Add`` writes the original name."""
        index, gi = self.index, value.gi
        self._edited()
        base = node_label(layer.node.proto)
        name = add_initializer(index, gi, f"{base}_bias", bias)
        producer, slot = gi.producer[value.name]
        before = index.unique(f"{safe(value.name)}_unbiased")
        index.rename_output(gi, producer, slot, before)
        self._shape_names[before] = self._shape_names.get(value.name, value.name)
        index.tracker.gone.discard(value.name)  # the name lives on as the Add's output
        index.insert_after(gi, producer, new_node(index, "Add", [before, name], [value.name], f"{base}_bias_add"))
        self._edited()

    def lower_norm(self, norm: Norm, scale: torch.Tensor, shift: torch.Tensor) -> None:
        """Replace a BatchNormalization by ``Mul`` and ``Add`` with new initializers (shaped ``[C, 1, ...]``
        by the engine); the ``Add`` writes the BatchNormalization's output name."""
        index, p, gi = self.index, norm.node.proto, norm.node.gi
        self._edited()
        base = node_label(p)
        s_name = add_initializer(index, gi, f"{base}_lowered_scale", scale)
        t_name = add_initializer(index, gi, f"{base}_lowered_shift", shift)
        out = p.output[0]
        scaled = index.unique(f"{safe(out)}_scaled")
        mul = new_node(index, "Mul", [p.input[0], s_name], [scaled], f"{base}_lowered_mul")
        add = new_node(index, "Add", [scaled, t_name], [out], f"{base}_lowered_add")
        if index.opset < 7:  # before opset 7, a binary op broadcasts only when told to
            for node in (mul, add):
                node.attribute.append(onnx.helper.make_attribute("broadcast", 1))
        index.remove_node(gi, p)
        index.tracker.gone.discard(out)  # the name lives on as the Add's output
        index.insert_after(gi, p, mul)
        index.insert_after(gi, p, add)
        self._shape_names[scaled] = out
        self._edited()

    # ------------------------------------------------------------------ re-parameterization (engine/reparam.py)

    def conv_geometry(self, layer: Layer) -> ConvGeometry | str:
        return conv_geometry(layer, self.dims(layer.weight))

    def pool(self, node: Any) -> Pool | None:
        return parse_pool(self, node) if self.is_live(node) else None

    def inplace_sum(self, node: Any) -> Binary | None:
        return None  # ONNX has no in-place ops

    def inputs(self, node: Any) -> list:
        return [self.value(node.gi, name) for name in node.proto.input if name] if isinstance(node, Node) else []

    def bypass(self, old: Any, new: Any, nodes: list) -> None:
        """``nodes`` go; the producer of ``new`` then writes the name ``old`` when nothing else reads
        ``new`` (every reader and graph output keeps its name), else ``old``'s readers read ``new``."""
        index = self.index
        self._edited()
        for node in nodes:
            index.remove_node(node.gi, node.proto)
        found = new.gi.producer.get(new.name) if new.gi is old.gi else None
        if found is not None and not index.visible_uses(new.gi, new.name):
            index.rename_output(new.gi, found[0], found[1], old.name)
            index.tracker.gone.discard(old.name)  # the name lives on, written by the merged layer
        else:
            for use in list(index.visible_uses(old.gi, old.name)):
                if use.node is None:
                    copy = new_node(index, "Identity", [new.name], [old.name], f"{safe(old.name)}_identity")
                    index.insert_after(old.gi, found[0] if found else nodes[-1].proto, copy)
                else:
                    index.set_input(use.gi, use.node, use.idx, new.name)
        self._edited()


def _floating(c: Const) -> bool:
    """Whether ``c`` is a floating-point constant: its array's dtype, a streamed one's from its element type (the
    dtype :func:`.tensors.to_numpy` reads it as) without reading it."""
    try:
        dtype = c.stored.dtype if c.stored is not None else onnx.helper.tensor_dtype_to_np_dtype(c.elem_type)
    except KeyError:  # an element type onnx does not know: as read
        dtype = c.value.dtype
    return getattr(dtype, "kind", "") == "f" or dtype.name == "bfloat16"
