"""ONNX Resize (and Upsample): ``nearest`` with every ``nearest_mode``, ``linear`` and ``cubic``, with
every ``coordinate_transformation_mode``, over any axes (``axes`` and ``keep_aspect_ratio_policy``
since opset 18).  Separable: one axis at a time, each output index from the input coordinate the
mode maps it to."""

from __future__ import annotations

import math

import torch

from .values import Ctx, OpImpl, floats, given, ints, s, since


def _coordinate(mode: str, out: torch.Tensor, scale: float, n_in: int, n_out: int, roi: tuple | None):
    """The input coordinate of each output index (float64)."""
    if mode == "half_pixel":
        return (out + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (out + 0.5) / scale - 0.5 if n_out > 1 else torch.zeros_like(out)
    if mode == "align_corners":
        return out * (n_in - 1) / (n_out - 1) if n_out > 1 else torch.zeros_like(out)
    if mode == "asymmetric":
        return out / scale
    if mode == "half_pixel_symmetric":
        adjustment = n_out / (scale * n_in)
        center = n_in / 2
        return center * (1 - adjustment) + (out + 0.5) / scale - 0.5
    if mode == "tf_half_pixel_for_nn":
        return (out + 0.5) / scale
    if mode == "tf_crop_and_resize":
        start, end = roi
        if n_out > 1:
            return start * (n_in - 1) + out * (end - start) * (n_in - 1) / (n_out - 1)
        return torch.full_like(out, 0.5 * (start + end) * (n_in - 1))
    raise NotImplementedError(f"Resize coordinate_transformation_mode {mode!r}")


def _nearest(xo: torch.Tensor, mode: str, scale: float) -> torch.Tensor:
    if mode == "simple":  # Resize-10 and Upsample: floor when enlarging, ceil when shrinking
        return torch.ceil(xo) if scale < 1 else torch.floor(xo)
    if mode == "round_prefer_floor":
        return torch.where(xo - torch.floor(xo) == 0.5, torch.floor(xo), torch.round(xo))
    if mode == "round_prefer_ceil":
        return torch.where(xo - torch.floor(xo) == 0.5, torch.ceil(xo), torch.round(xo))
    if mode == "floor":
        return torch.floor(xo)
    if mode == "ceil":
        return torch.ceil(xo)
    raise NotImplementedError(f"Resize nearest_mode {mode!r}")


def _cubic_weights(t: torch.Tensor, A: float) -> list[torch.Tensor]:
    """The four cubic convolution weights of taps at offsets -1, 0, 1, 2 from ``floor(x)``."""

    def near(d):  # |d| <= 1
        return ((A + 2) * d - (A + 3)) * d * d + 1

    def far(d):  # 1 < |d| < 2
        return ((A * d - 5 * A) * d + 8 * A) * d - 4 * A

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _resize_axis(x: torch.Tensor, ax: int, n_out: int, scale: float, a: dict, roi) -> torch.Tensor:
    n_in = x.shape[ax]
    mode = s(a.get("mode", "nearest"))
    coords = s(a.get("coordinate_transformation_mode", "half_pixel"))
    out = torch.arange(n_out, dtype=torch.float64)
    xo = _coordinate(coords, out, scale, n_in, n_out, roi)
    outside = (xo < 0) | (xo > n_in - 1) if coords == "tf_crop_and_resize" else None
    if mode == "nearest":
        idx = _nearest(xo, s(a.get("nearest_mode", "round_prefer_floor")), scale).long().clamp(0, n_in - 1)
        y = x.index_select(ax, idx)
    elif mode == "linear":
        x0 = torch.floor(xo.clamp(0, n_in - 1))
        t = (xo.clamp(0, n_in - 1) - x0).to(x.dtype)
        i0, i1 = x0.long(), (x0.long() + 1).clamp(max=n_in - 1)
        y = _weighted(x, ax, [i0, i1], [1 - t, t])
    elif mode == "cubic":
        x0 = torch.floor(xo)
        t = xo - x0
        taps = [x0.long() + d for d in (-1, 0, 1, 2)]
        w = _cubic_weights(t, a.get("cubic_coeff_a", -0.75))
        if a.get("exclude_outside", 0):
            w = [wi * ((ti >= 0) & (ti < n_in)) for wi, ti in zip(w, taps)]
            total = sum(w)
            w = [wi / total for wi in w]
        y = _weighted(x, ax, [ti.clamp(0, n_in - 1) for ti in taps], [wi.to(x.dtype) for wi in w])
    else:
        raise NotImplementedError(f"Resize mode {mode!r}")
    if outside is not None and outside.any():
        shape = [1] * y.dim()
        shape[ax] = -1
        y = torch.where(outside.reshape(shape), torch.tensor(a.get("extrapolation_value", 0.0), dtype=y.dtype), y)
    return y


def _weighted(x: torch.Tensor, ax: int, taps: list, weights: list) -> torch.Tensor:
    shape = [1] * x.dim()
    shape[ax] = -1
    y = None
    for ti, wi in zip(taps, weights):
        term = x.index_select(ax, ti) * wi.reshape(shape)
        y = term if y is None else y + term
    return y


def resize(ins, a, c: Ctx):
    """Resize: inputs ``X, roi, scales, sizes`` (opset 11 on), ``X, scales`` (opset 10)."""
    x = ins[0]
    if not since(c, 11):  # Resize-10: asymmetric coordinates
        roi, scales, sizes = None, floats(ins[1]), None
        a = dict(a, coordinate_transformation_mode="asymmetric", nearest_mode="simple")
    else:
        roi = floats(ins[1]) if given(ins, 1) else None
        scales = floats(ins[2]) if given(ins, 2) else None
        sizes = ints(ins[3]) if given(ins, 3) else None
    axes = [v % x.dim() for v in a.get("axes", range(x.dim()))]
    if sizes is not None:
        n_in = [x.shape[v] for v in axes]
        policy = s(a.get("keep_aspect_ratio_policy", "stretch"))
        if policy == "stretch":
            scales = [o / i for o, i in zip(sizes, n_in)]
        else:
            pick = min if policy == "not_larger" else max
            r = pick(o / i for o, i in zip(sizes, n_in))
            scales = [r] * len(axes)
            sizes = [int(math.floor(r * i + 0.5)) for i in n_in]  # round half up, as ONNX
    elif scales is not None:
        sizes = [int(math.floor(x.shape[v] * sc)) for v, sc in zip(axes, scales)]
    else:
        raise ValueError("Resize needs scales or sizes")
    rois = None
    if roi:
        k = len(axes)
        rois = [(roi[i], roi[i + k]) for i in range(k)] if len(roi) == 2 * k else None
        if rois is None:
            rois = [(roi[v], roi[v + x.dim()]) for v in axes]
    y = x
    for i, (v, n, sc) in enumerate(zip(axes, sizes, scales)):
        if n != x.shape[v] or sc != 1.0 or s(a.get("coordinate_transformation_mode", "")) == "tf_crop_and_resize":
            y = _resize_axis(y, v, n, sc, a, rois[i] if rois else None)
    return y


def _resize_refuses(a: dict, node) -> str | None:
    return "Resize with antialias" if a.get("antialias", 0) else None


def upsample(ins, a, c: Ctx):
    """Upsample (opset 7 to 9): scales as attribute (7) or input 1 (9), asymmetric coordinates."""
    x = ins[0]
    scales = floats(ins[1]) if given(ins, 1) else list(a["scales"])
    mode = s(a.get("mode", "nearest"))
    b = {"mode": "linear" if mode in ("linear", "bilinear") else mode}
    return resize([x, scales], b, c._replace(opset=10))


#: op type -> its row: implementation ``fn(inputs, attributes, ctx)`` and facts (see :class:`~.values.OpImpl`)
RESIZE = {
    "Resize": OpImpl(resize, static=(1, 2, 3), refuses=_resize_refuses),
    "Upsample": OpImpl(upsample, static=(1,)),
}
