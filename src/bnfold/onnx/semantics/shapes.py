"""ONNX ops that move, select or make values without arithmetic: reshapes, slices, splits, gathers,
scatters, pads, tiles, and the ops that make tensors from shapes (Shape, ConstantOfShape, Range)."""

from __future__ import annotations

import math

import numpy as np
import torch
from onnx import numpy_helper

from .values import Ctx, OpImpl, axis, given, ints, s, scalar, since, tensor


def reshape(ins, a, c: Ctx):
    x, shape = ins[0], ints(ins[1])
    if not a.get("allowzero", 0):
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return x.reshape(shape)


def _axes(ins, a):
    """The axes of Squeeze / Unsqueeze: an attribute before opset 13, an input since."""
    if given(ins, 1):
        return ints(ins[1])
    return a.get("axes")


def unsqueeze(ins, a, c: Ctx):
    x, axes = ins[0], _axes(ins, a)
    r = x.dim() + len(axes)
    for ax in sorted(axis(ax, r) for ax in axes):
        x = x.unsqueeze(ax)
    return x


def squeeze(ins, a, c: Ctx):
    x, axes = ins[0], _axes(ins, a)
    if axes is None:
        return x.reshape([d for d in x.shape if d != 1])
    for ax in sorted((axis(ax, x.dim()) for ax in axes), reverse=True):
        x = x.squeeze(ax)
    return x


def flatten(ins, a, c: Ctx):
    x = ins[0]
    ax = a.get("axis", 1)
    ax = ax + x.dim() if ax < 0 else ax
    return x.reshape(math.prod(x.shape[:ax]), math.prod(x.shape[ax:]))


def transpose(ins, a, c: Ctx):
    x = ins[0]
    perm = a.get("perm")
    return x.permute(*(perm if perm is not None else reversed(range(x.dim()))))


def slice_(ins, a, c: Ctx):
    """Slice: starts/ends/axes as attributes before opset 10, as inputs (with steps) since."""
    x = ins[0]
    if since(c, 10) or "starts" not in a:
        starts, ends = ints(ins[1]), ints(ins[2])
        axes = ints(ins[3]) if given(ins, 3) else list(range(len(starts)))
        steps = ints(ins[4]) if given(ins, 4) else [1] * len(starts)
    else:
        starts, ends = a["starts"], a["ends"]
        axes, steps = a.get("axes", list(range(len(starts)))), [1] * len(starts)
    idx = [slice(None)] * x.dim()
    flips = []
    for st, en, ax, step in zip(starts, ends, axes, steps):
        ax, n = axis(ax, x.dim()), x.shape[axis(ax, x.dim())]
        if step > 0:
            st, en = (min(max(v + n if v < 0 else v, 0), n) for v in (st, en))
            idx[ax] = slice(st, max(st, en), step)
        else:  # a negative step: the forward slice of the same elements, flipped
            st = min(max(st + n if st < 0 else st, -1), n - 1)
            en = min(max(en + n if en < 0 else en, -1), n - 1)
            if st <= en:
                idx[ax] = slice(0, 0)
            else:
                cnt = (st - en - 1) // (-step) + 1
                first = st - (cnt - 1) * (-step)
                idx[ax] = slice(first, st + 1, -step)
                flips.append(ax)
    y = x[tuple(idx)]
    return y.flip(flips) if flips else y


def concat(ins, a, c: Ctx):
    xs = [x for x in ins if x is not None]
    ax = a["axis"]
    rank = max(x.dim() for x in xs)
    return torch.cat([x for x in xs if x.dim() == rank], dim=axis(ax, rank))


def split(ins, a, c: Ctx):
    """Split: sizes as attribute ``split`` (before opset 13) or input 1 (since), else equal parts
    (since opset 18 ``num_outputs`` parts, the last one smaller)."""
    x = ins[0]
    ax = axis(a.get("axis", 0), x.dim())
    n = x.shape[ax]
    if given(ins, 1):
        sizes = ints(ins[1])
    elif "split" in a:
        sizes = list(a["split"])
    else:
        parts = a.get("num_outputs", c.n_out)
        size = math.ceil(n / parts)
        sizes = [size] * (parts - 1) + [n - size * (parts - 1)]
        if sizes[-1] < 0:
            raise ValueError(f"cannot split {n} elements into {parts} parts")
    if sum(sizes) != n:
        raise ValueError(f"split sizes {sizes} do not add up to {n}")
    return list(torch.split(x, sizes, dim=ax))


def gather(ins, a, c: Ctx):
    x, idx = ins[0], ins[1]
    ax = axis(a.get("axis", 0), x.dim())
    flat = tensor(idx).long()
    flat = torch.where(flat < 0, flat + x.shape[ax], flat)
    return x.index_select(ax, flat.reshape(-1)).reshape(x.shape[:ax] + flat.shape + x.shape[ax + 1 :])


def gather_elements(ins, a, c: Ctx):
    x, idx = ins[0], ins[1].long()
    ax = axis(a.get("axis", 0), x.dim())
    return torch.gather(x, ax, torch.where(idx < 0, idx + x.shape[ax], idx))


def gather_nd(ins, a, c: Ctx):
    """GatherND, with ``batch_dims`` leading axes shared by data and indices."""
    x, idx = ins[0], ins[1].long()
    b, k = a.get("batch_dims", 0), idx.shape[-1]
    idx = torch.where(idx < 0, idx + torch.tensor(x.shape[b : b + k]), idx)
    batch = math.prod(x.shape[:b])
    xf, idf = x.reshape(batch, *x.shape[b:]), idx.reshape(batch, -1, k)
    rows = torch.arange(batch).reshape(-1, 1).expand(batch, idf.shape[1])
    out = xf[(rows, *(idf[..., i] for i in range(k)))]
    return out.reshape(*idx.shape[:-1], *x.shape[b + k :])


def scatter_nd(ins, a, c: Ctx):
    """ScatterND: replace (or add, multiply, take the max / min with) the slices its indices name."""
    x, idx, upd = ins[0], ins[1].long(), ins[2]
    red = s(a.get("reduction", "none"))
    k = idx.shape[-1]
    idx = torch.where(idx < 0, idx + torch.tensor(x.shape[:k]), idx)
    if red == "none":
        out = x.clone()
        out.index_put_(tuple(idx[..., i] for i in range(k)), upd)
        return out
    strides = torch.tensor([math.prod(x.shape[i + 1 : k]) for i in range(k)])
    flat = (idx * strides).sum(-1).reshape(-1)
    rows = x.reshape(math.prod(x.shape[:k]), *x.shape[k:]).clone()
    upd = upd.reshape(-1, *x.shape[k:])
    if red == "add":
        return rows.index_add_(0, flat, upd).reshape(x.shape)
    how = {"mul": "prod", "max": "amax", "min": "amin"}[red]
    return rows.index_reduce_(0, flat, upd, how, include_self=True).reshape(x.shape)


def scatter_elements(ins, a, c: Ctx):
    x, idx, upd = ins[0], ins[1].long(), ins[2]
    ax = axis(a.get("axis", 0), x.dim())
    idx = torch.where(idx < 0, idx + x.shape[ax], idx)
    red = s(a.get("reduction", "none"))
    if red == "none":
        return x.scatter(ax, idx, upd)
    return x.scatter_reduce(ax, idx, upd, {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}[red])


def expand(ins, a, c: Ctx):
    x, sh = ins[0], ints(ins[1])
    return x.expand(torch.broadcast_shapes(x.shape, tuple(sh))).clone()


def tile(ins, a, c: Ctx):
    return ins[0].repeat(*ints(ins[1]))


def _pad_index(n: int, before: int, after: int, mode: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Source indices of one padded axis and, for ``constant``, the mask of the positions that are pads."""
    pos = torch.arange(-before, n + after)
    if mode == "constant":
        inside = (pos >= 0) & (pos < n)
        return pos.clamp(0, max(n - 1, 0)), ~inside
    if mode == "edge":
        return pos.clamp(0, n - 1), None
    if mode == "reflect":
        if n == 1:
            return torch.zeros_like(pos), None
        period = 2 * (n - 1)
        p = pos.remainder(period)
        return torch.where(p < n, p, period - p), None
    if mode == "wrap":
        return pos.remainder(n), None
    raise NotImplementedError(f"Pad mode {mode!r}")


def pad(ins, a, c: Ctx):
    """Pad (constant / reflect / edge / wrap): pads and value as attributes before opset 11, as inputs
    since (``axes`` since 18); negative pads crop."""
    x = ins[0]
    mode = s(a.get("mode", "constant"))
    if since(c, 11) and "pads" not in a:
        pads = ints(ins[1])
        value = scalar(ins[2]) if given(ins, 2) else 0
        axes = [axis(v, x.dim()) for v in ints(ins[3])] if given(ins, 3) else list(range(x.dim()))
    else:
        pads, value, axes = list(a["pads"]), a.get("value", 0.0), list(range(x.dim()))
    k = len(axes)
    y, masks = x, []
    for i, ax in enumerate(axes):
        before, after = pads[i], pads[i + k]
        n = y.shape[ax]
        if before < 0:  # crop first
            y, n, before = y.narrow(ax, -before, n + before), n + before, 0
        if after < 0:
            y, n, after = y.narrow(ax, 0, n + after), n + after, 0
        if before == 0 and after == 0:
            continue
        src, mask = _pad_index(n, before, after, mode)
        y = y.index_select(ax, src)
        if mask is not None:
            shape = [1] * y.dim()
            shape[ax] = -1
            masks.append(mask.reshape(shape))
    if masks:
        pad_mask = masks[0]
        for m in masks[1:]:
            pad_mask = pad_mask | m
        y = torch.where(pad_mask, torch.tensor(value, dtype=y.dtype), y)
    return y


def shape(ins, a, c: Ctx):
    dims = list(ins[0].shape)
    r = len(dims)
    start, end = a.get("start", 0), a.get("end", r)
    start, end = min(max(start + r if start < 0 else start, 0), r), min(max(end + r if end < 0 else end, 0), r)
    return torch.tensor(dims[start:end], dtype=torch.int64)


def constant_of_shape(ins, a, c: Ctx):
    v = a.get("value")
    fill = np.zeros(1, np.float32) if v is None else numpy_helper.to_array(v).reshape(-1)
    return torch.full(ints(ins[0]), fill[0].item(), dtype=tensor(fill, float_dtype=c.float_dtype).dtype)


def range_(ins, a, c: Ctx):
    start, limit, delta = (scalar(v) for v in ins)
    n = max(math.ceil((limit - start) / delta), 0)
    dtype = ins[0].dtype if isinstance(ins[0], torch.Tensor) else tensor(ins[0], float_dtype=c.float_dtype).dtype
    return (start + torch.arange(n, dtype=torch.float64 if dtype.is_floating_point else torch.int64) * delta).to(dtype)


def trilu(ins, a, c: Ctx):
    x = ins[0]
    k = int(scalar(ins[1])) if given(ins, 1) else 0
    return torch.triu(x, k) if a.get("upper", 1) else torch.tril(x, k)


def depth_to_space(ins, a, c: Ctx):
    x, b = ins[0], a["blocksize"]
    n, ch, h, w = x.shape
    if s(a.get("mode", "DCR")) == "DCR":
        y = x.reshape(n, b, b, ch // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, ch // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    return y.reshape(n, ch // (b * b), h * b, w * b)


def space_to_depth(ins, a, c: Ctx):
    x, b = ins[0], a["blocksize"]
    n, ch, h, w = x.shape
    y = x.reshape(n, ch, h // b, b, w // b, b).permute(0, 3, 5, 1, 2, 4)
    return y.reshape(n, ch * b * b, h // b, w // b)


def dropout(ins, a, c: Ctx):
    x = ins[0]
    return [x, torch.ones_like(x, dtype=torch.bool)][: max(c.n_out, 1)]


#: op type -> its row: implementation ``fn(inputs, attributes, ctx)`` and facts (see :class:`~.values.OpImpl`)
SHAPES = {
    "Identity": OpImpl(lambda ins, a, c: ins[0]),
    "Dropout": OpImpl(dropout),
    "Reshape": OpImpl(reshape, static=(1,)),
    "Unsqueeze": OpImpl(unsqueeze, static=(1,)),
    "Squeeze": OpImpl(squeeze, static=(1,)),
    "Flatten": OpImpl(flatten),
    "Transpose": OpImpl(transpose),
    "Slice": OpImpl(slice_, static=(1, 2, 3, 4)),
    "Concat": OpImpl(concat),
    "Split": OpImpl(split, static=(1,)),
    "Gather": OpImpl(gather),
    "GatherElements": OpImpl(gather_elements),
    "GatherND": OpImpl(gather_nd),
    "ScatterND": OpImpl(scatter_nd),
    "ScatterElements": OpImpl(scatter_elements),
    "Expand": OpImpl(expand, static=(1,)),
    "Tile": OpImpl(tile, static=(1,)),
    "Pad": OpImpl(pad, static=(1, 2, 3)),
    "Shape": OpImpl(shape),
    "Size": OpImpl(lambda ins, a, c: torch.tensor(ins[0].numel(), dtype=torch.int64)),
    "ConstantOfShape": OpImpl(constant_of_shape, static=(0,)),
    "Range": OpImpl(range_, static=(0, 1, 2)),
    "Trilu": OpImpl(trilu, static=(1,)),
    "DepthToSpace": OpImpl(depth_to_space),
    "SpaceToDepth": OpImpl(space_to_depth),
}
