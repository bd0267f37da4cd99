"""The ``fp16-acc`` profile's layers and reductions: conv / linear / matmul, sums, means and average pools
accumulating in fp16.

The reduction is cut into chunks of ``chunk`` input channels (conv), features (linear, matmul) or reduced
elements (sum, mean); each chunk is summed in float32 and rounded to fp16, and the chunk sums are added one at a
time in fp16.  The bias is added last, in fp16; a mean divides the fp16 sum (a GPU's mean kernel sums first: an SE
block's mean over 56x56 positions passes 65504 where the mean does not).  An average pool's window sum is rounded to
fp16 once before the divide (windows are small: up to ``chunk`` elements, one chunk).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from .profiles import round_fp16


def _accumulate(partials: Iterator[torch.Tensor]) -> torch.Tensor:
    """Round each float32 partial sum to fp16 and add them one by one in fp16.

    The adds run on float16 tensors: PyTorch adds two halves in float32 and
    rounds the sum to fp16 (round to nearest even), which is the correctly
    rounded fp16 sum (the float32 sum of two halves is either exact or its
    rounding cannot move it across an fp16 rounding boundary).
    """
    acc = None
    for p in partials:
        p = p.to(torch.float16)
        acc = p if acc is None else acc + p
    return acc.to(torch.float32)


def _chunks(n: int, chunk: int) -> list[slice]:
    return [slice(i, min(i + chunk, n)) for i in range(0, n, chunk)]


def conv(op: Callable, kw: dict[str, Any], chunk: int, transposed: bool) -> torch.Tensor:
    """A conv (``kw`` holds its arguments by schema name) with fp16 accumulation.

    ``transposed``: the op is a transposed conv (weight ``[in, out/groups, *k]``).
    """
    x, w, bias = kw["input"], kw["weight"], kw.get("bias")
    groups = int(kw.get("groups", 1))
    cin_g = w.shape[0] // groups if transposed else w.shape[1]
    call = dict(kw, bias=None)

    def partials():
        for s in _chunks(cin_g, chunk):
            idx = torch.cat([torch.arange(g * cin_g + s.start, g * cin_g + s.stop) for g in range(groups)])
            call["input"] = x.index_select(1, idx)
            call["weight"] = w.index_select(0, idx) if transposed else w[:, s]
            yield op(**call)

    out = _accumulate(partials())
    if bias is not None:
        out = round_fp16(out + bias.reshape(1, -1, *([1] * (out.dim() - 2))))
    return out


def linear(name: str, kw: dict[str, Any], chunk: int) -> torch.Tensor:
    """linear / addmm / mm / bmm / baddbmm / matmul with fp16 accumulation."""
    bias, alpha, beta = None, 1, 1
    if name == "linear":
        a, b, bias = kw["input"], kw["weight"].t(), kw.get("bias")
    elif name in ("addmm", "baddbmm"):
        bias, alpha, beta = kw["self"], kw.get("alpha", 1), kw.get("beta", 1)
        a, b = (kw["mat1"], kw["mat2"]) if name == "addmm" else (kw["batch1"], kw["batch2"])
    elif name == "matmul":
        a, b = kw["self"], kw["other"]
    elif name in ("mm", "bmm"):
        a, b = kw["self"], kw["mat2"]
    else:
        raise NotImplementedError(f"fp16 accumulation of {name!r} is not emulated")
    k = a.shape[-1]
    # one matmul per chunk: a batched matmul over all chunks at once writes chunks x outputs
    # partials through memory and measured ~3x slower
    vec = b.dim() == 1
    out = _accumulate(torch.matmul(a[..., s], b[s] if vec else b[..., s, :]) for s in _chunks(k, chunk))
    if alpha != 1:
        out = round_fp16(out * alpha)
    if bias is not None:
        out = round_fp16(out + (bias * beta if beta != 1 else bias))
    return out


def reduction(x: torch.Tensor, dims, keepdim: bool, mean: bool, chunk: int) -> torch.Tensor:
    """``x.sum(dims)`` (``mean``: ``x.mean(dims)``) with fp16 accumulation (``dims``: None or empty for all)."""
    nd = x.dim()
    axes = sorted({int(d) % nd for d in dims}) if dims else list(range(nd))
    rest = [d for d in range(nd) if d not in axes]
    flat = x.permute(*rest, *axes).reshape(*(x.shape[d] for d in rest), -1)
    k = flat.shape[-1]
    out = _accumulate(flat[..., s].sum(-1) for s in _chunks(k, chunk)) if k else flat.sum(-1)
    if mean:
        out = round_fp16(out / k)
    if keepdim:
        out = out.reshape([1 if d in axes else x.shape[d] for d in range(nd)])
    return out


def pool(averaged: torch.Tensor, window: int) -> torch.Tensor:
    """An average pool's output ``averaged`` (float32) as a runtime that sums each window in fp16 computes it."""
    return round_fp16(round_fp16(averaged * window) / window)
