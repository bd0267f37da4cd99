"""Elementwise ONNX ops: arithmetic, activations, comparisons and logic, casts (numpy-style broadcasting,
as the ops define since opset 7)."""

from __future__ import annotations

import math

import onnx
import torch
import torch.nn.functional as F

from .values import Ctx, OpImpl, given, s, scalar, since

_FLOAT_TYPES = (
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.DOUBLE,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.BFLOAT16,
)


def _same_kind(y: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``y`` back in ``like``'s dtype when that is an integer one (ONNX keeps its operand type)."""
    return y if like.is_floating_point() or y.dtype == like.dtype else y.to(like.dtype)


def div(ins, a, c: Ctx):
    x, y = ins
    if not x.is_floating_point() and not y.is_floating_point():
        return torch.div(x, y, rounding_mode="trunc")  # integer Div truncates toward zero
    return x / y


def pow_(ins, a, c: Ctx):
    x, y = ins
    return _same_kind(torch.pow(x, y), x)


def mod(ins, a, c: Ctx):
    x, y = ins
    if a.get("fmod", 0):
        return torch.fmod(x, y)
    return torch.remainder(x, y)


def mean(ins, a, c: Ctx):
    xs = torch.broadcast_tensors(*ins)
    out = xs[0]
    for x in xs[1:]:
        out = out + x
    return out / len(xs)


def clip(ins, a, c: Ctx):
    """Clip: bounds as attributes ``min``/``max`` before opset 11, as optional inputs since."""
    x = ins[0]
    if since(c, 11):
        lo = scalar(ins[1]) if given(ins, 1) else None
        hi = scalar(ins[2]) if given(ins, 2) else None
    else:
        lo, hi = a.get("min", -math.inf), a.get("max", math.inf)
    if lo is None and hi is None:
        return x.clone()
    if lo is not None and hi is not None and lo > hi:
        return torch.full_like(x, hi)
    return torch.clamp(x, lo, hi)


def cast(ins, a, c: Ctx):
    """Cast: floats to the run's float dtype (the profile decides their precision), bool, integers int64."""
    return _cast(ins[0], a["to"], c)


def _cast(x: torch.Tensor, to: int, c: Ctx) -> torch.Tensor:
    if to in _FLOAT_TYPES:
        return x.to(c.float_dtype)
    if to == onnx.TensorProto.BOOL:
        return x.to(torch.bool)
    if x.is_floating_point():
        x = torch.trunc(x)
    return x.to(torch.int64)


def cast_like(ins, a, c: Ctx):
    x, like = ins[0], ins[1]
    if like.is_floating_point():
        return x.to(c.float_dtype)
    return x.to(torch.bool) if like.dtype == torch.bool else _cast(x, onnx.TensorProto.INT64, c)


def prelu(ins, a, c: Ctx):
    x, slope = ins
    return torch.where(x < 0, x * slope, x)


def selu(ins, a, c: Ctx):
    alpha, gamma = a.get("alpha", 1.67326319217681884765625), a.get("gamma", 1.05070102214813232421875)
    x = ins[0]
    return gamma * torch.where(x > 0, x, alpha * (torch.exp(x) - 1))


def elu(ins, a, c: Ctx):
    x, alpha = ins[0], a.get("alpha", 1.0)
    return torch.where(x > 0, x, alpha * (torch.exp(x) - 1))


def celu(ins, a, c: Ctx):
    x, alpha = ins[0], a.get("alpha", 1.0)
    return torch.clamp(x, min=0) + torch.clamp(alpha * (torch.exp(x / alpha) - 1), max=0)


def gelu(ins, a, c: Ctx):
    return F.gelu(ins[0], approximate="tanh" if s(a.get("approximate", "none")) == "tanh" else "none")


def hard_sigmoid(ins, a, c: Ctx):
    return torch.clamp(ins[0] * a.get("alpha", 0.2) + a.get("beta", 0.5), 0, 1)


def where(ins, a, c: Ctx):
    return torch.where(ins[0].to(torch.bool), ins[1], ins[2])


def is_inf(ins, a, c: Ctx):
    x = ins[0]
    return (torch.isposinf(x) & bool(a.get("detect_positive", 1))) | (
        torch.isneginf(x) & bool(a.get("detect_negative", 1))
    )


def bitwise(fn):
    return lambda ins, a, c: fn(ins[0].to(torch.bool), ins[1].to(torch.bool))


def _unary(fn):
    return lambda ins, a, c: fn(ins[0])


def _binary(fn):
    return lambda ins, a, c: fn(ins[0], ins[1])


#: op type -> its row: implementation ``fn(inputs, attributes, ctx)`` and facts (see :class:`~.values.OpImpl`)
ELEMENTWISE = {
    "Add": OpImpl(_binary(torch.add)),
    "Sub": OpImpl(_binary(torch.sub)),
    "Mul": OpImpl(_binary(torch.mul)),
    "Div": OpImpl(div),
    "Pow": OpImpl(pow_),
    "Mod": OpImpl(mod),
    "Sum": OpImpl(lambda ins, a, c: _fold(torch.add, ins)),
    "Mean": OpImpl(mean),
    "Max": OpImpl(lambda ins, a, c: _fold(torch.maximum, ins)),
    "Min": OpImpl(lambda ins, a, c: _fold(torch.minimum, ins)),
    "Neg": OpImpl(_unary(torch.neg)),
    "Abs": OpImpl(_unary(torch.abs)),
    "Sign": OpImpl(_unary(torch.sign)),
    "Reciprocal": OpImpl(_unary(torch.reciprocal)),
    "Sqrt": OpImpl(_unary(torch.sqrt)),
    "Exp": OpImpl(_unary(torch.exp)),
    "Log": OpImpl(_unary(torch.log)),
    "Floor": OpImpl(_unary(torch.floor)),
    "Ceil": OpImpl(_unary(torch.ceil)),
    "Round": OpImpl(_unary(torch.round)),  # ties to even, as ONNX
    "Erf": OpImpl(_unary(torch.erf)),
    "Sin": OpImpl(_unary(torch.sin)),
    "Cos": OpImpl(_unary(torch.cos)),
    "Tan": OpImpl(_unary(torch.tan)),
    "Asin": OpImpl(_unary(torch.asin)),
    "Acos": OpImpl(_unary(torch.acos)),
    "Atan": OpImpl(_unary(torch.atan)),
    "Sinh": OpImpl(_unary(torch.sinh)),
    "Cosh": OpImpl(_unary(torch.cosh)),
    "Relu": OpImpl(_unary(torch.relu)),
    "Sigmoid": OpImpl(_unary(torch.sigmoid)),
    "Tanh": OpImpl(_unary(torch.tanh)),
    "Softplus": OpImpl(_unary(F.softplus)),
    "Softsign": OpImpl(_unary(F.softsign)),
    "Mish": OpImpl(_unary(F.mish)),
    "HardSwish": OpImpl(_unary(F.hardswish)),
    "HardSigmoid": OpImpl(hard_sigmoid),
    "LeakyRelu": OpImpl(lambda ins, a, c: F.leaky_relu(ins[0], a.get("alpha", 0.01))),
    "ThresholdedRelu": OpImpl(lambda ins, a, c: torch.where(ins[0] > a.get("alpha", 1.0), ins[0], 0.0)),
    "PRelu": OpImpl(prelu),
    "Selu": OpImpl(selu),
    "Elu": OpImpl(elu),
    "Celu": OpImpl(celu),
    "Gelu": OpImpl(gelu),
    "Clip": OpImpl(clip, static=(1, 2)),
    "Cast": OpImpl(cast),
    "CastLike": OpImpl(cast_like),
    "Where": OpImpl(where),
    "Equal": OpImpl(_binary(torch.eq)),
    "Less": OpImpl(_binary(torch.lt)),
    "LessOrEqual": OpImpl(_binary(torch.le)),
    "Greater": OpImpl(_binary(torch.gt)),
    "GreaterOrEqual": OpImpl(_binary(torch.ge)),
    "Not": OpImpl(lambda ins, a, c: torch.logical_not(ins[0])),
    "And": OpImpl(bitwise(torch.logical_and)),
    "Or": OpImpl(bitwise(torch.logical_or)),
    "Xor": OpImpl(bitwise(torch.logical_xor)),
    "IsNaN": OpImpl(_unary(torch.isnan)),
    "IsInf": OpImpl(is_inf),
}


def _fold(fn, ins):
    xs = torch.broadcast_tensors(*ins)
    out = xs[0]
    for x in xs[1:]:
        out = fn(out, x)
    return out
