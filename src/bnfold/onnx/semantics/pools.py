"""ONNX pools: MaxPool, AveragePool, LpPool (every ``auto_pad``, ``ceil_mode``, ``count_include_pad``,
dilations, asymmetric pads) and the global pools.

Each pool pads its input explicitly to the extent its windows cover (the pads, and with ``ceil_mode``
the part of a last window past them), then pools without padding: max over ``-inf`` pads; sums over
zero pads divided by how many elements each window counts."""

from __future__ import annotations

import math

import onnx
import torch
import torch.nn.functional as F

from .values import Ctx, OpImpl, pads_same, s


def _geometry(x: torch.Tensor, a: dict) -> tuple[list, list, list, list, list, list]:
    """``(kernel, strides, dilations, begin pads, end pads, extra)``: the end pads include ``extra``,
    what ``ceil_mode`` adds past the pads."""
    nd = x.dim() - 2
    k = list(a["kernel_shape"])
    st, dil = list(a.get("strides", [1] * nd)), list(a.get("dilations", [1] * nd))
    mode = s(a.get("auto_pad", "NOTSET"))
    if mode in ("SAME_UPPER", "SAME_LOWER"):
        pb = [pads_same(x.shape[2 + i], k[i], st[i], dil[i], mode) for i in range(nd)]
        begin, end = [p[0] for p in pb], [p[1] for p in pb]
    elif mode == "VALID":
        begin, end = [0] * nd, [0] * nd
    else:
        pads = list(a.get("pads", [0] * (2 * nd)))
        begin, end = pads[:nd], pads[nd:]
    extra = []
    for i in range(nd):
        n, eff = x.shape[2 + i], (k[i] - 1) * dil[i] + 1
        span = n + begin[i] + end[i] - eff
        out = (math.ceil(span / st[i]) if a.get("ceil_mode", 0) else span // st[i]) + 1
        if a.get("ceil_mode", 0) and (out - 1) * st[i] >= n + begin[i]:
            out -= 1  # a last window that would start in the end pad is dropped
        extra.append(max(0, (out - 1) * st[i] + eff - (n + begin[i] + end[i])))
    return k, st, dil, begin, [e + x_ for e, x_ in zip(end, extra)], extra


def _torch_pad(begin, end) -> list[int]:
    return [p for i in reversed(range(len(begin))) for p in (begin[i], end[i])]


def _window_sum(x: torch.Tensor, k, st, dil) -> torch.Tensor:
    """The sum of each window of an already padded ``x`` (no padding here)."""
    nd = x.dim() - 2
    if all(d == 1 for d in dil):
        avg = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[nd - 1](x, k, st)
        return avg * math.prod(k)
    n, ch = x.shape[:2]
    ones = torch.ones((1, 1, *k), dtype=x.dtype)
    conv = (F.conv1d, F.conv2d, F.conv3d)[nd - 1]
    y = conv(x.reshape(n * ch, 1, *x.shape[2:]), ones, None, st, 0, dil)
    return y.reshape(n, ch, *y.shape[2:])


def _torch_padding(k: list, begin: list, end: list, extra: list) -> list[int] | None:
    """The pads as torch's pools take them (symmetric, at most half the kernel, with ``ceil_mode``'s part
    past them torch's own), or None."""
    ends = [e - x_ for e, x_ in zip(end, extra)]
    if begin != ends or any(p > kk // 2 for p, kk in zip(begin, k)):
        return None
    return begin


def max_pool(ins, a, c: Ctx):
    x = ins[0]
    nd = x.dim() - 2
    k, st, dil, begin, end, extra = _geometry(x, a)
    pads = _torch_padding(k, begin, end, extra)
    if pads is not None:  # torch's own padding and ceil_mode: the same windows
        fn = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[nd - 1]
        return fn(x, k, st, pads, dil, bool(a.get("ceil_mode", 0)))
    if any(begin) or any(end):
        x = F.pad(x, _torch_pad(begin, end), value=-math.inf)
    return (F.max_pool1d, F.max_pool2d, F.max_pool3d)[nd - 1](x, k, st, 0, dil)


def _counts(x: torch.Tensor, k, st, dil, begin, end, extra, include_pad: bool) -> torch.Tensor:
    """How many elements each window averages: the input's, and the pads' with ``count_include_pad``
    (never the part ``ceil_mode`` adds past the pads)."""
    nd = x.dim() - 2
    ones = torch.ones((1, 1, *x.shape[2:]), dtype=x.dtype)
    if include_pad:
        pads = [e - x_ for e, x_ in zip(end, extra)]
        ones = F.pad(ones, _torch_pad(begin, pads), value=1.0)
        ones = F.pad(ones, _torch_pad([0] * nd, extra), value=0.0)
    else:
        ones = F.pad(ones, _torch_pad(begin, end), value=0.0)
    return _window_sum(ones, k, st, dil)


def average_pool(ins, a, c: Ctx):
    x = ins[0]
    nd = x.dim() - 2
    k, st, dil, begin, end, extra = _geometry(x, a)
    pads = _torch_padding(k, begin, end, extra)
    if pads is not None and not any(extra) and all(d == 1 for d in dil):  # torch's own: the same divisors
        fn = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[nd - 1]
        return fn(x, k, st, pads, False, bool(a.get("count_include_pad", 0)))
    total = _window_sum(F.pad(x, _torch_pad(begin, end)), k, st, dil)
    if not any(begin) and not any(end):
        return total / math.prod(k)
    return total / _counts(x, k, st, dil, begin, end, extra, bool(a.get("count_include_pad", 0)))


def lp_pool(ins, a, c: Ctx):
    x = ins[0]
    p = a.get("p", 2)
    k, st, dil, begin, end, _ = _geometry(x, a)
    total = _window_sum(F.pad(x.abs() ** p, _torch_pad(begin, end)), k, st, dil)
    return total ** (1.0 / p)


def _max_pool_refuses(a: dict, node: onnx.NodeProto) -> str | None:
    if len(node.output) > 1 and node.output[1]:
        return "MaxPool's Indices output"
    if a.get("storage_order", 0):
        return "MaxPool with storage_order"
    return None


def _spatial(x: torch.Tensor) -> tuple[int, ...]:
    return tuple(range(2, x.dim()))


def global_lp_pool(ins, a, c: Ctx):
    x, p = ins[0], a.get("p", 2)
    return (x.abs() ** p).sum(dim=_spatial(x), keepdim=True) ** (1.0 / p)


#: op type -> its row: implementation ``fn(inputs, attributes, ctx)`` and facts (see :class:`~.values.OpImpl`)
POOLS = {
    "MaxPool": OpImpl(max_pool, refuses=_max_pool_refuses),
    "AveragePool": OpImpl(average_pool),
    "LpPool": OpImpl(lp_pool),
    "GlobalAveragePool": OpImpl(lambda ins, a, c: ins[0].mean(dim=_spatial(ins[0]), keepdim=True)),
    "GlobalMaxPool": OpImpl(lambda ins, a, c: ins[0].amax(dim=_spatial(ins[0]), keepdim=True)),
    "GlobalLpPool": OpImpl(global_lp_pool),
}
