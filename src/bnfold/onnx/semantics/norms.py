"""ONNX normalizations and the softmax family: BatchNormalization, LayerNormalization,
GroupNormalization, InstanceNormalization, RMSNormalization, LRN, Softmax, LogSoftmax, Hardmax."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .values import Ctx, OpImpl, axis, since


def batch_norm(ins, a, c: Ctx):
    """BatchNormalization: with its mean and var inputs (eval), or in training mode (``training_mode=1``,
    or ``is_test=0`` before opset 7) with its input's own statistics over every axis but the channel's.
    ``spatial=0`` (before opset 9): statistics per element of ``x.shape[1:]``."""
    x, sc, b, m, v = ins[:5]
    eps = float(a.get("epsilon", 1e-5))
    training = a.get("training_mode", 0) or (not since(c, 7) and not a.get("is_test", 0))
    if a.get("spatial", 1) == 0 and sc.dim() > 1:
        shape = (1, *sc.shape)
        if training:
            m, v = x.mean(0), x.var(0, unbiased=False)
        return (x - m.reshape(shape)) / torch.sqrt(v.reshape(shape) + eps) * sc.reshape(shape) + b.reshape(shape)
    if training:
        return F.batch_norm(x, None, None, sc, b, True, 0.0, eps)
    return F.batch_norm(x, m, v, sc, b, False, 0.0, eps)


def layer_norm(ins, a, c: Ctx):
    """LayerNormalization over the axes from ``axis`` on; outputs Y, Mean, InvStdDev."""
    x, scale = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    dims = tuple(range(axis(a.get("axis", -1), x.dim()), x.dim()))
    eps = a.get("epsilon", 1e-5)
    if c.n_out <= 1 and tuple(scale.shape) == tuple(x.shape[dims[0] :]):
        if bias is None or tuple(bias.shape) == tuple(scale.shape):
            return F.layer_norm(x, scale.shape, scale, bias, eps)
    mean = x.mean(dim=dims, keepdim=True)
    d = x - mean
    inv = 1 / torch.sqrt((d * d).mean(dim=dims, keepdim=True) + eps)
    y = d * inv * scale
    return [y if bias is None else y + bias, mean, inv][: max(c.n_out, 1)]


def rms_norm(ins, a, c: Ctx):
    x, scale = ins[0], ins[1]
    dims = tuple(range(axis(a.get("axis", -1), x.dim()), x.dim()))
    return x / torch.sqrt((x * x).mean(dim=dims, keepdim=True) + a.get("epsilon", 1e-5)) * scale


def group_norm(ins, a, c: Ctx):
    """GroupNormalization; scale and bias per channel (opset 21), or with one entry per group (18)."""
    x, scale, bias = ins
    groups = a["num_groups"]
    n, ch = x.shape[:2]
    xg = x.reshape(n, groups, -1)
    mean = xg.mean(dim=-1, keepdim=True)
    d = xg - mean
    var = (d * d).mean(dim=-1, keepdim=True)
    y = (d / torch.sqrt(var + a.get("epsilon", 1e-5))).reshape(x.shape)
    if scale.numel() == groups and groups != ch:
        scale, bias = scale.repeat_interleave(ch // groups), bias.repeat_interleave(ch // groups)
    shape = (1, ch) + (1,) * (x.dim() - 2)
    return y * scale.reshape(shape) + bias.reshape(shape)


def instance_norm(ins, a, c: Ctx):
    x, scale, bias = ins
    return F.instance_norm(x, None, None, scale, bias, True, 0.0, a.get("epsilon", 1e-5))


def lrn(ins, a, c: Ctx):
    """LRN: ``x / (bias + alpha / size * sum of x² over the channels [c - (size-1)//2, c + ceil((size-1)/2)])^beta``."""
    x = ins[0]
    size, alpha, beta, bias = a["size"], a.get("alpha", 1e-4), a.get("beta", 0.75), a.get("bias", 1.0)
    n, ch = x.shape[:2]
    sq = (x * x).reshape(n, 1, ch, -1)
    sq = F.pad(sq, (0, 0, (size - 1) // 2, math.ceil((size - 1) / 2)))
    total = F.avg_pool2d(sq, (size, 1), 1) * size
    return x / (bias + alpha / size * total.reshape(x.shape)) ** beta


def _softmax_family(fn):
    """Softmax / LogSoftmax / Hardmax: over ``axis`` (default -1) since opset 13; before, over the
    input coerced to 2-D at ``axis`` (default 1): every axis from ``axis`` on, together."""

    def run(ins, a, c: Ctx):
        x = ins[0]
        if since(c, 13):
            return fn(x, axis(a.get("axis", -1), x.dim()))
        ax = axis(a.get("axis", 1), x.dim())
        flat = x.reshape(math.prod(x.shape[:ax]), -1)
        return fn(flat, 1).reshape(x.shape)

    return run


def _hardmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    return F.one_hot(x.argmax(dim=dim), x.shape[dim]).movedim(-1, dim).to(x.dtype)


#: op type -> its row: implementation ``fn(inputs, attributes, ctx)`` and facts (see :class:`~.values.OpImpl`)
NORMS = {
    "BatchNormalization": OpImpl(batch_norm),
    "LayerNormalization": OpImpl(layer_norm),
    "RMSNormalization": OpImpl(rms_norm),
    "GroupNormalization": OpImpl(group_norm),
    "InstanceNormalization": OpImpl(instance_norm),
    "LRN": OpImpl(lrn),
    "Softmax": OpImpl(_softmax_family(lambda x, d: torch.softmax(x, dim=d))),
    "LogSoftmax": OpImpl(_softmax_family(lambda x, d: torch.log_softmax(x, dim=d))),
    "Hardmax": OpImpl(_softmax_family(_hardmax)),
}
