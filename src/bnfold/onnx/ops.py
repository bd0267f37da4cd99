"""Op tables for ONNX, and how a node of each kind reads as the engine's terms.

Layers (``Conv``, ``ConvTranspose``, ``Gemm``, ``MatMul`` with a constant
weight and its bias ``Add``), ``BatchNormalization``, the normalizations whose
elementwise affine alone folds (``LayerNormalization``, ``GroupNormalization``,
``RMSNormalization``), the normalizations read only as plain (``InstanceNormalization``
with scale 1 and bias 0: the affine, if any, follows as elementwise ops), the
elementwise binary ops and the shape-only hops are table rows here.  Supporting another op type
is one entry; the engine never looks at op types.  Only the default ONNX
domain is read.

The parsers take the adapter (``OnnxGraph``) to look values up; they decide
nothing about folding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from onnx import NodeProto

from ..engine.chain import per_channel
from ..engine.graph import Binary, Hop, Layer, Norm
from ..engine.optable import Op
from ..report import CONSTANT_NORM_REASON, Code
from .consts import CONST_OPS
from .handles import Node
from .nodes import attr, is_onnx_op

#: Every op type bnfold reads (default ONNX domain only).  Supporting another spelling is one row.
OPS: dict[str, Op] = {
    "Conv": Op("layer", "conv"),
    "ConvTranspose": Op("layer", "conv_transpose"),
    "Gemm": Op("layer", "linear"),
    "MatMul": Op("layer", "linear"),
    "BatchNormalization": Op("norm", "batch_norm", "same"),
    "LayerNormalization": Op("norm", "layer_norm", "same", affine=(-1, 1, 2)),
    "RMSNormalization": Op("norm", "rms_norm", "same", affine=(-1, 1, None)),
    "GroupNormalization": Op("norm", "group_norm", "same", affine=(1, 1, 2)),
    # a GroupNorm with one channel per group; the dynamo exporter writes GroupNorm(G) as Reshape to G groups,
    # this with scale 1 and bias 0, Reshape back, then the affine as Mul and Add (``engine.spelled``)
    "InstanceNormalization": Op("plain_norm", "group_norm", "same", affine=(1, 1, 2)),
    "Mul": Op("binary", "mul", "broadcast"),
    "Div": Op("binary", "div", "broadcast"),
    "Add": Op("binary", "add", "broadcast"),
    "Sub": Op("binary", "sub", "broadcast"),
    "Sum": Op("binary", "add", "broadcast"),  # of two inputs (parse_binary); Caffe converters write adds so
    "Identity": Op("hop", "identity", "same"),
    "Dropout": Op("hop", "identity", "same"),  # a hop only when not training (dropout_training)
    "Transpose": Op("hop", "permute", "permuted"),
    "Unsqueeze": Op("hop", "unsqueeze"),
    "Squeeze": Op("hop", "squeeze"),
    "Reshape": Op("hop", "reshape"),
    "Flatten": Op("hop", "flatten"),
    # along axes other than the channel's: a per-channel affine commutes with picking, slicing or
    # averaging there; with a maximum only when its scale is >= 0 (monotone, checked by the engine)
    "Gather": Op("hop", "gather"),  # of one index or a 1-D list of them (axes.py)
    "Slice": Op("hop", "slice", "permuted"),
    "ReduceMean": Op("hop", "reduce"),
    "GlobalAveragePool": Op("hop", "spatial", "permuted"),
    "ReduceMax": Op("hop", "reduce", monotone=True),
    "MaxPool": Op("hop", "spatial", "permuted", monotone=True),  # while nothing reads its Indices
    "GlobalMaxPool": Op("hop", "spatial", "permuted", monotone=True),
    "AveragePool": Op("pool", "avg_pool", "permuted"),  # a conv kernel to re-parameterization (geometry.py)
    "Shape": Op("metadata"),
    "Size": Op("metadata"),
    "Relu": Op("elementwise", shape="same"),
    "CastLike": Op("elementwise", shape="same", type_only=(1,)),  # (x, like): only like's dtype is read
}


#: What the numerics read (``Op.rounding`` / ``layer`` / ``fp16``, see ``engine.optable.Op``): ops whose
#: output holds only values of their inputs (``same``: rearranged; a Resize only in ``nearest`` mode), the
#: layers' kinds, and the ops ONNX Runtime keeps in fp16 in a float16 model.
_NUMERICS = {
    **{k: {"rounding": "same"} for k in "Reshape Transpose Squeeze Unsqueeze Flatten Identity Dropout".split()},
    **{
        k: {"rounding": "exact"}
        for k in (
            "Slice Concat Gather Expand MaxPool GlobalMaxPool ReduceMax ReduceMin Relu Neg Abs Max Min Resize Shape "
            "Split Tile Pad Where DepthToSpace SpaceToDepth GatherElements GatherND"
        ).split()
    },
    "Conv": {"layer": "conv"},
    "ConvTranspose": {"layer": "conv_transpose"},
    "Gemm": {"layer": "linear"},
    "MatMul": {"layer": "matmul"},
    "Softmax": {"fp16": "softmax"},
    "ReduceSum": {"accumulate": "sum"},
    "ReduceMean": {"accumulate": "mean"},
    "GlobalAveragePool": {"accumulate": "mean"},
    "AveragePool": {"accumulate": "pool"},
}
for _k in "Reshape Transpose Slice Squeeze Unsqueeze Concat Flatten Gather Expand".split():
    _NUMERICS[_k] = dict(_NUMERICS.get(_k, {}), fp16="movement")
#: The shape of the output of the elementwise ops and the reductions (``Op.shape``): the audit's run-time check
#: bounds their outputs' size by it (``io.run_checks.shape_bound``), and the axis rules read it
_SHAPES = {
    **dict.fromkeys(
        "Neg Abs Sign Reciprocal Sqrt Exp Log Floor Ceil Round Erf Sin Cos Tan Asin Acos Atan Sinh Cosh Sigmoid Tanh "
        "Softplus Softsign Mish HardSwish HardSigmoid LeakyRelu ThresholdedRelu Selu Elu Celu Gelu Clip Cast Not IsNaN "
        "IsInf Softmax LogSoftmax".split(),
        "same",
    ),
    **dict.fromkeys(
        "Mean Max Min PRelu Where Equal Less LessOrEqual Greater GreaterOrEqual And Or Xor Mod Pow".split(), "broadcast"
    ),
    **dict.fromkeys(
        "ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp "
        "ReduceSumSquare ArgMax ArgMin".split(),
        "reduced",
    ),
}
for _k, _shape in _SHAPES.items():
    _NUMERICS[_k] = dict(_NUMERICS.get(_k, {}), shape=_shape)
#: What the fp16 range rewrite reads (``Op.range`` / ``degree``, see ``engine.optable.Op``); a ``power`` op's
#: degree (None: its constant exponent input).  A Pad with a nonzero constant value is no homogeneous op
#: (``bnfold.onnx.range``).
RANGE_FACTS = {
    "homogeneous": (
        "Identity Dropout Transpose Unsqueeze Squeeze Reshape Flatten Gather GatherElements GatherND Slice Expand "
        "Tile Split DepthToSpace SpaceToDepth Relu LeakyRelu PRelu Neg Abs ReduceMean ReduceSum ReduceMax ReduceMin "
        "CumSum GlobalAveragePool GlobalMaxPool MaxPool AveragePool Resize Upsample Pad"
    ),
    "sum": "Add Sub Sum Concat",
    "product": "Mul MatMul",
    "quotient": "Div",
    "power": "Pow Sqrt Reciprocal",
    "invariant": "LayerNormalization GroupNormalization InstanceNormalization RMSNormalization",
}
POWER_DEGREES = {"Sqrt": 0.5, "Reciprocal": -1.0, "Pow": None}
for _fact, _names in RANGE_FACTS.items():
    for _k in _names.split():
        _NUMERICS[_k] = dict(_NUMERICS.get(_k, {}), range=_fact, degree=POWER_DEGREES.get(_k))
for _k, _facts in _NUMERICS.items():
    OPS[_k] = replace(OPS.get(_k, Op("numeric")), **_facts)


def op_of(node: NodeProto) -> Op | None:
    """The row of ``node``'s op type, or None (another domain, or an op bnfold does not read)."""
    return OPS.get(node.op_type) if node.domain in ("", "ai.onnx") else None


def _having(role: str) -> dict[str, Op]:
    return {name: op for name, op in OPS.items() if op.role == role}


# Views of ``OPS`` by role (read-only; add rows to ``OPS``).
#: Layer op types -> their ``bnfold.kinds.LAYER_KINDS`` kind.
LAYER_OPS = {name: op.kind for name, op in _having("layer").items()}
#: Elementwise binary ops -> the name of their row in ``fold_math.BINARY_AFFINES``.
BINARY_OPS = {name: op.kind for name, op in _having("binary").items()}
#: Shape-only hops -> the axis rule that follows the channel axis through them.
HOPS = {name: op.kind for name, op in _having("hop").items()}
#: Average pools (re-parameterization reads one as a conv kernel: ``geometry.parse_pool``).
AVG_POOLS = tuple(_having("pool"))
#: Ops that read only the shape of their input.
METADATA_READERS = tuple(_having("metadata"))
#: Ops with inputs that give only a type -> those input slots: a reader through them is no user for a
#: fold (``CastLike(0, x)``, how the dynamo exporter writes a bias-less conv's zero bias).
TYPE_ONLY_INPUTS = {name: op.type_only for name, op in OPS.items() if op.type_only}
#: Normalization op types -> their ``bnfold.kinds.NORM_KINDS`` kind.
NORM_OPS = {name: op.kind for name, op in _having("norm").items()}
NORMS = tuple(NORM_OPS)
#: Normalizations whose statistics stay and whose elementwise affine (scale, bias) may fold into the
#: layers they feed: op type -> (the affine's axis, its scale and bias input slots; None: no bias input).
NORM_AFFINES = {name: op.affine for name, op in _having("norm").items() if op.affine is not None}
#: Normalizations that are plain (no affine of their own) when their scale and bias are the identity:
#: the affine ones above, and those read only so (role ``plain_norm``) -> (axis, scale slot, bias slot).
PLAIN_NORMS = {**NORM_AFFINES, **{name: op.affine for name, op in _having("plain_norm").items()}}


@dataclass
class LayerWiring:
    """How a layer node holds its weight and bias (``extra`` of its Layer).

    ``transposed``: the weight is stored ``[in, out]``, the transpose of the
    fold-math layout (Gemm with ``transB=0``, MatMul).  ``expand``: the
    ``Expand`` that broadcasts a MatMul's 2-D weight over a batch (the weight
    is its input).  ``bias_node``/``bias_slot``: the node and input index that
    hold the bias (the layer itself, or a MatMul's bias ``Add``); ``bias_node``
    None: there is no place for a bias (a MatMul without ``Add``).
    """

    transposed: bool = False
    expand: NodeProto | None = None
    bias_node: NodeProto | None = None
    bias_slot: int = 2


def reads_only_metadata(node: NodeProto) -> bool:
    row = op_of(node)
    return row is not None and row.role == "metadata"


def reads_only_type(node: NodeProto, idx: int) -> bool:
    """Whether ``node`` reads only the dtype of its input ``idx``."""
    row = op_of(node)
    return row is not None and idx in row.type_only


# --------------------------------------------------------------------------- layers


def zero_padding(node: NodeProto) -> bool:
    """Whether a Conv pads nothing, so an input shift folds exactly."""
    auto_pad = attr(node, "auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        k = attr(node, "kernel_shape")
        return k is not None and all(int(v) == 1 for v in k)
    return all(int(p) == 0 for p in attr(node, "pads", []) or [])


def _conv(graph: Any, node: Node, kind: str) -> Layer | None:
    p = node.proto
    if len(p.input) < 2 or not p.input[1]:
        return None
    v = graph.value
    bias = v(node.gi, p.input[2]) if len(p.input) > 2 and p.input[2] else None
    return Layer(
        node,
        kind,
        p.op_type,
        v(node.gi, p.input[0]),
        v(node.gi, p.output[0]),
        v(node.gi, p.input[1]),
        bias,
        int(attr(p, "group", 1)),
        zero_padding(p),
        extra=LayerWiring(bias_node=p, bias_slot=2),
    )


def _gemm(graph: Any, node: Node, kind: str) -> Layer | None:
    p = node.proto
    if len(p.input) < 2 or not p.input[1]:
        return None
    v = graph.value
    bias = v(node.gi, p.input[2]) if len(p.input) > 2 and p.input[2] else None
    wiring = LayerWiring(transposed=not int(attr(p, "transB", 0)), bias_node=p, bias_slot=2)
    in_axis = 0 if int(attr(p, "transA", 0)) else 1
    return Layer(
        node,
        kind,
        p.op_type,
        v(node.gi, p.input[0]),
        v(node.gi, p.output[0]),
        v(node.gi, p.input[1]),
        bias,
        in_axis=in_axis,
        out_axis=1,
        extra=wiring,
    )


def _matmul(graph: Any, node: Node, kind: str) -> Layer | None:
    """``x @ W`` with ``W`` a constant (or a 2-D graph input, reported as not constant),
    possibly broadcast over a batch by ``Expand``; ``x @ y`` of two computed values is no layer."""
    p = node.proto
    if len(p.input) != 2 or not p.input[0] or not p.input[1]:
        return None
    gi, v = node.gi, graph.value
    mat = v(gi, p.input[1])
    wiring = LayerWiring(transposed=True)
    source = graph.producer(mat)
    if source is not None and _broadcasts_matrix(graph, source):
        weight, wiring.expand = v(gi, source.proto.input[0]), source.proto
    elif graph.is_const(mat) or (graph.is_parameter(mat) and graph.shape_info(mat).rank == 2):
        weight = mat
    else:
        return None
    out = v(gi, p.output[0])
    layer = Layer(
        node,
        kind,
        p.op_type,
        v(gi, p.input[0]),
        out,
        weight,
        None,
        in_axis=-1,
        out_axis=-1,
        takes_bias=False,
        extra=wiring,
    )
    add = _bias_add(graph, out, graph.dims(weight))
    if add is not None:
        wiring.bias_node, wiring.bias_slot = add.proto, 1 - list(add.proto.input).index(out.name)
        layer.output, layer.bias = v(gi, add.proto.output[0]), v(gi, add.proto.input[wiring.bias_slot])
        layer.takes_bias = True
    return layer


def _broadcasts_matrix(graph: Any, node: Node) -> bool:
    """Whether ``node`` is an ``Expand`` of a 2-D constant that only adds leading (batch) dims."""
    p = node.proto
    if not is_onnx_op(p, "Expand") or len(p.input) != 2:
        return False
    source = graph.value(node.gi, p.input[0])
    dims = graph.dims(source) if graph.is_const(source) else None
    if dims is None or len(dims) != 2:
        return False
    out = graph.shape_info(graph.value(node.gi, p.output[0])).shape
    if out is not None and len(out) < 2:
        return False
    ends = out[-2:] if out is not None else (None, None)
    # the matrix keeps its two dims: each is known to stay, or is not 1 (which could be broadcast)
    return all(o == d if isinstance(o, int) else d != 1 for o, d in zip(ends, dims, strict=True))


def _bias_add(graph: Any, out: Any, weight_dims: list | None) -> Node | None:
    """The ``Add`` of a per-output-channel constant that alone reads a MatMul's result: its bias."""
    users = graph.users(out)
    if weight_dims is None or len(weight_dims) != 2 or len(users) != 1 or users[0] is None:
        return None
    add = users[0]
    p = add.proto
    if not is_onnx_op(p, "Add") or len(p.input) != 2 or len(p.output) != 1 or p.input[0] == p.input[1]:
        return None
    other = graph.value(add.gi, p.input[1 - list(p.input).index(out.name)])
    if not graph.is_constant(other):
        return None
    # its shape alone tells (a streamed constant is not read): as ``constant(other)`` would be, in ``meta``
    const = torch.empty(graph.const(other).shape, dtype=torch.float64, device="meta")
    rank = graph.shape_info(out).rank
    vec = per_channel(const, rank, -1 if rank is None else rank - 1, int(weight_dims[1]))
    return None if isinstance(vec, str) else add


LAYERS: dict[str, Callable[[Any, Node, str], Layer | None]] = {
    "Conv": _conv,
    "ConvTranspose": _conv,
    "Gemm": _gemm,
    "MatMul": _matmul,
}


def parse_layer(graph: Any, node: Node) -> Layer | None:
    """``node`` as a layer (conv / transposed conv / linear), or None."""
    p = node.proto
    if not is_onnx_op(p, *LAYER_OPS) or not p.input or not p.input[0] or not p.output or not p.output[0]:
        return None
    return LAYERS[p.op_type](graph, node, LAYER_OPS[p.op_type])


def is_bias_add(graph: Any, node: Node) -> bool:
    """Whether ``node`` is the bias ``Add`` of a MatMul layer (part of the layer, not an affine op)."""
    p = node.proto
    if not is_onnx_op(p, "Add"):
        return False
    for name in p.input:
        source = graph.producer(graph.value(node.gi, name))
        if source is not None and is_onnx_op(source.proto, "MatMul"):
            layer = parse_layer(graph, source)
            if layer is not None and layer.extra.bias_node is p:
                return True
    return False


# --------------------------------------------------------------------------- normalizations


def _norm_problem(graph: Any, p: NodeProto, stats: list) -> tuple[str, Code]:
    """Why a BatchNormalization can never fold (and its code), or ``("", ...)``."""
    if graph.index.opset < 7 and attr(p, "is_test", 0) == 0:
        return "is_test=0: the BatchNormalization runs in training mode", Code.TRAINING_MODE
    if int(attr(p, "training_mode", 0)) == 1:
        return "training_mode=1: the BatchNormalization uses batch statistics computed at run time", Code.TRAINING_MODE
    if len(p.input) != 5 or not all(p.input):
        return f"BatchNormalization has {len(p.input)} inputs, expected 5", Code.UNSUPPORTED_NORM
    if graph.index.opset < 9 and int(attr(p, "spatial", 1)) == 0:  # statistics per element, not per channel
        for value in stats:
            dims = graph.dims(value)
            if dims is not None and any(d != 1 for d in dims[1:]):
                return (
                    f"spatial=0 with statistics of shape {list(dims)}: they are not per-channel",
                    Code.NOT_PER_CHANNEL,
                )
    return "", Code.UNSUPPORTED_NORM


def parse_norm(graph: Any, node: Node) -> Norm | None:
    """``node`` as a normalization: a BatchNormalization, or a LayerNorm-like node while it still has an affine."""
    p = node.proto
    if not is_onnx_op(p, *NORMS) or not p.input or not p.input[0]:
        return None
    if p.op_type in NORM_AFFINES:
        return _parse_norm_affine(graph, node)
    gi, v = node.gi, graph.value
    stats = [v(gi, p.input[i]) if len(p.input) > i and p.input[i] else None for i in range(1, 5)]
    out = v(gi, p.output[0]) if p.output and p.output[0] else None
    norm = Norm(node, v(gi, p.input[0]), out, *stats, float(attr(p, "epsilon", 1e-5)), op=p.op_type)
    norm.problem, norm.problem_code = _norm_problem(graph, p, [s for s in stats if s is not None])
    constant_ok = not norm.problem or norm.problem_code == Code.TRAINING_MODE  # batch statistics of a weight
    if constant_ok and normalizes_constant(graph, node):
        norm.problem, norm.problem_code = CONSTANT_NORM_REASON, Code.CONSTANT_NORM
    norm.statistics_used = any(name and graph.index.visible_uses(gi, name) for name in p.output[1:])
    return norm


def normalizes_constant(graph: Any, node: Node) -> bool:
    """Whether the data input of the normalization ``node`` is a constant (weight standardization:
    the batch statistics of a weight).  Evaluated only when an initializer, a ``Constant`` or a
    constant-computing op gives it."""
    x = graph.value(node.gi, node.proto.input[0])
    source = graph.producer(x)
    if source is not None and not is_onnx_op(source.proto, "Constant", *CONST_OPS):
        return False
    return graph.is_const(x)


def _parse_norm_affine(graph: Any, node: Node) -> Norm | None:
    """A LayerNormalization / RMSNormalization / GroupNormalization as an affine-only norm (its
    normalization stays); None once its affine is the identity (a scale of ones, no or a zero bias)."""
    p = node.proto
    gi, v = node.gi, graph.value
    axis, w_slot, b_slot = NORM_AFFINES[p.op_type]
    weight = v(gi, p.input[w_slot]) if len(p.input) > w_slot and p.input[w_slot] else None
    bias = v(gi, p.input[b_slot]) if b_slot is not None and len(p.input) > b_slot and p.input[b_slot] else None
    if _is_identity(graph, weight, 1.0) and _is_identity(graph, bias, 0.0):
        return None
    out = v(gi, p.output[0]) if p.output and p.output[0] else None
    norm = _affine_norm(node, v(gi, p.input[0]), out, weight, bias, axis, NORM_OPS[p.op_type])
    norm.statistics_used = any(name and graph.index.visible_uses(gi, name) for name in p.output[1:])
    norm.problem, norm.problem_code = _affine_problem(graph, p, norm)
    return norm


def parse_plain_norm(graph: Any, node: Node) -> Norm | None:
    """``node`` as a plain normalization: one whose scale and bias are absent or the identity (its
    statistics alone; an affine, if any, follows as elementwise ops: ``bnfold.engine.spelled``), or None."""
    p = node.proto
    if not is_onnx_op(p, *PLAIN_NORMS) or not p.input or not p.input[0] or not p.output or not p.output[0]:
        return None
    gi, v = node.gi, graph.value
    axis, w_slot, b_slot = PLAIN_NORMS[p.op_type]
    weight = v(gi, p.input[w_slot]) if len(p.input) > w_slot and p.input[w_slot] else None
    bias = v(gi, p.input[b_slot]) if b_slot is not None and len(p.input) > b_slot and p.input[b_slot] else None
    if not (_is_identity(graph, weight, 1.0) and _is_identity(graph, bias, 0.0)):
        return None
    if any(name and graph.index.visible_uses(gi, name) for name in p.output[1:]):
        return None  # its saved statistics are read
    return _affine_norm(node, v(gi, p.input[0]), v(gi, p.output[0]), None, None, axis, op_of(p).kind)


def _affine_norm(node: Node, x: Any, out: Any, weight: Any, bias: Any, axis: Any, kind: str) -> Norm:
    """A normalization whose statistics the data gives (no running statistics): its affine is what folds."""
    p = node.proto
    eps = float(attr(p, "epsilon", 1e-5))
    return Norm(node, x, out, weight, bias, None, None, eps, axis=axis, op=p.op_type, affine_only=True, kind=kind)


def _is_identity(graph: Any, value: Any, neutral: float) -> bool:
    """Whether ``value`` is absent or a constant whose every element is ``neutral``."""
    if value is None:
        return True
    t = graph.constant(value)
    return t is not None and bool((t == neutral).all())


def _affine_problem(graph: Any, p: NodeProto, norm: Norm) -> tuple[str, Code]:
    """Why the affine of a LayerNorm-like node is not per-channel (and its code), or ``("", ...)``."""
    rank = graph.shape_info(norm.input).rank
    if p.op_type != "GroupNormalization":
        axis = int(attr(p, "axis", -1))
        if axis == -1 or (rank is not None and axis % rank == rank - 1):
            return "", Code.NOT_PER_CHANNEL
        if rank is None:
            return (
                f"it normalizes from axis {axis} and the rank of its input is unknown, so its affine may "
                "not be per-channel",
                Code.RANK_UNKNOWN,
            )
        return "it normalizes several trailing axes, so its affine is not per-channel", Code.NOT_PER_CHANNEL
    if graph.index.opset >= 21:
        return "", Code.NOT_PER_CHANNEL
    groups = int(attr(p, "num_groups", 0))
    dims = graph.shape_info(norm.input).shape
    channels = dims[1] if dims is not None and len(dims) > 1 else None
    if isinstance(channels, int) and channels == groups:
        return "", Code.NOT_PER_CHANNEL
    return (
        f"GroupNormalization-18 holds one scale and bias per group (num_groups={groups}, "
        f"{channels if isinstance(channels, int) else 'an unknown number of'} channels), not per channel",
        Code.NOT_PER_CHANNEL,
    )


# --------------------------------------------------------------------------- affines and hops


def parse_binary(graph: Any, node: Node) -> Binary | None:
    p = node.proto
    row = op_of(p)
    op = row.kind if row is not None and row.role == "binary" else None
    if op is None or len(p.input) != 2 or len(p.output) != 1 or not p.output[0] or not all(p.input):
        return None
    if op == "add" and is_bias_add(graph, node):
        return None
    gi, v = node.gi, graph.value
    return Binary(node, op, v(gi, p.input[0]), v(gi, p.input[1]), v(gi, p.output[0]), name=p.op_type)


def dropout_training(graph: Any, node: Node) -> str:
    """Why a Dropout may drop values (it is then no hop), or "" when it is the identity."""
    p = node.proto
    if attr(p, "is_test", 0 if graph.index.opset < 7 else 1) == 0:  # before opset 7 the default is training
        return "is_test=0 (training mode)"
    if len(p.input) > 2 and p.input[2]:
        mode = graph.const(graph.value(node.gi, p.input[2]))
        if mode is None or mode.value.any():
            return "it may run in training mode (training_mode is not a constant false)"
    return ""


def parse_hop(graph: Any, node: Node) -> Hop | None:
    p = node.proto
    row = op_of(p)
    if row is None or row.role != "hop" or not p.input or not p.input[0]:
        return None
    if not p.output or not p.output[0] or (p.op_type == "Dropout" and dropout_training(graph, node)):
        return None
    if p.op_type != "Dropout" and any(name and graph.index.visible_uses(node.gi, name) for name in p.output[1:]):
        return None  # MaxPool's Indices are read
    value = graph.value
    return Hop(
        node, value(node.gi, p.input[0]), value(node.gi, p.output[0]), p.op_type, row.monotone, row.kind == "identity"
    )
