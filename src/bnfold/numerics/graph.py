"""Reading ExportedProgram graphs: op names, BatchNorm arguments, layer ops, placeholder values.

Ops are recognized by their schema name (``aten::convolution``) rather than
by identity, so the ATen IRs and ExecuTorch edge ops (``exir_ops.edge.*``) read
the same.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch.export.graph_signature import InputKind

# Eval-mode batch norms: op name -> index of (input, weight, bias, mean, var, eps) and of `training` (or None).
_BN_ARGS = {
    "batch_norm": ((0, 1, 2, 3, 4, 7), 5),
    "native_batch_norm": ((0, 1, 2, 3, 4, 7), 5),
    "_native_batch_norm_legit": ((0, 1, 2, 3, 4, 7), 5),
    "_native_batch_norm_legit_no_training": ((0, 1, 2, 3, 4, 6), None),
}
_BN_DEFAULT_EPS = 1e-5

# Layers: the ops that carry weights a normalization folds into, plus plain matmuls.
CONV_OPS = frozenset({"convolution", "conv1d", "conv2d", "conv3d", "_convolution"})
CONV_TRANSPOSE_OPS = frozenset({"conv_transpose1d", "conv_transpose2d", "conv_transpose3d"})
LINEAR_OPS = frozenset({"linear", "addmm", "mm", "bmm", "matmul", "baddbmm"})
LAYER_OPS = CONV_OPS | CONV_TRANSPOSE_OPS | LINEAR_OPS


def op_name(target: Any) -> str:
    """``convolution`` for ``aten.convolution.default`` and its edge twin; ``getitem`` for operator.getitem."""
    schema = getattr(target, "_schema", None)
    if schema is not None:
        return schema.name.split("::")[-1]
    if target is operator.getitem:
        return "getitem"
    return getattr(target, "__name__", str(target))


def layer_kind(node: torch.fx.Node) -> str | None:
    """``conv`` / ``conv_transpose`` / ``linear`` for a layer op node, else None."""
    if node.op != "call_function":
        return None
    name = op_name(node.target)
    if name in CONV_TRANSPOSE_OPS:
        return "conv_transpose"
    if name in CONV_OPS:
        transposed = named_args(node).get("transposed", False)
        return "conv_transpose" if transposed else "conv"
    if name in LINEAR_OPS:
        return "linear"
    return None


def named_args(node: torch.fx.Node) -> dict[str, Any]:
    """The node's arguments by schema name, defaults filled in (fx nodes left as nodes)."""
    schema = node.target._schema
    out = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args):
            out[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            out[arg.name] = node.kwargs[arg.name]
        elif arg.has_default_value():
            out[arg.name] = arg.default_value
    return out


@dataclass
class BatchNormArgs:
    """The pieces of an eval-mode batch-norm node (fx nodes, or None for a missing affine)."""

    input: Any
    weight: Any
    bias: Any
    mean: Any
    var: Any
    eps: float


def batch_norm_args(node: torch.fx.Node) -> BatchNormArgs | None:
    """The arguments of an eval-mode (running statistics) batch-norm node; None for any other node."""
    if node.op != "call_function":
        return None
    spec = _BN_ARGS.get(op_name(node.target))
    if spec is None:
        return None
    idx, training_idx = spec

    def arg(i, default=None):
        return node.args[i] if i < len(node.args) else default

    if training_idx is not None and arg(training_idx, False):
        return None
    x, w, b, m, v = (arg(i) for i in idx[:5])
    if m is None or v is None:
        return None
    return BatchNormArgs(x, w, b, m, v, float(arg(idx[5], _BN_DEFAULT_EPS)))


def batch_norm_output(node: torch.fx.Node) -> torch.fx.Node:
    """The node holding the normalized tensor: the node itself, or its ``getitem(., 0)`` user."""
    for user in node.users:
        if user.op == "call_function" and user.target is operator.getitem and user.args[1] == 0:
            return user
    return node


def placeholder_values(ep: torch.export.ExportedProgram) -> tuple[dict[str, Any], list[str]]:
    """``({placeholder name: lifted parameter/buffer/constant}, [user input placeholder names])``."""
    lifted, user = {}, []
    for spec in ep.graph_signature.input_specs:
        name = spec.arg.name
        if spec.kind == InputKind.USER_INPUT:
            user.append(name)
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR, InputKind.CUSTOM_OBJ):
            if spec.target in ep.state_dict:
                lifted[name] = ep.state_dict[spec.target]
            elif spec.target in ep.constants:
                lifted[name] = ep.constants[spec.target]
            else:
                raise KeyError(f"placeholder {name!r}: {spec.target!r} is in neither state_dict nor constants")
        else:
            raise NotImplementedError(f"placeholder {name!r} of kind {spec.kind.name} is not supported by the emulator")
    return lifted, user


def tensor_of(node: Any, lifted: dict[str, Any]) -> torch.Tensor | None:
    """The constant tensor behind a placeholder node argument, or None."""
    if isinstance(node, torch.fx.Node) and node.op == "placeholder":
        value = lifted.get(node.name)
        return value.detach() if isinstance(value, torch.Tensor) else None
    return None
