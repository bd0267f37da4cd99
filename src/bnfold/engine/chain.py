"""Reading an affine chain next to a layer: batch norms, elementwise ops with
per-channel constants and shape-only hops, along a tracked channel axis.

``chain_after(graph, layer)`` walks from the layer's output to its users,
``chain_before(graph, layer)`` from the layer's input to its producers.  A
node that is part of a chain but cannot fold raises :class:`Stop` with the
reason; anything else ends the walk.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import fold_math
from ..fold_math import FoldError
from ..report import Code
from .axes import channel_axis
from .graph import ChainStep, GraphAdapter, Hop, Layer, Norm

#: A chain longer than this is cut (a fold is never worth an unbounded walk).
MAX_CHAIN = 256


def same_value(a: Any, b: Any) -> bool:
    """Whether two value handles name the same value (handles compare equal; numbers never match)."""
    return isinstance(a, type(b)) and not isinstance(a, (int, float)) and a == b


def _users(users: list) -> str:
    """``"2 users"``, naming those outside the graph (a user of None)."""
    outside = sum(u is None for u in users)
    return f"{len(users)} users" + (f" ({outside} of them a graph output or a subgraph)" if outside else "")


class Stop(Exception):
    """The chain cannot go through ``node``; ``reason`` says why, ``code`` (a :class:`Code`) what kind of why."""

    def __init__(self, node: Any, reason: str, code: Code = Code.FOLD_MATH):
        super().__init__(reason)
        self.node, self.reason, self.code = node, reason, code


def norm_step(
    graph: GraphAdapter, norm: Norm, axis: int | None, channels: int, rank: int | None, lost: str = ""
) -> ChainStep:
    """The affine a batch norm applies along ``axis``, or Stop with the reason it cannot fold.
    ``axis`` None: a hop lost the channel axis, ``lost`` says which."""
    node = norm.node
    if norm.problem:
        raise Stop(node, norm.problem, norm.problem_code)
    if axis is None:
        raise Stop(node, lost, Code.AXIS_LOST)
    if norm.affine_only:
        return _norm_affine_step(graph, norm, axis, channels, rank)
    if norm.statistics_used:
        raise Stop(node, "its saved statistics outputs are used", Code.STATISTICS_USED)
    if norm.output is None:
        raise Stop(node, "its normalized output is unused", Code.OUTPUT_UNUSED)
    if rank is None:
        raise Stop(
            node, f"it normalizes axis {norm.axis}, and the rank of the tensor it reads is unknown", Code.RANK_UNKNOWN
        )
    if axis != norm.axis:
        raise Stop(
            node,
            f"it normalizes axis {norm.axis} but the layer's channels are on axis {axis} of the "
            f"rank-{rank} tensor (a linear layer's channels are its last axis: a BatchNorm folds into "
            "it over a rank-2 [N, C] tensor, e.g. after a flatten)",
            Code.AXIS_MISMATCH,
        )
    tensors = {}
    for role in ("weight", "bias", "mean", "var"):
        value = getattr(norm, role)
        if value is None:
            tensors[role] = None
            continue
        t = graph.constant(value)
        if t is None:
            raise Stop(node, f"its {role} is not a constant (it comes from {graph.describe(value)})", Code.NOT_CONSTANT)
        tensors[role] = t
    try:
        aff = fold_math.batch_norm_affine(tensors["mean"], tensors["var"], norm.eps, tensors["weight"], tensors["bias"])
    except FoldError as err:
        raise Stop(node, str(err), err.code) from None
    if aff.channels != channels:
        raise Stop(
            node, f"it has {aff.channels} channels but the tensor it normalizes has {channels}", Code.CHANNEL_MISMATCH
        )
    operands = tuple(v for v in (norm.weight, norm.bias, norm.mean, norm.var) if v is not None)
    return ChainStep(node, norm.input, norm.output, aff, norm.op, norm, operands)


def _norm_affine_step(graph: GraphAdapter, norm: Norm, axis: int, channels: int, rank: int | None) -> ChainStep:
    """The elementwise affine of a LayerNorm / RMSNorm / GroupNorm, which folds without the normalization."""
    node = norm.node
    if norm.statistics_used:
        raise Stop(node, "its saved statistics outputs are used", Code.STATISTICS_USED)
    if rank is None:
        raise Stop(
            node, f"its affine is along axis {norm.axis}, and the rank of the tensor is unknown", Code.RANK_UNKNOWN
        )
    if axis != norm.axis % rank:
        raise Stop(
            node,
            f"its affine is along axis {norm.axis % rank} but the layer's channels are on axis {axis}",
            Code.AXIS_MISMATCH,
        )
    tensors = []
    for role in ("weight", "bias"):
        value = getattr(norm, role)
        t = None if value is None else graph.constant(value)
        if value is not None and t is None:
            raise Stop(node, f"its {role} is not a constant (it comes from {graph.describe(value)})", Code.NOT_CONSTANT)
        tensors.append(t)
    try:
        aff = fold_math.affine(tensors[0], tensors[1], channels)
    except FoldError as err:
        raise Stop(node, f"its affine: {err}", err.code) from None
    if tensors[0] is not None and tensors[0].numel() != channels:
        raise Stop(
            node,
            f"its weight has {tensors[0].numel()} elements but the layer has {channels} channels",
            Code.CHANNEL_MISMATCH,
        )
    operands = tuple(v for v in (norm.weight, norm.bias) if v is not None)
    return ChainStep(node, norm.input, norm.output, aff, norm.op, norm, operands)


def per_channel(const: torch.Tensor, rank: int | None, axis: int | None, channels: int) -> torch.Tensor | str:
    """``const`` as a 1-D per-channel vector if it broadcasts along ``axis`` alone, else why not.
    ``axis`` None (the channel axis was lost): only a scalar is per-channel."""
    shape = tuple(const.shape)
    if axis is None:
        if const.numel() != 1 or (rank is not None and len(shape) > rank):
            return f"its constant of shape {list(shape)} is not a scalar, and the channel axis is lost"
        return const.reshape(-1)
    if rank is None:
        if len(shape) > 1 or (shape and shape[0] not in (1, channels)) or axis != -1:
            return f"its constant has shape {list(shape)} and the rank of the data is unknown"
        return const.reshape(-1)
    if len(shape) > rank:
        return f"its constant of shape {list(shape)} broadcasts the rank-{rank} tensor to a higher rank"
    axis = axis % rank
    for j, size in enumerate(shape):
        d = rank - len(shape) + j
        if size != 1 and not (d == axis and size == channels):
            return f"its constant of shape {list(shape)} is not per-channel along axis {axis}"
    return const.reshape(-1)


def binary_step(
    graph: GraphAdapter, node: Any, x: Any, axis: int | None, channels: int, rank: int | None
) -> ChainStep | None:
    """The elementwise op ``node`` as ``x * scale + shift`` along ``axis``; None when
    its other operand is not a constant (no affine op at all), Stop when it does not fold."""
    op = graph.binary(node)
    name = op.name or op.op
    what = f"{name} {graph.describe(op.output)}"
    if same_value(op.a, x) and same_value(op.b, x):
        return None
    x_first = same_value(op.a, x)
    other = op.b if x_first else op.a
    alpha = graph.constant(op.alpha) if op.alpha is not None and not isinstance(op.alpha, (int, float)) else op.alpha
    if alpha is None:
        return None
    out_info, x_info = graph.shape_info(op.output), graph.shape_info(x)
    if out_info.rank != x_info.rank or (out_info.dtype is not None and out_info.dtype != x_info.dtype):
        if graph.is_constant(other):  # told without a float64 copy of an ONNX constant
            raise Stop(node, f"{what} broadcasts its constant to another rank or dtype", Code.BROADCAST)
        return None
    # one ask: a computed constant (a torch program's ``p * 2``) is evaluated once here, and a streamed initializer
    # is its shape, which alone refuses a constant that is no per-channel vector (it is read only to fold)
    const = graph.constant(other, values=False)
    if const is None:
        return None
    vec = per_channel(const, rank, axis, channels)
    if not isinstance(vec, str) and vec.is_meta:
        vec = per_channel(graph.constant(other), rank, axis, channels)
    if isinstance(vec, str):
        raise Stop(node, f"{what}: {vec}", Code.AXIS_LOST if axis is None else Code.NOT_PER_CHANNEL)
    try:
        aff = fold_math.binary_affine(op.op, vec, x_first, channels, float(alpha))
    except FoldError as err:
        raise Stop(node, f"{what}: {err}", err.code) from None
    return ChainStep(node, x, op.output, aff, name, operands=(other,))


def _hop_step(graph: GraphAdapter, hop: Hop, axis: int | None, forward: bool) -> tuple[ChainStep, int | None, str]:
    """The hop as a step, the channel axis after it (None: lost) and, if lost here, why."""
    step = ChainStep(hop.node, hop.input, hop.output, None, hop.op, monotone=hop.monotone)
    if axis is None:
        return step, None, ""
    new_axis = graph.follow_axis(hop, axis, forward)
    if isinstance(new_axis, str):
        return step, None, new_axis  # scalars still fold through it
    return step, new_axis, ""


def chain_after(graph: GraphAdapter, layer: Layer, channels: int) -> tuple[list[ChainStep], Stop | None]:
    """The steps that follow ``layer`` (each the only user of the one before), and
    the Stop that ended the walk, if one did."""
    x = layer.output
    rank = graph.shape_info(x).rank
    axis = channel_axis(layer.out_axis, rank)
    steps: list[ChainStep] = []
    lost = ""
    try:
        while len(steps) < MAX_CHAIN:
            users = graph.users(x)
            if len(users) != 1 or users[0] is None:
                norm = next(
                    (n for u in users if u is not None and (n := graph.norm(u)) is not None and not n.affine_only), None
                )
                if norm is not None:
                    raise Stop(
                        norm.node,
                        f"the value it reads, {graph.describe(x)}, has {_users(users)}; "
                        "folding would change what the others see",
                        Code.SHARED_VALUE,
                    )
                break
            node = users[0]
            norm = graph.norm(node)
            if norm is not None and norm.affine_only:
                break  # a LayerNorm's affine follows its normalization: never into the layer before
            if norm is not None:
                if not same_value(norm.input, x):
                    raise Stop(
                        node, f"it reads {graph.describe(x)} as a parameter, not as its input", Code.NOT_ITS_INPUT
                    )
                steps.append(norm_step(graph, norm, axis, channels, rank, lost))
            elif graph.binary(node) is not None:
                step = binary_step(graph, node, x, axis, channels, rank)
                if step is None:
                    break
                steps.append(step)
            elif (hop := graph.hop(node)) is not None and same_value(hop.input, x):
                step, axis, why = _hop_step(graph, hop, axis, forward=True)
                lost = lost or why
                rank = graph.shape_info(step.output).rank
                steps.append(step)
            else:
                break
            steps[-1].axis, steps[-1].rank = axis, rank
            x = steps[-1].output
    except Stop as stop:
        return steps, stop
    return steps, None


def chain_before(graph: GraphAdapter, layer: Layer, channels: int) -> tuple[list[ChainStep], Stop | None]:
    """The steps that lead to ``layer``'s input, nearest the layer last (each
    the only user of the one before it), and the Stop that ended the walk."""
    rank = graph.shape_info(layer.input).rank
    axis = channel_axis(layer.in_axis, rank)
    return chain_up(graph, layer.input, axis, channels)


def chain_up(
    graph: GraphAdapter, x: Any, axis: int | None, channels: int, fanout: bool = False
) -> tuple[list[ChainStep], Stop | None]:
    """The steps that lead to the value ``x`` (channels on ``axis``), nearest ``x`` last.
    ``fanout``: ``x`` itself may have several users (the caller folds into all of them)."""
    rank = graph.shape_info(x).rank
    steps: list[ChainStep] = []
    lost = ""
    try:
        while len(steps) < MAX_CHAIN:
            users = graph.users(x)
            node = graph.producer(x)
            if fanout and not steps and node is not None and None not in users:
                users = users[:1]  # the caller folds into every user
            if node is None or len(users) != 1 or users[0] is None:
                if (
                    node is not None
                    and (norm := graph.norm(node)) is not None
                    and same_value(norm.output, x)
                    and len(users) > 1
                ):
                    raise Stop(
                        norm.node,
                        f"its output {graph.describe(x)} has {_users(users)}; "
                        "folding into one layer would change what the others see",
                        Code.SHARED_VALUE,
                    )
                break
            norm = graph.norm(node)
            if norm is not None:
                if not same_value(norm.output, x):
                    break
                step = norm_step(graph, norm, axis, channels, rank, lost)
            elif (op := graph.binary(node)) is not None:
                data = [v for v in (op.a, op.b) if not graph.is_constant(v)]
                if len(data) != 1:
                    break
                try:
                    step = binary_step(graph, node, data[0], axis, channels, rank)
                except Stop:
                    step = None  # an op that is not per-channel here is simply not part of the chain
                if step is None:
                    break
            elif (hop := graph.hop(node)) is not None:
                step, axis, why = _hop_step(graph, hop, axis, forward=False)
                lost = lost or why
            else:
                break
            steps.insert(0, step)
            if step.norm is not None and step.norm.affine_only:
                break  # above it is the unnormalized tensor
            x = step.input
            rank = graph.shape_info(x).rank
    except Stop as stop:
        return steps, stop
    return steps, None
