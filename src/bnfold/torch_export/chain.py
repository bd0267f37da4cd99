"""Reading per-channel affine chains (batch norms, mul/div/add/sub by constants,
shape-only hops) next to a conv / linear, along a tracked channel axis."""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Number
from typing import Any

import torch
from torch.fx import Node

from .. import fold_math
from ..fold_math import Affine, FoldError
from .ops import AFFINE_OPS, IDENTITY_HOPS, RESHAPE_HOPS, Norm, dropout_is_identity, node_key, parse_norm
from .program import ProgramEditor


@dataclass
class Step:
    """One node of a chain.  ``input`` is the tensor the step reads and
    ``out`` the node carrying its result; ``affine`` is None for a hop."""

    node: Node
    out: Node
    input: Node
    affine: Affine | None
    norm: Norm | None = None
    operands: tuple = ()

    @property
    def name(self) -> str:
        return "batch_norm" if self.norm else node_key(self.node).split("::")[-1].split(".")[0]


class Stop(Exception):
    """The chain cannot go through ``node``; ``reason`` says why."""

    def __init__(self, node: Node, reason: str):
        super().__init__(reason)
        self.node, self.reason = node, reason


def shape_of(node: Any) -> tuple | None:
    val = node.meta.get("val") if isinstance(node, Node) else None
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


def dtype_of(node: Any) -> torch.dtype | None:
    val = node.meta.get("val") if isinstance(node, Node) else None
    return val.dtype if isinstance(val, torch.Tensor) else None


def norm_step(editor: ProgramEditor, norm: Norm, axis: int, channels: int) -> Step:
    """The affine a batch norm applies, or Stop with the reason it cannot fold."""
    node = norm.node
    if norm.problem:
        raise Stop(node, norm.problem)
    if any(u.users for u in norm.extra_outputs):
        raise Stop(node, "its saved mean/invstd outputs are used")
    if norm.output is None:
        raise Stop(node, "its normalized output is unused")
    if axis != 1:
        raise Stop(node, f"it normalizes dim 1 but the producer's channels are on dim {axis} "
                         "(linear + BatchNorm1d folds only over a rank-2 [N, C] input)")
    tensors = {}
    for role in ("weight", "bias", "mean", "var"):
        arg = getattr(norm, role)
        if arg is None:
            tensors[role] = None
            continue
        t = editor.tensor(arg)
        if t is None:
            raise Stop(node, f"its {role} is not a constant of the program (it comes from {editor.describe(arg)})")
        tensors[role] = t
    try:
        aff = fold_math.batch_norm_affine(tensors["mean"], tensors["var"], norm.eps, tensors["weight"], tensors["bias"])
    except FoldError as err:
        raise Stop(node, str(err)) from None
    if aff.channels != channels:
        raise Stop(node, f"it has {aff.channels} channels but the tensor it normalizes has {channels}")
    operands = tuple(a for a in (norm.weight, norm.bias, norm.mean, norm.var) if isinstance(a, Node))
    return Step(node, norm.output, norm.input, aff, norm, operands)


def _constant(editor: ProgramEditor, value: Any) -> torch.Tensor | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, Number):
        return torch.tensor(float(value), dtype=torch.float64)
    return editor.constant_value(value)


def _per_channel(const: torch.Tensor, out_shape: tuple, axis: int, channels: int) -> torch.Tensor | None:
    """``const`` as a 1-D per-channel vector if it broadcasts along ``axis`` alone."""
    if const.dim() > len(out_shape):
        return None
    shape = (1,) * (len(out_shape) - const.dim()) + tuple(const.shape)
    for d, size in enumerate(shape):
        if size != 1 and not (d == axis and size == channels):
            return None
    return const.reshape(-1)


def affine_step(editor: ProgramEditor, node: Node, x: Node, axis: int, channels: int) -> Step:
    """``node`` as ``x * scale + shift`` along ``axis``, or Stop."""
    op = AFFINE_OPS[node_key(node)]
    a, b = node.args[0], node.args[1]
    alpha = node.kwargs.get("alpha", 1)
    if a is x and b is x:
        raise Stop(node, f"'{node.name}' combines the tensor with itself")
    x_first = a is x
    other = b if x_first else a
    const = _constant(editor, other)
    if const is None or not isinstance(alpha, Number):
        raise Stop(node, f"'{node.name}' ({op}) uses {editor.describe(other)}, which is not a constant")
    if shape_of(node) != shape_of(x) or dtype_of(node) != dtype_of(x):
        raise Stop(node, f"'{node.name}' ({op}) broadcasts its constant to another shape or dtype")
    vec = _per_channel(const, shape_of(node), axis, channels)
    if vec is None:
        raise Stop(node, f"'{node.name}' ({op}) has a constant of shape {tuple(const.shape)} that is not "
                         f"per-channel along dim {axis}")
    alpha = float(alpha)
    if op == "mul":
        scale, shift = vec, None
    elif op == "div" and x_first:
        scale, shift = 1.0 / vec.double(), None
    elif op == "add":
        scale, shift = (None, vec * alpha) if x_first else (torch.tensor(alpha), vec)
    elif op == "sub" and x_first:
        scale, shift = None, -alpha * vec.double()
    elif op == "sub":  # const - alpha * x
        scale, shift = torch.tensor(-alpha), vec
    elif op == "rsub" and x_first:  # rsub(x, c) = c - alpha * x
        scale, shift = torch.tensor(-alpha), vec
    elif op == "rsub":  # rsub(c, x) = x - alpha * c
        scale, shift = None, -alpha * vec.double()
    else:
        raise Stop(node, f"'{node.name}' divides by the tensor, which is not an affine map")
    try:
        aff = fold_math.affine(scale, shift, channels)
    except FoldError as err:
        raise Stop(node, f"'{node.name}' ({op}): {err}") from None
    return Step(node, node, x, aff, operands=(other,) if isinstance(other, Node) else ())


def follow_axis(node: Node, x: Node, axis: int) -> int | None:
    """Where the channel axis of ``x`` is in the output of the hop ``node``."""
    key = node_key(node)
    if key in IDENTITY_HOPS:
        return axis
    before, after = shape_of(x), shape_of(node)
    if before is None or after is None:
        return None
    if key.startswith("aten::unsqueeze"):
        d = int(node.args[1])
        d = d + len(after) if d < 0 else d
        return axis + 1 if d <= axis else axis
    if all(isinstance(s, int) for s in before + after):
        lead = math.prod(before[:axis])
        prod = 1
        for j, size in enumerate(after):
            if prod == lead and size == before[axis]:
                return j
            prod *= size
        return None
    # Symbolic sizes: accept only when the dims before the channel, ignoring 1s, are unchanged.
    lead = [str(s) for s in before[:axis] if s != 1]
    for j, size in enumerate(after):
        if [str(s) for s in after[:j] if s != 1] == lead and str(size) == str(before[axis]):
            return j
    return None


def next_step(editor: ProgramEditor, x: Node, axis: int, channels: int) -> tuple[Step, int] | None:
    """The step that consumes ``x`` (its only user) and the channel axis after it.

    Returns None when the user is not part of an affine chain; raises Stop
    when it is a normalization or affine op that cannot fold.
    """
    if len(x.users) != 1:
        users = [u for u in x.users if parse_norm(u) is not None]
        if users:
            raise Stop(users[0], f"the producer's output '{x.name}' has {len(x.users)} users; "
                                 "folding would change the other users")
        return None
    (node,) = x.users
    norm = parse_norm(node)
    if norm is not None:
        if norm.input is not x:
            raise Stop(node, f"it reads '{x.name}' as a parameter, not as its input")
        return norm_step(editor, norm, axis, channels), axis
    key = node_key(node)
    if key in AFFINE_OPS:
        return affine_step(editor, node, x, axis, channels), axis
    if key in IDENTITY_HOPS or key in RESHAPE_HOPS:
        if node.args[0] is not x or not dropout_is_identity(node):
            return None
        new_axis = follow_axis(node, x, axis)
        if new_axis is None:
            reason = f"'{node.name}' moves or merges the channel axis"
            if any(parse_norm(u) for u in node.users):
                raise Stop(next(iter(node.users)), reason)
            return None
        return Step(node, node, x, None), new_axis
    return None
