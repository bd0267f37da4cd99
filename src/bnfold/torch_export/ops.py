"""Op tables for every IR bnfold reads.

Ops are keyed by schema name and overload (``"aten::convolution.default"``),
which is the same for ``torch.ops.aten`` overloads and ExecuTorch's edge
dialect (``exir_ops.edge.aten.*``).  Supporting another spelling of an op is
one table entry here; the rules never look at op identities.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, replace
from math import prod
from typing import Any

import torch
from torch.fx import Node

from ..engine.graph import Layer, Norm
from ..engine.optable import Op
from ..report import Code

#: ``id(target) -> (target, key)``: looked up without hashing the target (an OpOverload's ``__hash__`` is a Python
#: call, some 40,000 of them in a fold of part A's 800 blocks); the target is held, so its id stays its own
_KEYS: dict[int, tuple[Any, str]] = {}


def op_key(target: Any) -> str:
    """``"aten::convolution.default"``: schema name and overload, the same for ATen and edge ops."""
    hit = _KEYS.get(id(target))
    if hit is not None and hit[0] is target:
        return hit[1]
    schema = getattr(target, "_schema", None)
    if schema is None:
        key = "getitem" if target is operator.getitem else ""
    else:
        key = f"{schema.name}.{getattr(target, '_overloadname', 'default')}"
    _KEYS[id(target)] = (target, key)
    return key


def node_key(node: Node) -> str:
    return op_key(node.target) if node.op == "call_function" else ""


def values_of(node: Node) -> Node | None:
    """The ``getitem(node, 0)`` of an op returning several values (``(values, indices)``, a norm's output and
    statistics), when nothing reads the others (export keeps an unused ``getitem(node, 1)``)."""
    items = list(node.users)
    if any(node_key(u) != "getitem" for u in items):
        return None
    values = [u for u in items if u.args[1] == 0]
    if len(values) != 1 or any(u.users for u in items if u.args[1] != 0):
        return None
    return values[0]


def node_arg(node: Node, index: int, name: str, default: Any = None) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


# --------------------------------------------------------------------------- layers


@dataclass
class LayerWiring:
    """How a layer node holds its weight and bias (``extra`` of its Layer).

    ``weight`` is the tensor node; ``views`` the nodes between it and the
    layer's argument, weight side first (the transpose of ``mm``/``addmm``;
    transpose, expand and view for ``bmm``).  ``transposed``: the tensor is
    stored ``[in, out]``, the transpose of the fold-math layout.  ``bias_slot``
    is the positional index of the bias argument (None: the op has none).
    """

    weight: Any = None
    views: tuple = ()
    transposed: bool = False
    bias_slot: int | None = 2


def op_name(target: Any) -> str:
    """A short op name: ``conv2d`` for ``aten.conv2d.default`` and its edge twin, ``getitem`` for
    ``operator.getitem``, else the target's ``__name__``."""
    key = op_key(target)
    if key:
        return key.split("::")[-1].split(".")[0]
    return getattr(target, "__name__", str(target))


def _padding_is_zero(padding) -> bool:
    if isinstance(padding, str):
        return padding == "valid"
    return all(int(p) == 0 for p in (padding if isinstance(padding, (list, tuple)) else [padding]))


def _layer(
    node: Node,
    kind: str,
    x: Any,
    weight: Any,
    bias: Any,
    groups: int = 1,
    zero_padding: bool = True,
    axis: int = 1,
    wiring: LayerWiring | None = None,
    takes_bias: bool = True,
) -> Layer:
    return Layer(
        node,
        kind,
        op_name(node.target),
        x,
        node,
        weight,
        bias,
        groups,
        zero_padding,
        axis,
        axis,
        takes_bias,
        wiring or LayerWiring(weight),
    )


def _conv_nd(transposed: bool) -> Callable[[Node], Layer]:
    # convNd(input, weight, bias, stride, padding, dilation, groups)
    # conv_transposeNd(input, weight, bias, stride, padding, output_padding, groups, dilation)
    def parse(node: Node) -> Layer:
        return _layer(
            node,
            "conv_transpose" if transposed else "conv",
            node.args[0],
            node.args[1],
            node_arg(node, 2, "bias"),
            int(node_arg(node, 6, "groups", 1)),
            _padding_is_zero(node_arg(node, 4, "padding", 0)),
        )

    return parse


def _convolution(node: Node) -> Layer:
    # convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    # _convolution(... the same ..., benchmark, deterministic, cudnn_enabled, allow_tf32)
    transposed = bool(node.args[6])
    return _layer(
        node,
        "conv_transpose" if transposed else "conv",
        node.args[0],
        node.args[1],
        node.args[2],
        int(node.args[8]),
        _padding_is_zero(node.args[4]),
    )


def _linear(node: Node) -> Layer:
    return _layer(node, "linear", node.args[0], node.args[1], node_arg(node, 2, "bias"), axis=-1)


def _matmul(node: Node) -> Layer | None:
    # x @ W with a constant 2-D W (any rank of x): a linear that has no bias argument
    wiring = _matrix(node.args[1])
    if wiring is None or (_shape(wiring.weight) is None or len(_shape(wiring.weight)) != 2):
        return None
    wiring.bias_slot = None
    return _layer(node, "linear", node.args[0], wiring.weight, None, axis=-1, wiring=wiring, takes_bias=False)


def _matrix(mat2: Any, batched: bool = False) -> LayerWiring | None:
    """How the right operand of a matmul holds a constant-looking weight: through a
    2-D transpose of an ``[out, in]`` tensor (how ``linear`` decomposes), or as an
    ``[in, out]`` tensor itself; for ``bmm`` (``batched``) broadcast by expand/view."""
    views: list[Node] = []
    while (
        batched and isinstance(mat2, Node) and (HOPS.get(node_key(mat2)) == "expand" or node_key(mat2) in BATCH_VIEWS)
    ):
        views.insert(0, mat2)
        mat2 = mat2.args[0]
    if batched and (not views or HOPS.get(node_key(views[0])) != "expand"):
        return None
    if not isinstance(mat2, Node):
        return None
    key = node_key(mat2)
    if HOPS.get(key) in ("transpose", "permute"):
        if HOPS[key] == "permute" and list(mat2.args[1]) != [1, 0]:
            return None
        if HOPS[key] == "transpose" and sorted(int(d) % 2 for d in transpose_dims(mat2)) != [0, 1]:
            return None
        wiring = LayerWiring(mat2.args[0], (mat2, *views), transposed=False)
    elif mat2.op in ("placeholder", "get_attr"):
        wiring = LayerWiring(mat2, tuple(views), transposed=True)
    else:
        return None
    if batched and not _keeps_matrix(views, wiring.views[0] if not wiring.transposed else mat2):
        return None
    return wiring


def _addmm(node: Node) -> Layer | None:
    # addmm(bias, input, mat2, *, beta=1, alpha=1); linear decomposes to addmm(b, x, permute(w, [1, 0]))
    if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
        return None
    wiring = _matrix(node.args[2])
    if wiring is None:
        return None
    wiring.bias_slot = 0
    return _layer(node, "linear", node.args[1], wiring.weight, node.args[0], axis=-1, wiring=wiring)


def _mm(node: Node) -> Layer | None:
    wiring = _matrix(node.args[1])
    if wiring is None:
        return None
    wiring.bias_slot = None  # a bias turns mm into addmm
    return _layer(node, "linear", node.args[0], wiring.weight, None, axis=-1, wiring=wiring)


def _bmm(node: Node) -> Layer | None:
    # A linear over a batched input: bmm(x, view(expand(permute(w, [1, 0]), [B, in, out]))), or of w itself
    wiring = _matrix(node.args[1], batched=True)
    if wiring is None:
        return None
    wiring.bias_slot = None
    return _layer(node, "linear", node.args[0], wiring.weight, None, axis=-1, wiring=wiring, takes_bias=False)


BATCH_VIEWS = {"aten::view.default", "aten::view_copy.default", "aten::_unsafe_view.default"}


def _keeps_matrix(views: list[Node], matrix: Node) -> bool:
    """Whether each of ``views`` only broadcasts ``matrix`` along a new leading dim."""
    want = _shape(matrix)
    return want is not None and all(
        (s := _shape(v)) is not None and len(s) == 3 and tuple(s[1:]) == want for v in views
    )


def _shape(node: Node) -> tuple | None:
    val = node.meta.get("val")
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


LAYERS: dict[str, Callable[[Node], Layer | None]] = {
    "aten::conv1d.default": _conv_nd(False),
    "aten::conv2d.default": _conv_nd(False),
    "aten::conv3d.default": _conv_nd(False),
    "aten::conv1d.padding": _conv_nd(False),
    "aten::conv2d.padding": _conv_nd(False),
    "aten::conv3d.padding": _conv_nd(False),
    "aten::conv_transpose1d.default": _conv_nd(True),
    "aten::conv_transpose2d.input": _conv_nd(True),
    "aten::conv_transpose3d.input": _conv_nd(True),
    "aten::convolution.default": _convolution,
    "aten::_convolution.default": _convolution,
    "aten::linear.default": _linear,
    "aten::addmm.default": _addmm,
    "aten::mm.default": _mm,
    "aten::bmm.default": _bmm,
    "aten::matmul.default": _matmul,
}


def parse_layer(node: Node) -> Layer | None:
    """``node`` as a layer (conv / transposed conv / linear), or None."""
    parse = LAYERS.get(node_key(node))
    return parse(node) if parse else None


def is_edge_op(target: Any) -> bool:
    """Whether ``target`` is an ExecuTorch edge-dialect op (``exir_ops.edge.aten.*``)."""
    return type(target).__name__ == "EdgeOpOverload"


def in_dialect_of(like: Any, op: Any) -> Any:
    """The ATen overload ``op`` in the dialect of the target ``like``: its edge twin for an edge op."""
    if not is_edge_op(like):
        return op
    from executorch.exir.dialects._ops import ops as exir_ops

    name = op._schema.name.split("::")[-1]
    return getattr(getattr(exir_ops.edge.aten, name), op._overloadname)


def addmm_like(mm_target: Any) -> Any:
    """``addmm.default`` in the same dialect as ``mm_target``."""
    return in_dialect_of(mm_target, torch.ops.aten.addmm.default)


# --------------------------------------------------------------------------- normalizations

_TRAINING = "batch norm is in training mode (call model.eval() before export)"
_BATCH_STATS = "uses batch statistics at inference (track_running_stats=False): never foldable"


def _getitems(node: Node) -> tuple[Node | None, bool]:
    """The ``getitem(node, 0)`` user, and whether any other output has users."""
    out, used = None, False
    for user in node.users:
        if node_key(user) == "getitem" and user.args[1] == 0:
            out = user
        else:
            used = used or bool(user.users) or node_key(user) != "getitem"
    return out, used


def _tuple_norm(mean_at: int | None, training_at: int | None, eps_at: int) -> Callable[[Node], Norm]:
    def parse(node: Node) -> Norm:
        a = node.args
        out, used = _getitems(node)
        mean = a[mean_at] if mean_at is not None else None
        var = a[mean_at + 1] if mean_at is not None else None
        norm = Norm(node, a[0], out, a[1], a[2], mean, var, float(a[eps_at]), statistics_used=used)
        if mean_at is None or mean is None:
            norm.problem, norm.problem_code = _BATCH_STATS, Code.BATCH_STATISTICS
        elif training_at is not None and a[training_at]:
            norm.problem, norm.problem_code = _TRAINING, Code.TRAINING_MODE
        return norm

    return parse


def _batch_norm(node: Node) -> Norm:
    # batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled)
    a = node.args
    norm = Norm(node, a[0], node, a[1], a[2], a[3], a[4], float(a[7]))
    if a[3] is None or a[4] is None:
        norm.problem, norm.problem_code = _BATCH_STATS, Code.BATCH_STATISTICS
    elif a[5]:
        norm.problem, norm.problem_code = _TRAINING, Code.TRAINING_MODE
    return norm


def _functional(node: Node) -> Norm:
    norm = _tuple_norm(3, None, 6)(node)
    norm.problem, norm.problem_code = _TRAINING, Code.TRAINING_MODE
    return norm


NORMS: dict[str, Callable[[Node], Norm]] = {
    "aten::batch_norm.default": _batch_norm,
    # (input, weight, bias, running_mean, running_var, momentum, eps)
    "aten::_native_batch_norm_legit_no_training.default": _tuple_norm(3, None, 6),
    # (input, weight, bias, running_mean, running_var, training, momentum, eps)
    "aten::_native_batch_norm_legit.default": _tuple_norm(3, 5, 7),
    "aten::native_batch_norm.default": _tuple_norm(3, 5, 7),
    # (input, weight, bias, training, momentum, eps)
    "aten::_native_batch_norm_legit.no_stats": _tuple_norm(None, 3, 5),
    "aten::_native_batch_norm_legit_functional.default": _functional,
}


def _affine_norm(op: str, shape_at: int | None, weight_at: int, bias_at: int | None, axis: int) -> Callable:
    """A LayerNorm / RMSNorm / GroupNorm: its normalization stays, its elementwise affine may fold."""

    def parse(node: Node, plain: bool = False) -> Norm | None:
        """The norm with its affine; ``plain``: the norm without one (``GraphAdapter.plain_norm``)."""
        weight = node.args[weight_at] if len(node.args) > weight_at else node.kwargs.get("weight")
        bias = (node.args[bias_at] if len(node.args) > bias_at else node.kwargs.get("bias")) if bias_at else None
        if (weight is None and bias is None) != plain:
            return None  # no affine: nothing to fold (or, for a plain one, an affine of its own)
        out, used = _getitems(node) if "native" in node_key(node) else (node, False)
        if plain and (used or out is None):
            return None
        norm = Norm(
            node,
            node.args[0],
            out,
            weight,
            bias,
            None,
            None,
            0.0,
            axis=axis,
            statistics_used=used,
            op=op,
            affine_only=True,
            kind=op,
        )
        if shape_at is not None and len(node.args[shape_at]) != 1:
            norm.problem = "it normalizes several trailing axes, so its affine is not per-channel"
            norm.problem_code = Code.NOT_PER_CHANNEL
        return norm

    parse.kind = op  # the norm kind, for ``OPS``
    return parse


#: Normalizations whose elementwise affine folds into the layers they feed: key -> parser.
NORM_AFFINES: dict[str, Callable[[Node], Norm | None]] = {
    # layer_norm(input, normalized_shape, weight, bias, eps, cudnn_enable)
    "aten::layer_norm.default": _affine_norm("layer_norm", 1, 2, 3, -1),
    # native_layer_norm(input, normalized_shape, weight, bias, eps) -> (out, mean, rstd)
    "aten::native_layer_norm.default": _affine_norm("layer_norm", 1, 2, 3, -1),
    # rms_norm(input, normalized_shape, weight, eps)
    "aten::rms_norm.default": _affine_norm("rms_norm", 1, 2, None, -1),
    # group_norm(input, num_groups, weight, bias, eps, cudnn_enabled)
    "aten::group_norm.default": _affine_norm("group_norm", None, 2, 3, 1),
    # native_group_norm(input, weight, bias, N, C, HxW, group, eps) -> (out, mean, rstd)
    "aten::native_group_norm.default": _affine_norm("group_norm", None, 1, 2, 1),
}


def module_path(node: Node) -> str:
    """The module path recorded for ``node`` (``layer1.0.conv1``), or its node name: the name people know."""
    stack = node.meta.get("nn_module_stack")
    if stack:
        path = list(stack.values())[-1][0]
        return path.replace("L['self'].", "").replace("L__self___", "") or node.name
    return node.name


def parse_norm_affine(node: Node) -> Norm | None:
    """``node`` as a normalization whose affine alone may fold (LayerNorm, RMSNorm, GroupNorm), or None."""
    parse = NORM_AFFINES.get(node_key(node))
    return parse(node) if parse else None


def parse_plain_norm(node: Node) -> Norm | None:
    """``node`` as a LayerNorm / RMSNorm / GroupNorm without weight and bias whose statistics nobody reads, or None."""
    parse = NORM_AFFINES.get(node_key(node))
    return parse(node, plain=True) if parse else None


def parse_norm(node: Node) -> Norm | None:
    parse = NORMS.get(node_key(node))
    return parse(node) if parse else None


# --------------------------------------------------------------------------- shape-only hops and affines

#: Shape-only hops -> the axis rule (``axes.AXIS_RULES``) that follows the channel axis through them:
#: ``identity`` (output = first input, element for element), ``reshape`` (view / squeeze / flatten:
#: the channel axis is where as many elements come before it), ``unsqueeze``, ``transpose``,
#: ``permute``, ``movedim``, ``expand`` (a hop only when it broadcasts nothing, see ``hop_is_exact``);
#: ``select``, ``slice``, ``index_select``, ``index``, ``reduce`` (a mean or max), along axes other
#: than the channel's; ``pool1d`` / ``pool2d`` / ``pool3d`` (a pool over the last 1 / 2 / 3 axes).
#: The maxima are rows of ``MAX_HOPS``, merged in.
HOPS: dict[str, str] = {
    "aten::clone.default": "identity",
    "aten::alias.default": "identity",
    "aten::alias_copy.default": "identity",
    "aten::detach.default": "identity",
    "aten::detach_copy.default": "identity",
    "aten::contiguous.default": "identity",
    "aten::dropout.default": "identity",
    "aten::feature_dropout.default": "identity",
    "aten::lift_fresh_copy.default": "identity",
    "aten::_to_copy.default": "identity",
    "dim_order_ops::_clone_dim_order.default": "identity",
    "dim_order_ops::_to_dim_order_copy.default": "identity",
    "aten::view.default": "reshape",
    "aten::view_copy.default": "reshape",
    "aten::as_strided.default": "reshape",  # only one that reads in flat order (hop_is_exact): a flatten
    "aten::as_strided_copy.default": "reshape",
    "aten::reshape.default": "reshape",
    "aten::_unsafe_view.default": "reshape",
    "aten::squeeze.dim": "reshape",
    "aten::squeeze.dims": "reshape",
    "aten::squeeze.default": "reshape",
    "aten::squeeze_copy.dim": "reshape",
    "aten::squeeze_copy.dims": "reshape",
    "aten::squeeze_copy.default": "reshape",
    "aten::flatten.using_ints": "reshape",
    "aten::unflatten.int": "reshape",
    "aten::reshape_as.default": "reshape",
    "aten::view_as.default": "reshape",
    "aten::unsqueeze.default": "unsqueeze",
    "aten::unsqueeze_copy.default": "unsqueeze",
    "aten::transpose.int": "transpose",
    "aten::transpose_copy.int": "transpose",
    "aten::swapaxes.default": "transpose",
    "aten::swapdims.default": "transpose",
    "aten::t.default": "transpose",
    "aten::t_copy.default": "transpose",
    "aten::permute.default": "permute",
    "aten::permute_copy.default": "permute",
    "aten::movedim.int": "movedim",
    "aten::movedim.intlist": "movedim",
    "aten::expand.default": "expand",
    "aten::expand_copy.default": "expand",
    # along axes other than the channel's: a per-channel affine commutes with picking, slicing or
    # averaging there (each output is a mean of inputs of its channel: weights that sum to one)
    "aten::select.int": "select",
    "aten::select_copy.int": "select",
    "aten::slice.Tensor": "slice",
    "aten::slice_copy.Tensor": "slice",
    "aten::index_select.default": "index_select",
    "aten::index.Tensor": "index",  # x[:, idx]: one 1-D integer index (``hop_is_exact``)
    "aten::mean.dim": "reduce",
    "aten::adaptive_avg_pool1d.default": "pool1d",
    "aten::adaptive_avg_pool2d.default": "pool2d",
    "aten::_adaptive_avg_pool2d.default": "pool2d",
    "aten::adaptive_avg_pool3d.default": "pool3d",
    "aten::_adaptive_avg_pool3d.default": "pool3d",
}
#: Hops that take a maximum along axes other than the channel's (part of ``HOPS``):
#: ``max(x * s + t) = max(x) * s + t`` only where ``s >= 0``, which the engine checks
#: (``engine.edit.negative_crossing``).  Those returning ``(values, indices)`` are hops while nothing
#: reads the indices (the hop's output is then ``getitem(node, 0)``).
MAX_HOPS: dict[str, str] = {
    "aten::amax.default": "reduce",
    "aten::max_pool1d.default": "pool1d",
    "aten::max_pool2d.default": "pool2d",
    "aten::max_pool3d.default": "pool3d",
    "aten::max_pool2d_with_indices.default": "pool2d",
    "aten::max_pool3d_with_indices.default": "pool3d",
    "aten::adaptive_max_pool1d.default": "pool1d",
    "aten::adaptive_max_pool2d.default": "pool2d",
    "aten::adaptive_max_pool3d.default": "pool3d",
}
HOPS.update(MAX_HOPS)


def transpose_dims(node: Node) -> tuple:
    """The two dims a transpose swaps (``t`` swaps 0 and 1)."""
    return tuple(node.args[1:3]) or (0, 1)


#: Elementwise binary ops, by the name of their row in ``fold_math.BINARY_AFFINES``.
BINARY_OPS = {
    "aten::mul.Tensor": "mul",
    "aten::mul.Scalar": "mul",
    "aten::div.Tensor": "div",
    "aten::div.Scalar": "div",
    "aten::add.Tensor": "add",
    "aten::add.Scalar": "add",
    "aten::sub.Tensor": "sub",
    "aten::sub.Scalar": "sub",
    "aten::rsub.Tensor": "rsub",
    "aten::rsub.Scalar": "rsub",
    "aten::true_divide.Tensor": "div",
}
#: In-place elementwise ops (``out += 0``, ``x *= s``: the training IR keeps them): the row of their
#: functional form, read as that form only where nothing but the op reads the value it mutates and
#: that value is computed in the graph (``graph.binary``); the merge also reads the sums of two
#: computed values (``geometry.INPLACE_SUMS``).
INPLACE_BINARY_OPS = {
    "aten::mul_.Tensor": "mul",
    "aten::mul_.Scalar": "mul",
    "aten::div_.Tensor": "div",
    "aten::div_.Scalar": "div",
    "aten::add_.Tensor": "add",
    "aten::add_.Scalar": "add",
    "aten::sub_.Tensor": "sub",
    "aten::sub_.Scalar": "sub",
}
#: Ops that read only the metadata (shape, dtype) of the argument at the given
#: positions: a user through those positions is no user for a fold.
METADATA_READERS = {
    "aten::sym_size.int": (0,),
    "aten::sym_stride.int": (0,),
    "aten::sym_numel.default": (0,),
    "aten::sym_storage_offset.default": (0,),
    "aten::size.int": (0,),
    "aten::size.default": (0,),
    "aten::dim.default": (0,),
    "aten::numel.default": (0,),
    "aten::stride.int": (0,),
    "aten::reshape_as.default": (1,),
    "aten::view_as.default": (1,),
    "aten::expand_as.default": (1,),
    "aten::empty_like.default": (0,),
    "aten::zeros_like.default": (0,),
    "aten::ones_like.default": (0,),
}


def reads_only_metadata(user: Node, value: Node) -> bool:
    """Whether ``user`` reads nothing of ``value`` but its shape and dtype."""
    positions = METADATA_READERS.get(node_key(user))
    if positions is None:
        return False
    for i, arg in enumerate(user.args):
        if i not in positions and _mentions(arg, value):
            return False
    return not any(_mentions(v, value) for v in user.kwargs.values())


def _mentions(arg: Any, value: Node) -> bool:
    """Whether ``value`` is ``arg`` or in it (nested lists and tuples followed on a stack of its own)."""
    todo = [arg]
    while todo:
        a = todo.pop()
        if isinstance(a, (list, tuple)):
            todo.extend(a)
        elif a is value:
            return True
    return False


def hop_is_exact(node: Node) -> bool:
    """Whether a hop-like node moves data without changing it: eval dropout, a same-dtype copy,
    an expand to the shape it already has."""
    key = node_key(node)
    if HOPS.get(key) == "expand":
        before, after = _shape(node.args[0]), _shape(node)
        return before is not None and before == after
    if key in ("aten::as_strided.default", "aten::as_strided_copy.default"):
        return _flat_order(node)
    if key == "aten::mean.dim":  # a mean into another dtype also rounds
        return node.kwargs.get("dtype") is None
    if key == "aten::index.Tensor":  # one 1-D integer index: a bool mask or several indices move axes
        indices = node.args[1] if len(node.args) > 1 else []
        given = [i for i in indices if i is not None]
        val = given[0].meta.get("val") if len(given) == 1 and isinstance(given[0], Node) else None
        return (
            isinstance(val, torch.Tensor)
            and val.dim() == 1
            and not val.dtype.is_floating_point
            and val.dtype != torch.bool
        )
    return _identity_dropout(node)


def _flat_order(node: Node) -> bool:
    """Whether an ``as_strided`` reads its input's elements in their order, i.e. is a reshape: the input is
    contiguous from the start of its storage (its storage order is its logical order), the view has no
    offset, all of its elements, and a contiguous tensor's strides (a dim of size 1 takes any).  torch's
    decomposition of ``flatten`` writes one (torchvision Swin's head).  The input's strides are read from its
    metadata: a file's are checked against the recomputed ones at load (``io.fx_shapes.LAYOUT_READERS``)."""
    x = node.args[0] if node.args else None
    val = x.meta.get("val") if isinstance(x, Node) else None
    size, stride = node_arg(node, 1, "size", None), node_arg(node, 2, "stride", None)
    if not isinstance(val, torch.Tensor) or size is None or stride is None or node_arg(node, 3, "storage_offset", None):
        return False
    if not all(isinstance(d, int) for d in (*size, *stride, *val.shape)):
        return False  # symbolic: not proven
    try:
        if not val.is_contiguous() or val.storage_offset() != 0 or prod(size) != val.numel():
            return False
    except Exception:  # noqa: BLE001 - a fake that cannot tell: not proven
        return False
    step = 1
    for d, s in zip(reversed(size), reversed(stride)):
        if d != 1 and s != step:
            return False
        step *= d
    return True


def _identity_dropout(node: Node) -> bool:
    key = node_key(node)
    if key in ("aten::dropout.default", "aten::feature_dropout.default"):
        return not node_arg(node, 2, "train", False) or float(node_arg(node, 1, "p", 0.0)) == 0.0
    if key in ("aten::_to_copy.default", "dim_order_ops::_to_dim_order_copy.default"):
        # a copy that keeps dtype, layout and device
        return all(node.kwargs.get(k) is None for k in ("dtype", "layout", "device"))
    return True


#: Average pools -> their number of spatial axes; re-parameterization reads one as a conv kernel
#: (``geometry.parse_pool``): avg_poolNd(input, kernel_size, stride=[], padding=0, ceil_mode=False,
#: count_include_pad=True, divisor_override=None).
AVG_POOLS = {"aten::avg_pool1d.default": 1, "aten::avg_pool2d.default": 2, "aten::avg_pool3d.default": 3}


# --------------------------------------------------------------------------- every op, by role

#: Every op key bnfold reads, as the format-neutral rows ``onnx.ops.OPS`` also holds (a view of the
#: tables above: add rows there).  A layer's kind is "" here: parsing tells (``convolution``).
OPS: dict[str, Op] = {
    **{key: Op("metadata") for key in METADATA_READERS},
    **{key: Op("layer") for key in LAYERS},
    **{key: Op("norm", "batch_norm") for key in NORMS},
    **{key: Op("norm", parse.kind) for key, parse in NORM_AFFINES.items()},
    **{key: Op("binary", row, "broadcast") for key, row in {**BINARY_OPS, **INPLACE_BINARY_OPS}.items()},
    **{key: Op("hop", rule, monotone=key in MAX_HOPS) for key, rule in HOPS.items()},
    **{key: Op("pool", "avg_pool") for key in AVG_POOLS},
}


def _overloads(names: str) -> list[str]:
    """The op keys of every overload of the aten ops ``names`` and of their edge ``_copy`` twins."""
    keys = []
    for name in names.split():
        for n in (name, name + "_copy"):
            try:
                packet = getattr(torch.ops.aten, n)
            except (AttributeError, RuntimeError):
                continue
            keys += [f"aten::{n}.{overload}" for overload in packet.overloads()]
    return keys


#: What the numerics read (``Op.rounding`` / ``layer`` / ``fp16``, see ``engine.optable.Op``): ops whose
#: output holds only values of their inputs (``same``: rearranged), the layers' kinds (a product of two
#: activations is a ``matmul``; parsing tells a conv from a transposed one and a linear layer), and the ops
#: ONNX Runtime keeps in fp16 as this program's ONNX spells them.
_SAME = (
    "view _unsafe_view reshape permute t transpose squeeze unsqueeze flatten unflatten clone alias detach lift_fresh"
)
_EXACT = (
    "expand slice select cat stack split split_with_sizes chunk unbind narrow index_select max_pool1d max_pool2d "
    "max_pool3d max_pool2d_with_indices max_pool3d_with_indices amax relu neg abs"
)
_MOVEMENT = (
    "view _unsafe_view reshape permute transpose t slice squeeze unsqueeze cat flatten select index_select expand"
)
_NUMERICS: dict[str, dict] = {
    **{k: {"rounding": "same"} for k in _overloads(_SAME)},
    **{k: {"rounding": "exact"} for k in _overloads(_EXACT)},
    "getitem": {"rounding": "exact"},
    **{k: {"layer": "conv"} for k in LAYERS if "conv" in k},
    **{k: {"layer": "linear"} for k in _overloads("linear")},
    **{k: {"layer": "matmul"} for k in _overloads("mm addmm bmm baddbmm matmul")},
    **{k: {"fp16": "softmax"} for k in _overloads("_softmax softmax")},
    **{k: {"accumulate": "sum"} for k in _overloads("sum")},
    **{
        k: {"accumulate": "mean"}
        for k in _overloads("mean adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d")
    },
    **{k: {"accumulate": "pool"} for k in _overloads("avg_pool1d avg_pool2d avg_pool3d")},
}
for _k in _overloads(_MOVEMENT):
    _NUMERICS[_k] = dict(_NUMERICS.get(_k, {}), fp16="movement")
#: Elementwise ops whose output has their first input's shape (``Op.shape``: the audit's run-time check bounds
#: their outputs' size by it, ``io.run_checks.shape_bound``)
_SAME_SHAPE = (
    "relu relu6 sigmoid silu hardswish hardsigmoid hardtanh gelu tanh elu leaky_relu softplus mish clamp neg abs "
    "exp log sqrt rsqrt reciprocal erf sin cos _softmax _log_softmax clone"
)
for _k in _overloads(_SAME_SHAPE):
    _NUMERICS[_k] = dict(_NUMERICS.get(_k, {}), shape="same")
for _k in _overloads("mean sum amax amin prod argmax argmin"):  # reductions: at most their input's elements
    _NUMERICS[_k] = dict(_NUMERICS.get(_k, {}), shape="reduced")
#: What the fp16 range rewrite reads (``Op.range`` / ``degree``, see ``engine.optable.Op``), by op name (every
#: overload and its edge ``_copy`` twin); a ``power`` op's degree (None: its constant exponent operand).
RANGE_FACTS = {
    "homogeneous": (
        f"{_SAME} expand slice select index index_select narrow gather embedding _to_copy contiguous dropout "
        "relu leaky_relu prelu _prelu_kernel neg abs sum mean amax amin cumsum flip roll repeat tile pixel_shuffle "
        "pixel_unshuffle split split_with_sizes chunk unbind constant_pad_nd max_pool1d max_pool2d max_pool3d "
        "max_pool2d_with_indices max_pool3d_with_indices adaptive_max_pool1d adaptive_max_pool2d adaptive_max_pool3d "
        "avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool1d adaptive_avg_pool2d _adaptive_avg_pool2d "
        "adaptive_avg_pool3d _adaptive_avg_pool3d upsample_nearest1d upsample_nearest2d upsample_nearest3d "
        "_upsample_nearest_exact1d _upsample_nearest_exact2d _upsample_nearest_exact3d upsample_linear1d "
        "upsample_bilinear2d upsample_trilinear3d upsample_bicubic2d relu_ leaky_relu_ neg_ abs_"
    ),
    "sum": "add sub rsub cat concat stack add_ sub_",  # an in-place op only where nothing else reads what it writes
    "product": "mul matmul bmm mm mul_",
    "quotient": "div true_divide div_",
    "power": "pow sqrt rsqrt reciprocal square",
    "invariant": "layer_norm native_layer_norm rms_norm group_norm native_group_norm instance_norm",
}
POWER_DEGREES = {"sqrt": 0.5, "rsqrt": -0.5, "reciprocal": -1.0, "square": 2.0, "pow": None}
#: An ``invariant`` norm's eps: op name -> (argument index, default; None: the input dtype's machine epsilon).
NORM_EPS = {
    "layer_norm": (4, 1e-5),
    "native_layer_norm": (4, None),
    "rms_norm": (3, None),
    "group_norm": (4, 1e-5),
    "native_group_norm": (7, None),
    "instance_norm": (7, None),
}
for _fact, _names in RANGE_FACTS.items():
    for _name in _names.split():
        for _k in _overloads(_name):
            _NUMERICS[_k] = dict(_NUMERICS.get(_k, {}), range=_fact, degree=POWER_DEGREES.get(_name))
_NUMERICS["getitem"] = dict(_NUMERICS["getitem"], range="homogeneous")
for _k, _facts in _NUMERICS.items():
    OPS[_k] = replace(OPS.get(_k, Op("numeric")), **_facts)


def op_of(node: Any) -> Op | None:
    """The row of ``node``'s op, or None (not a call, or an op bnfold does not read)."""
    return OPS.get(node_key(node)) if isinstance(node, Node) else None
