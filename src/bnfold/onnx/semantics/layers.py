"""ONNX layer ops: Conv, ConvTranspose (every auto_pad, asymmetric pads, output_padding and
output_shape), Gemm, MatMul (broadcasting) and Einsum."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .values import Ctx, OpImpl, pads_same, s


def _torch_pad(pads: list[int], nd: int) -> list[int]:
    """ONNX pads ``[b1, b2, ..., e1, e2, ...]`` as ``F.pad``'s, last axis first."""
    return [p for i in reversed(range(nd)) for p in (pads[i], pads[i + nd])]


def conv(ins, a, c: Ctx):
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    nd = w.dim() - 2
    strides, dil = a.get("strides", [1] * nd), a.get("dilations", [1] * nd)
    k = a.get("kernel_shape", list(w.shape[2:]))
    pads = a.get("pads", [0] * (2 * nd))
    mode = s(a.get("auto_pad", "NOTSET"))
    if mode in ("SAME_UPPER", "SAME_LOWER"):
        pb = [pads_same(x.shape[2 + i], k[i], strides[i], dil[i], mode) for i in range(nd)]
        pads = [p[0] for p in pb] + [p[1] for p in pb]
    elif mode == "VALID":
        pads = [0] * (2 * nd)
    padding = tuple(pads[:nd])
    if list(pads[:nd]) != list(pads[nd:]):
        x = F.pad(x, _torch_pad(pads, nd))
        padding = 0
    fn = (F.conv1d, F.conv2d, F.conv3d)[nd - 1]
    return fn(x, w, b, tuple(strides), padding, tuple(dil), a.get("group", 1))


def conv_transpose(ins, a, c: Ctx):
    """ConvTranspose: the full transposed convolution, then the pads (or ``output_shape`` /
    ``auto_pad``) cut from its borders and ``output_padding`` added at the end."""
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    nd = w.dim() - 2
    strides, dil = a.get("strides", [1] * nd), a.get("dilations", [1] * nd)
    opad = list(a.get("output_padding", [0] * nd))
    k = a.get("kernel_shape", list(w.shape[2:]))
    full = [(x.shape[2 + i] - 1) * strides[i] + (k[i] - 1) * dil[i] + 1 for i in range(nd)]
    mode = s(a.get("auto_pad", "NOTSET"))
    if "output_shape" in a:
        out = list(a["output_shape"])[-nd:]
    elif mode in ("SAME_UPPER", "SAME_LOWER"):
        out = [x.shape[2 + i] * strides[i] for i in range(nd)]
    else:
        out = None
    if out is not None:
        totals = [full[i] + opad[i] - out[i] for i in range(nd)]
        begins = [t // 2 if mode == "SAME_UPPER" else t - t // 2 for t in totals]
        pads = begins + [t - bg for t, bg in zip(totals, begins)]
    else:
        pads = list(a.get("pads", [0] * (2 * nd)))
    fn = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[nd - 1]
    fits = all(o < max(st, d) for o, st, d in zip(opad, strides, dil))  # what torch's output_padding takes
    if pads[:nd] == pads[nd:] and all(p >= 0 for p in pads) and fits:
        return fn(x, w, b, tuple(strides), tuple(pads[:nd]), tuple(opad), a.get("group", 1), tuple(dil))
    y = fn(x, w, None, tuple(strides), 0, 0, a.get("group", 1), tuple(dil))
    y = F.pad(y, [p for i in reversed(range(nd)) for p in (0, opad[i])])
    idx = [slice(None), slice(None)] + [slice(pads[i], y.shape[2 + i] - pads[i + nd]) for i in range(nd)]
    y = y[tuple(idx)]
    return y if b is None else y + b.reshape(1, -1, *([1] * nd))


def gemm(ins, a, c: Ctx):
    A, B = ins[0], ins[1]
    C = ins[2] if len(ins) > 2 else None
    if a.get("transA", 0):
        A = A.t()
    alpha, beta = a.get("alpha", 1.0), a.get("beta", 1.0)
    if a.get("transB", 0) and alpha == 1.0 and beta == 1.0 and A.dim() == 2 and (C is None or C.dim() <= 1):
        return F.linear(A, B, C)
    y = A @ (B.t() if a.get("transB", 0) else B)
    y = y * alpha if alpha != 1.0 else y
    return y if C is None else y + (C * beta if beta != 1.0 else C)


#: op type -> its row: implementation ``fn(inputs, attributes, ctx)`` and facts (see :class:`~.values.OpImpl`)
LAYERS = {
    "Conv": OpImpl(conv),
    "ConvTranspose": OpImpl(conv_transpose),
    "Gemm": OpImpl(gemm),
    "MatMul": OpImpl(lambda ins, a, c: torch.matmul(ins[0], ins[1])),
    "Einsum": OpImpl(lambda ins, a, c: torch.einsum(s(a["equation"]).replace(" ", ""), *ins)),
}
