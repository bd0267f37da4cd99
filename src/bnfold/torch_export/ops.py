"""Op tables for every IR bnfold reads.

Ops are keyed by schema name and overload (``"aten::convolution.default"``),
which is the same for ``torch.ops.aten`` overloads and ExecuTorch's edge
dialect (``exir_ops.edge.aten.*``).  Supporting another spelling of an op is
one table entry here; the rules never look at op identities.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.fx import Node


def op_key(target: Any) -> str:
    schema = getattr(target, "_schema", None)
    if schema is None:
        return "getitem" if target is operator.getitem else ""
    return f"{schema.name}.{getattr(target, '_overloadname', 'default')}"


def node_key(node: Node) -> str:
    return op_key(node.target) if node.op == "call_function" else ""


def _arg(node: Node, index: int, name: str, default: Any = None) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


# --------------------------------------------------------------------------- producers


@dataclass
class Producer:
    """A conv / transposed conv / linear node, as the rules see it.

    ``weight`` is the node holding the weight tensor in ``kind`` layout; for
    ``mm``/``addmm`` it is the ``[out, in]`` tensor behind ``weight_view`` (the
    transpose node).  ``set_bias(node)`` wires a bias node into the producer.
    """

    node: Node
    kind: str  # "conv" | "conv_transpose" | "linear"
    input: Node
    weight: Any
    bias: Any
    groups: int
    zero_padding: bool
    channel_axis: int  # channel axis of the output (and of the input)
    weight_view: Node | None = None
    bias_slot: int | None = 2  # positional index of the bias argument; None = needs a new op

    @property
    def name(self) -> str:
        return self.node.name


def _padding_is_zero(padding) -> bool:
    if isinstance(padding, str):
        return padding == "valid"
    return all(int(p) == 0 for p in (padding if isinstance(padding, (list, tuple)) else [padding]))


def _conv_nd(transposed: bool) -> Callable[[Node], Producer]:
    # convNd(input, weight, bias, stride, padding, dilation, groups)
    # conv_transposeNd(input, weight, bias, stride, padding, output_padding, groups, dilation)
    def parse(node: Node) -> Producer:
        return Producer(node, "conv_transpose" if transposed else "conv", node.args[0], node.args[1],
                        _arg(node, 2, "bias"), int(_arg(node, 6, "groups", 1)),
                        _padding_is_zero(_arg(node, 4, "padding", 0)), 1)
    return parse


def _convolution(node: Node) -> Producer:
    # convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    transposed = bool(node.args[6])
    return Producer(node, "conv_transpose" if transposed else "conv", node.args[0], node.args[1], node.args[2],
                    int(node.args[8]), _padding_is_zero(node.args[4]), 1)


def _linear(node: Node) -> Producer:
    return Producer(node, "linear", node.args[0], node.args[1], _arg(node, 2, "bias"), 1, True, -1)


TRANSPOSES = {"aten::permute.default", "aten::permute_copy.default", "aten::t.default", "aten::t_copy.default",
              "aten::transpose.int", "aten::transpose_copy.int"}


def _transposed_weight(mat2: Any) -> Node | None:
    """The ``[out, in]`` weight behind ``mat2`` when mat2 is its 2-D transpose."""
    if not isinstance(mat2, Node) or node_key(mat2) not in TRANSPOSES:
        return None
    key = node_key(mat2)
    if key.startswith("aten::permute") and list(mat2.args[1]) != [1, 0]:
        return None
    if key.startswith("aten::transpose") and sorted(int(d) % 2 for d in mat2.args[1:3]) != [0, 1]:
        return None
    return mat2.args[0]


def _addmm(node: Node) -> Producer | None:
    # addmm(bias, input, mat2, *, beta=1, alpha=1); linear decomposes to addmm(b, x, permute(w, [1, 0]))
    if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
        return None
    weight = _transposed_weight(node.args[2])
    if weight is None:
        return None
    return Producer(node, "linear", node.args[1], weight, node.args[0], 1, True, -1, node.args[2], bias_slot=0)


def _mm(node: Node) -> Producer | None:
    weight = _transposed_weight(node.args[1])
    if weight is None:
        return None
    return Producer(node, "linear", node.args[0], weight, None, 1, True, -1, node.args[1], bias_slot=None)


PRODUCERS: dict[str, Callable[[Node], Producer | None]] = {
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
    "aten::linear.default": _linear,
    "aten::addmm.default": _addmm,
    "aten::mm.default": _mm,
}


def parse_producer(node: Node) -> Producer | None:
    parse = PRODUCERS.get(node_key(node))
    return parse(node) if parse else None


def addmm_like(mm_target: Any) -> Any:
    """``addmm.default`` in the same dialect as ``mm_target``."""
    if type(mm_target).__name__ == "EdgeOpOverload":
        from executorch.exir.dialects._ops import ops as exir_ops

        return exir_ops.edge.aten.addmm.default
    return torch.ops.aten.addmm.default


# --------------------------------------------------------------------------- normalizations


@dataclass
class Norm:
    """A batch-norm node.  ``output`` is the node whose value is the normalized
    tensor (the node itself, or its ``getitem(0)``); ``problem`` is set when the
    node can never fold (training mode, batch statistics, ...)."""

    node: Node
    input: Node
    weight: Any
    bias: Any
    mean: Any
    var: Any
    eps: float
    output: Node | None
    extra_outputs: list[Node]
    problem: str = ""

    @property
    def nodes(self) -> list[Node]:
        return [self.node] + ([self.output] if self.output is not self.node and self.output is not None else [])


def _getitems(node: Node) -> tuple[Node | None, list[Node]]:
    out, extra = None, []
    for user in node.users:
        if node_key(user) == "getitem" and user.args[1] == 0:
            out = user
        else:
            extra.append(user)
    return out, extra


def _tuple_norm(mean_at: int | None, training_at: int | None, eps_at: int) -> Callable[[Node], Norm]:
    def parse(node: Node) -> Norm:
        a = node.args
        out, extra = _getitems(node)
        mean = a[mean_at] if mean_at is not None else None
        var = a[mean_at + 1] if mean_at is not None else None
        norm = Norm(node, a[0], a[1], a[2], mean, var, float(a[eps_at]), out, extra)
        if mean_at is None or mean is None:
            norm.problem = "uses batch statistics at inference (track_running_stats=False): never foldable"
        elif training_at is not None and a[training_at]:
            norm.problem = "batch norm is in training mode (call model.eval() before export)"
        return norm
    return parse


def _batch_norm(node: Node) -> Norm:
    # batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled)
    a = node.args
    norm = Norm(node, a[0], a[1], a[2], a[3], a[4], float(a[7]), node, [])
    if a[3] is None or a[4] is None:
        norm.problem = "uses batch statistics at inference (track_running_stats=False): never foldable"
    elif a[5]:
        norm.problem = "batch norm is in training mode (call model.eval() before export)"
    return norm


def _functional(node: Node) -> Norm:
    norm = _tuple_norm(3, None, 6)(node)
    norm.problem = "batch norm is in training mode (call model.eval() before export)"
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


def parse_norm(node: Node) -> Norm | None:
    parse = NORMS.get(node_key(node))
    return parse(node) if parse else None


def is_norm(node: Node) -> bool:
    return node_key(node) in NORMS


# --------------------------------------------------------------------------- shape-only hops and affines

#: Ops whose output is their first input, element for element.
IDENTITY_HOPS = {
    "aten::clone.default", "aten::alias.default", "aten::alias_copy.default", "aten::detach.default",
    "aten::detach_copy.default", "aten::contiguous.default", "aten::dropout.default",
    "aten::feature_dropout.default", "aten::lift_fresh_copy.default",
}
#: Ops that only change the shape; the channel axis is followed through them.
RESHAPE_HOPS = {
    "aten::view.default", "aten::view_copy.default", "aten::reshape.default", "aten::_unsafe_view.default",
    "aten::unsqueeze.default", "aten::unsqueeze_copy.default", "aten::squeeze.dim", "aten::squeeze.dims",
    "aten::squeeze.default", "aten::squeeze_copy.dim", "aten::squeeze_copy.dims", "aten::squeeze_copy.default",
    "aten::flatten.using_ints",
}
#: Elementwise binary ops an affine chain is made of: key -> (op, scalar overload?)
AFFINE_OPS = {
    "aten::mul.Tensor": "mul", "aten::mul.Scalar": "mul",
    "aten::div.Tensor": "div", "aten::div.Scalar": "div",
    "aten::add.Tensor": "add", "aten::add.Scalar": "add",
    "aten::sub.Tensor": "sub", "aten::sub.Scalar": "sub",
    "aten::rsub.Tensor": "rsub", "aten::rsub.Scalar": "rsub",
}


def dropout_is_identity(node: Node) -> bool:
    key = node_key(node)
    if key in ("aten::dropout.default", "aten::feature_dropout.default"):
        return not _arg(node, 2, "train", False) or float(_arg(node, 1, "p", 0.0)) == 0.0
    return True
