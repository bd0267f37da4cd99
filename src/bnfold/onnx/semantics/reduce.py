"""ONNX reductions: ReduceSum / Mean / Max / Min / Prod / L1 / L2 / LogSum / LogSumExp / SumSquare,
ArgMax / ArgMin, TopK, CumSum."""

from __future__ import annotations

import torch

from .values import Ctx, OpImpl, axis, given, ints, scalar, since


def _reduction(fn):
    def run(ins, a, c: Ctx):
        x = ins[0]
        axes = ints(ins[1]) if given(ins, 1) else a.get("axes")
        keep = bool(a.get("keepdims", 1))
        if not axes:
            if a.get("noop_with_empty_axes", 0):
                return x
            axes = list(range(x.dim()))
        dims = tuple(sorted({axis(v, x.dim()) for v in axes}))
        if x.dim() == 0:
            return fn(x.reshape(1), (0,), False)
        return fn(x, dims, keep)

    return run


def _prod(x, dims, keep):
    for d in sorted(dims, reverse=True):
        x = x.prod(dim=d, keepdim=keep)
    return x


def _amax(x, dims, keep):
    return x.amax(dim=dims, keepdim=keep) if x.numel() else x.sum(dim=dims, keepdim=keep) - torch.inf


def _amin(x, dims, keep):
    return x.amin(dim=dims, keepdim=keep) if x.numel() else x.sum(dim=dims, keepdim=keep) + torch.inf


def _arg(largest: bool):
    def run(ins, a, c: Ctx):
        x = ins[0]
        ax = axis(a.get("axis", 0), x.dim())
        keep = bool(a.get("keepdims", 1))
        y = x.flip(ax) if a.get("select_last_index", 0) else x
        idx = y.argmax(dim=ax, keepdim=keep) if largest else y.argmin(dim=ax, keepdim=keep)
        return x.shape[ax] - 1 - idx if a.get("select_last_index", 0) else idx

    return run


def top_k(ins, a, c: Ctx):
    """TopK: ``k`` as attribute before opset 10, as input since; ties keep the lower index first."""
    x = ins[0]
    k = int(scalar(ins[1])) if since(c, 10) and given(ins, 1) else a["k"]
    ax = axis(a.get("axis", -1), x.dim())
    largest = bool(a.get("largest", 1))
    order = torch.argsort(x, dim=ax, descending=largest, stable=True)
    idx = order.narrow(ax, 0, k)
    return [torch.gather(x, ax, idx), idx]


def cum_sum(ins, a, c: Ctx):
    x = ins[0]
    ax = axis(int(scalar(ins[1])), x.dim())
    y = x.flip(ax) if a.get("reverse", 0) else x
    out = y.cumsum(ax)
    if a.get("exclusive", 0):
        out = out - y
    return out.flip(ax) if a.get("reverse", 0) else out


#: op type -> its row: implementation ``fn(inputs, attributes, ctx)`` and facts (see :class:`~.values.OpImpl`)
REDUCTIONS = {
    "ReduceSum": OpImpl(_reduction(lambda x, d, k: x.sum(dim=d, keepdim=k)), static=(1,)),
    "ReduceMean": OpImpl(_reduction(lambda x, d, k: x.mean(dim=d, keepdim=k)), static=(1,)),
    "ReduceMax": OpImpl(_reduction(_amax), static=(1,)),
    "ReduceMin": OpImpl(_reduction(_amin), static=(1,)),
    "ReduceProd": OpImpl(_reduction(_prod), static=(1,)),
    "ReduceL1": OpImpl(_reduction(lambda x, d, k: x.abs().sum(dim=d, keepdim=k)), static=(1,)),
    "ReduceL2": OpImpl(_reduction(lambda x, d, k: torch.sqrt((x * x).sum(dim=d, keepdim=k))), static=(1,)),
    "ReduceLogSum": OpImpl(_reduction(lambda x, d, k: torch.log(x.sum(dim=d, keepdim=k))), static=(1,)),
    "ReduceLogSumExp": OpImpl(_reduction(lambda x, d, k: torch.logsumexp(x, dim=d, keepdim=k)), static=(1,)),
    "ReduceSumSquare": OpImpl(_reduction(lambda x, d, k: (x * x).sum(dim=d, keepdim=k)), static=(1,)),
    "ArgMax": OpImpl(_arg(True)),
    "ArgMin": OpImpl(_arg(False)),
    "TopK": OpImpl(top_k, static=(1,)),
    "CumSum": OpImpl(cum_sum, static=(1,)),
}
