"""The graph edits of one fold: compute the folded parameters (through
``bnfold.fold_math``), write them back as initializers in the layer's dtype,
and take the normalization nodes out.

Every cast happens before the first edit, so a fold that fails leaves the
graph as it was.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import onnx
import torch
from onnx import NodeProto

from ..fold_math import Affine, affine, cast_checked, fold_input_affine, fold_output_affine
from .graph import GraphInfo, ModelIndex
from .nodes import label, remove_attr
from .rules import Layer, zero_padding
from .shapes import Chan
from .tensors import from_torch, nbytes, to_torch, torch_dtype


@dataclass
class NewParams:
    weight: torch.Tensor  # in the stored layout and dtype
    bias: torch.Tensor | None  # None: leave the bias as it is (absent and all zero)
    bias_type: int


def _bias_vector(lay: Layer) -> torch.Tensor | None:
    if lay.b is None or lay.pre is not None:
        return None  # a Gemm's C is part of ``pre``
    return affine(None, to_torch(lay.b.value), lay.n_out).shift


def output_params(lay: Layer, aff: Affine) -> NewParams:
    """``layer(x) * scale + shift`` folded into the layer.  Raises FoldError."""
    if lay.pre is not None:
        aff = lay.pre.then(aff)
    w64, b64 = fold_output_affine(to_torch(lay.w_math), _bias_vector(lay), aff, lay.kind, lay.groups)
    return _cast(lay, w64, b64)


def input_params(lay: Layer, aff: Affine) -> NewParams:
    """``layer(x * scale + shift)`` folded into the layer.  Raises FoldError."""
    exact = zero_padding(lay.node) if lay.op == "Conv" else True
    w64, b64 = fold_input_affine(to_torch(lay.w_math), _bias_vector(lay), aff, lay.kind, lay.groups, shift_exact=exact)
    if lay.pre is not None:
        w64, b64 = fold_output_affine(w64, b64, lay.pre, "linear")
    return _cast(lay, w64, b64)


def _cast(lay: Layer, w64: torch.Tensor, b64: torch.Tensor) -> NewParams:
    w = cast_checked(w64, torch_dtype(lay.w.elem_type, f"the weight of {lay.label}"), f"weight of {lay.label}")
    if lay.transposed:
        w = w.T
    b_type = lay.b.elem_type if lay.b is not None else lay.w.elem_type
    needed = lay.b is not None or bool((b64 != 0).any())
    b = cast_checked(b64, torch_dtype(b_type, f"the bias of {lay.label}"), f"bias of {lay.label}") if needed else None
    return NewParams(w, b, b_type)


def _safe(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.:/-]+", "_", s).strip("_") or "node"


def set_param(index: ModelIndex, gi: GraphInfo, node: NodeProto, idx: int, value: torch.Tensor, elem_type: int) -> int:
    """Make ``node.input[idx]`` hold ``value``; returns the bytes of a private copy, if one was needed.

    A parameter only this node uses is overwritten under its own name (a
    Constant node becomes an initializer of the same name).  A shared one gets
    a private copy named ``<name>_folded_<node>``; the others keep the original.
    """
    old = node.input[idx] if idx < len(node.input) else ""
    extra = 0
    if old:
        c = index.constant(gi, old, "parameter")
        assert not isinstance(c, str), c
        uses = index.live_uses(c.gi, old)
        others = [u for u in uses if not (u.node is node and u.idx == idx)]
        if not others and c.gi is gi:
            t = from_torch(value, old, elem_type)
            if c.node is None:
                index.replace_initializer(gi, t)
            else:
                index.remove_node(gi, c.node)
                index.add_initializer(gi, t)
                if tuple(c.value.shape) != tuple(t.dims):
                    index.forget_shape(gi, old)
            index.tracker.touched.discard(old)
            return 0
        new = index.unique(f"{_safe(old)}_folded_{_safe(label(node))}")
        t = from_torch(value, new, elem_type)
        if others:
            extra = nbytes(t)
    else:
        new = index.unique(f"{_safe(label(node))}_bias")
        t = from_torch(value, new, elem_type)
    index.add_initializer(gi, t)
    index.set_input(gi, node, idx, new)
    return extra


def write_params(index: ModelIndex, gi: GraphInfo, lay: Layer, p: NewParams) -> tuple[int, torch.Tensor | None]:
    """Store the folded weight and bias.  Returns the extra bytes and, for a
    MatMul without a bias Add, the bias still to be added (None if not needed).

    The bias goes first: an exporter may compute a zero bias from the weight's
    shape, and once that bias is replaced the weight is no longer shared.
    """
    extra, pending = 0, None
    if lay.op == "Gemm":
        remove_attr(lay.node, "alpha")
        remove_attr(lay.node, "beta")
    if p.bias is not None:
        if lay.b_node is None:  # MatMul without a bias Add
            pending = p.bias
        else:
            keep = lay.b is not None and lay.b.value.size == p.bias.numel()
            shape = lay.b.value.shape if keep else (p.bias.numel(),)
            extra += set_param(index, gi, lay.b_node, lay.b_idx, p.bias.reshape(shape), p.bias_type)
    extra += set_param(index, gi, lay.node, 1, p.weight, lay.w.elem_type)
    return extra, pending


def add_bias_node(index: ModelIndex, gi: GraphInfo, anchor: NodeProto, src: str, dst: str, bias: torch.Tensor,
                  elem_type: int, chan: Chan, base: str) -> None:
    """Insert ``dst = Add(src, bias)`` after ``anchor``, the bias along ``chan``'s axis."""
    shape = [chan.channels]
    if chan.rank is not None:
        shape += [1] * (chan.rank - 1 - chan.axis)
    name = index.unique(f"{_safe(base)}_bias")
    index.add_initializer(gi, from_torch(bias.reshape(shape), name, elem_type))
    node = onnx.helper.make_node("Add", [src, name], [dst], name=index.unique_node_name(f"{_safe(base)}_bias_add"))
    index.insert_after(gi, anchor, node)
