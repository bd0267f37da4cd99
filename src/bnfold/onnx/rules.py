"""The patterns: which nodes are layers a normalization folds into, and which
are normalizations (BatchNormalization, or Mul/Div/Add/Sub by a constant),
each turned into the fold math's terms (weight layout, ``Affine``).

Nothing here edits the graph; every function returns a value or a reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from onnx import NodeProto

from ..fold_math import Affine, FoldError, affine, batch_norm_affine, in_channels, out_channels
from .graph import Const, GraphInfo, ModelIndex
from .nodes import attr, is_onnx_op, label
from .shapes import Chan, Shapes
from .tensors import to_torch

LAYER_KINDS = {"Conv": "conv", "ConvTranspose": "conv_transpose", "Gemm": "linear", "MatMul": "linear"}
AFFINE_OPS = ("Mul", "Div", "Add", "Sub")
LAYERS_TEXT = "a Conv, ConvTranspose, Gemm or MatMul"


@dataclass
class Layer:
    """A Conv / ConvTranspose / Gemm / MatMul with constant weights, in fold-math terms."""

    node: NodeProto
    kind: str
    groups: int
    w: Const  # as stored
    w_math: np.ndarray  # in the fold math's layout (Gemm/MatMul weights as [out, in])
    transposed: bool  # stored as w_math.T
    b: Const | None  # Conv bias, Gemm C, or the constant of a MatMul's bias Add
    b_node: NodeProto | None  # the node whose input b_idx holds the bias
    b_idx: int
    out: str  # the layer's result (a MatMul's bias Add output when it has one)
    pre: Affine | None = None  # Gemm alpha and beta*C, as an affine after the bias-free product

    @property
    def op(self) -> str:
        return self.node.op_type

    @property
    def label(self) -> str:
        return label(self.node)

    @property
    def n_out(self) -> int:
        return out_channels(self.kind, self.w_math.shape, self.groups)

    @property
    def n_in(self) -> int:
        return in_channels(self.kind, self.w_math.shape, self.groups)


def layer_kind(node: NodeProto) -> str | None:
    return LAYER_KINDS.get(node.op_type) if is_onnx_op(node, *LAYER_KINDS) else None


def layer(index: ModelIndex, gi: GraphInfo, node: NodeProto, only) -> Layer | str | None:
    """``node`` as a layer with constant weights; None if it is no layer op, else a reason."""
    kind = layer_kind(node)
    if kind is None:
        return None
    name = f"{node.op_type} '{label(node)}'"
    if only is not None and kind not in only:
        return f"{name} is a {kind} layer, excluded by only={sorted(only)}"
    if len(node.input) < 2:
        return f"cannot fold into {name}: it has no weight input"
    w = index.constant(gi, node.input[1], "weight")
    if isinstance(w, str):
        return f"cannot fold into {name}: {w}"
    if node.op_type in ("Conv", "ConvTranspose"):
        b = None
        if len(node.input) > 2 and node.input[2]:
            b = index.constant(gi, node.input[2], "bias")
            if isinstance(b, str):
                return f"cannot fold into {name}: {b}"
        lay = Layer(node, kind, int(attr(node, "group", 1)), w, w.value, False, b, node, 2, node.output[0])
    elif node.op_type == "Gemm":
        if index.opset < 7:
            return f"cannot fold into {name}: Gemm before opset 7 (with the broadcast attribute) is not supported"
        if w.value.ndim != 2:
            return f"cannot fold into {name}: its weight has rank {w.value.ndim}"
        trans_b = int(attr(node, "transB", 0))
        w_math = w.value if trans_b else w.value.T
        b = None
        if len(node.input) > 2 and node.input[2]:
            b = index.constant(gi, node.input[2], "C")
            if isinstance(b, str):
                return f"cannot fold into {name}: {b}"
            shape = b.value.shape
            if b.value.ndim > 2 or (b.value.ndim == 2 and shape[0] != 1) or b.value.size not in (1, w_math.shape[0]):
                return f"cannot fold into {name}: its C has shape {list(shape)}, not a per-output-channel bias"
        lay = Layer(node, kind, 1, w, w_math, not trans_b, b, node, 2, node.output[0])
        try:
            c = None if b is None else to_torch(b.value).double().reshape(-1) * float(attr(node, "beta", 1.0))
            lay.pre = affine(float(attr(node, "alpha", 1.0)), c, w_math.shape[0])
        except FoldError as e:
            return f"cannot fold into {name}: {e}"
    else:  # MatMul
        if w.value.ndim != 2:
            return f"cannot fold into {name}: its weight has rank {w.value.ndim}; only a 2-D constant weight folds"
        lay = Layer(node, kind, 1, w, w.value.T, True, None, None, 1, node.output[0])
    try:
        lay.n_out  # noqa: B018 - validates groups against the weight shape
    except FoldError as e:
        return f"cannot fold into {name}: {e}"
    return lay


def matmul_out_chan(shapes: Shapes, node: NodeProto, n: int) -> Chan:
    r = shapes.rank(node.input[0])
    return Chan(None, -1, n) if r is None else Chan(r, r - 1, n)


def out_chan(lay: Layer, shapes: Shapes) -> Chan:
    if lay.op in ("Conv", "ConvTranspose"):
        return Chan(lay.w.value.ndim, 1, lay.n_out)
    if lay.op == "Gemm":
        return Chan(2, 1, lay.n_out)
    return matmul_out_chan(shapes, lay.node, lay.n_out)


def in_chan(lay: Layer, shapes: Shapes) -> Chan:
    if lay.op in ("Conv", "ConvTranspose"):
        return Chan(lay.w.value.ndim, 1, lay.n_in)
    if lay.op == "Gemm":
        return Chan(2, 0 if int(attr(lay.node, "transA", 0)) else 1, lay.n_in)
    r = shapes.rank(lay.node.input[0])
    return Chan(None, -1, lay.n_in) if r is None else Chan(r, r - 1, lay.n_in)


def zero_padding(node: NodeProto) -> bool:
    """Whether a Conv pads nothing, so an input shift folds exactly."""
    auto_pad = attr(node, "auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        k = attr(node, "kernel_shape")
        return k is not None and all(int(v) == 1 for v in k)
    return all(int(p) == 0 for p in attr(node, "pads", []) or [])


# ------------------------------------------------------------------ MatMul bias
def bias_add(index: ModelIndex, gi: GraphInfo, mm: NodeProto, shapes: Shapes) -> tuple[NodeProto, Const, int] | None:
    """The Add right after a MatMul that acts as its bias (per-output-channel constant)."""
    user, _ = index.sole_user(gi, mm.output[0])
    if user is None or not is_onnx_op(user, "Add") or len(user.input) != 2:
        return None
    d = list(user.input).index(mm.output[0])
    c = index.constant(gi, user.input[1 - d], "bias")
    if isinstance(c, str) or not isinstance(index.constant(gi, user.input[d], "x"), str):
        return None
    w = index.constant(gi, mm.input[1], "weight") if len(mm.input) > 1 else "no weight"
    if isinstance(w, str) or w.value.ndim != 2:
        return None
    if per_channel(c.value.shape, matmul_out_chan(shapes, mm, w.value.shape[1]), "bias") is not None:
        return None
    return user, c, 1 - d


def with_bias(index: ModelIndex, gi: GraphInfo, lay: Layer, shapes: Shapes) -> Layer:
    """A MatMul layer together with its bias Add, when it has one."""
    if lay.op != "MatMul":
        return lay
    found = bias_add(index, gi, lay.node, shapes)
    if found is not None:
        lay.b_node, lay.b, lay.b_idx = found
        lay.out = lay.b_node.output[0]
    return lay


def is_matmul_bias(index: ModelIndex, gi: GraphInfo, node: NodeProto, shapes: Shapes) -> bool:
    if not is_onnx_op(node, "Add"):
        return False
    for name in node.input:
        p = index.producer(gi, name)
        if p is not None and is_onnx_op(p, "MatMul"):
            found = bias_add(index, gi, p, shapes)
            if found is not None and found[0] is node:
                return True
    return False


# ------------------------------------------------------------------- affines
def per_channel(shape, chan: Chan, what: str) -> str | None:
    """None if a constant of ``shape`` broadcasts along the channel axis alone, else why not."""
    shape = tuple(int(d) for d in shape)
    if chan.rank is None:
        if len(shape) > 1:
            return f"{what} has shape {list(shape)} and the rank of the data is unknown"
        if shape and shape[0] not in (1, chan.channels):
            return f"{what} has {shape[0]} elements, expected 1 or {chan.channels} channels"
        return None
    if len(shape) > chan.rank:
        return f"{what} has shape {list(shape)}, which broadcasts the rank-{chan.rank} data to a higher rank"
    for j, d in enumerate(shape):
        axis = chan.rank - len(shape) + j
        if axis == chan.axis:
            if d not in (1, chan.channels):
                return f"{what} has {d} elements along the channel axis, expected 1 or {chan.channels}"
        elif d != 1:
            return (f"{what} has shape {list(shape)}, which does not broadcast along "
                    f"the channel axis ({chan.axis}) alone")
    return None


@dataclass
class AffineOp:
    """``Mul``/``Div``/``Add``/``Sub`` with one constant input; ``data`` is the other input's index."""

    node: NodeProto
    data: int
    const: Const

    @property
    def data_name(self) -> str:
        return self.node.input[self.data]


def affine_op(index: ModelIndex, gi: GraphInfo, node: NodeProto) -> AffineOp | None:
    if node is None or not is_onnx_op(node, *AFFINE_OPS) or len(node.input) != 2 or len(node.output) != 1:
        return None
    consts = [index.constant(gi, n, "input") for n in node.input]
    is_const = [not isinstance(c, str) for c in consts]
    if is_const[0] == is_const[1]:
        return None
    data = 1 if is_const[0] else 0
    if node.op_type == "Div" and data == 1:
        return None  # c / x is not affine
    c = consts[1 - data]
    if c.value.dtype.kind != "f" and c.value.dtype.name != "bfloat16":
        return None
    return AffineOp(node, data, c)


def op_affine(op: AffineOp, chan: Chan) -> Affine | str:
    what = f"the constant of {op.node.op_type} '{label(op.node)}'"
    why = per_channel(op.const.value.shape, chan, what)
    if why is not None:
        return why
    v = to_torch(op.const.value).double().reshape(-1)
    n, t = chan.channels, op.node.op_type
    try:
        if t == "Mul":
            return affine(v, None, n)
        if t == "Div":
            return affine(torch.reciprocal(v), None, n)
        if t == "Add":
            return affine(None, v, n)
        return affine(None, -v, n) if op.data == 0 else affine(-1.0, v, n)
    except FoldError as e:
        return f"{what}: {e}"


def compose(affs: list[Affine]) -> Affine:
    out = affs[0]
    for a in affs[1:]:
        out = out.then(a)
    return out


# ------------------------------------------------------------- BatchNormalization
@dataclass
class BNParams:
    scale: Const
    bias: Const
    mean: Const
    var: Const
    eps: float
    spatial: int


def bn_params(index: ModelIndex, gi: GraphInfo, node: NodeProto) -> BNParams | str:
    """The BN's constant parameters, or why it cannot fold wherever it is."""
    if index.opset < 7 and attr(node, "is_test", 0) == 0:
        return "is_test=0: the BatchNormalization runs in training mode"
    if int(attr(node, "training_mode", 0)) == 1:
        return "training_mode=1: the BatchNormalization uses batch statistics computed at run time"
    for extra in list(node.output)[1:]:
        if extra and index.visible_uses(gi, extra):
            return f"its running-statistics output '{extra}' is used (training mode)"
    if len(node.input) != 5:
        return f"BatchNormalization has {len(node.input)} inputs, expected 5"
    consts = []
    for i, what in zip(range(1, 5), ("scale", "B", "input_mean", "input_var")):
        c = index.constant(gi, node.input[i], what)
        if isinstance(c, str):
            return c
        consts.append(c)
    spatial = int(attr(node, "spatial", 1)) if index.opset < 9 else 1
    return BNParams(*consts, float(attr(node, "epsilon", 1e-5)), spatial)


def bn_affine(p: BNParams, chan: Chan, where: str) -> Affine | str:
    if chan.rank is None:
        return f"BatchNormalization normalizes axis 1, and the rank of {where} is unknown"
    if chan.axis != 1:
        return f"BatchNormalization normalizes axis 1, but the channels of {where} are on axis {chan.axis}"
    if p.spatial == 0:
        for c in (p.scale, p.bias, p.mean, p.var):
            s = c.value.shape
            per_ch = (len(s) == chan.rank - 1 and s[0] == chan.channels and all(d == 1 for d in s[1:])) or (
                chan.rank == 2 and s == (chan.channels,)
            )
            if not per_ch:
                return f"spatial=0 with statistics of shape {list(s)}: they are not per-channel"
    try:
        return batch_norm_affine(
            to_torch(p.mean.value), to_torch(p.var.value), p.eps, to_torch(p.scale.value), to_torch(p.bias.value)
        )
    except FoldError as e:
        return str(e)
