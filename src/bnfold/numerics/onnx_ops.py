"""ONNX ops as torch functions, for the ONNX emulator (:mod:`bnfold.numerics.onnx_emulator`) and the
traced program of :mod:`bnfold.numerics.onnx_program`.

These are the float64 reference interpreter's op implementations (``tests/onnx/onnx_ref.py``)
as library code, written so that ``torch.export`` can trace them: weights arrive as tensors,
and values known ahead of time (shapes, axes, integer initializers, ``Constant`` outputs)
arrive as numpy arrays, which the ops read as Python numbers.  A conv and a BatchNormalization
become ``aten.conv*`` and ``aten.batch_norm`` with their constants lifted, which is what the
emulator and the fold read.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper


def ints(v) -> list[int]:
    """The integers of a value known ahead of time (a numpy array or a Python sequence)."""
    if isinstance(v, torch.Tensor):
        if torch.compiler.is_compiling() or isinstance(v, torch.fx.Proxy) or _is_fake(v):
            raise NotImplementedError(
                "a shape or axes input is computed from the model's data; the ONNX audit needs static shapes"
            )
        if v.is_floating_point():
            raise NotImplementedError("a shape or axes input holds floating-point values")
        return [int(x) for x in v.reshape(-1).tolist()]
    return [int(x) for x in np.asarray(v).reshape(-1).tolist()]


def _is_fake(v) -> bool:
    return type(v).__name__ in ("FakeTensor", "FunctionalTensor")


def floats(v) -> list[float]:
    """The numbers of a value known when the op runs (scales of a Resize), as Python floats."""
    if isinstance(v, torch.Tensor):
        return [float(x) for x in v.reshape(-1).tolist()]
    return [float(x) for x in np.asarray(v).reshape(-1).tolist()]


def attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _s(v):
    return v.decode() if isinstance(v, bytes) else v


def _pads_same(in_sz, k, s, d, mode):
    out = math.ceil(in_sz / s)
    total = max(0, (out - 1) * s + (k - 1) * d + 1 - in_sz)
    begin = total // 2 if mode == "SAME_UPPER" else total - total // 2
    return begin, total - begin


def conv(ins, a):
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    nd = w.dim() - 2
    strides, dil = a.get("strides", [1] * nd), a.get("dilations", [1] * nd)
    pads = a.get("pads", [0] * (2 * nd))
    mode = _s(a.get("auto_pad", "NOTSET"))
    if mode in ("SAME_UPPER", "SAME_LOWER"):
        pb = [_pads_same(x.shape[2 + i], w.shape[2 + i], strides[i], dil[i], mode) for i in range(nd)]
        pads = [p[0] for p in pb] + [p[1] for p in pb]
    elif mode == "VALID":
        pads = [0] * (2 * nd)
    padding = tuple(pads[:nd])
    if list(pads[:nd]) != list(pads[nd:]):
        x = F.pad(x, [p for i in reversed(range(nd)) for p in (pads[i], pads[i + nd])])
        padding = 0
    fn = (F.conv1d, F.conv2d, F.conv3d)[nd - 1]
    return fn(x, w, b, tuple(strides), padding, tuple(dil), a.get("group", 1))


def conv_transpose(ins, a):
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    nd = w.dim() - 2
    pads = a.get("pads", [0] * (2 * nd))
    if _s(a.get("auto_pad", "NOTSET")) != "NOTSET" or list(pads[:nd]) != list(pads[nd:]):
        raise NotImplementedError("ConvTranspose with auto_pad or asymmetric pads is not supported by the ONNX audit")
    fn = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[nd - 1]
    return fn(
        x,
        w,
        b,
        tuple(a.get("strides", [1] * nd)),
        tuple(pads[:nd]),
        tuple(a.get("output_padding", [0] * nd)),
        a.get("group", 1),
        tuple(a.get("dilations", [1] * nd)),
    )


def batch_norm(ins, a):
    x, s, b, m, v = ins[:5]
    if a.get("training_mode", 0):
        raise NotImplementedError("a BatchNormalization in training mode cannot be audited; export in eval mode")
    return F.batch_norm(x, m, v, s, b, False, 0.0, float(a.get("epsilon", 1e-5)))


def gemm(ins, a):
    A, B = ins[0], ins[1]
    C = ins[2] if len(ins) > 2 else None
    if a.get("transA", 0):
        A = A.t()
    alpha, beta = a.get("alpha", 1.0), a.get("beta", 1.0)
    if a.get("transB", 0) and alpha == 1.0 and beta == 1.0 and A.dim() == 2:
        return F.linear(A, B, C)
    y = A @ (B.t() if a.get("transB", 0) else B)
    y = y * alpha if alpha != 1.0 else y
    return y if C is None else y + (C * beta if beta != 1.0 else C)


def reshape(ins, a):
    x, shape = ins[0], ints(ins[1])
    if not a.get("allowzero", 0):
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return x.reshape(shape)


def _axes(ins, a):
    if len(ins) > 1 and ins[1] is not None:
        return ints(ins[1])
    return a.get("axes")


def unsqueeze(ins, a):
    x, axes = ins[0], _axes(ins, a)
    r = x.dim() + len(axes)
    for ax in sorted(ax % r for ax in axes):
        x = x.unsqueeze(ax)
    return x


def squeeze(ins, a):
    x, axes = ins[0], _axes(ins, a)
    if axes is None:
        return x.squeeze()
    for ax in sorted((ax % x.dim() for ax in axes), reverse=True):
        x = x.squeeze(ax)
    return x


def constant(a):
    """A ``Constant`` node's value as a numpy array (known ahead of time)."""
    k, v = next(iter(a.items()))
    if k == "value":
        return numpy_helper.to_array(v)
    return np.array(v, dtype=np.float32 if k.startswith("value_float") else np.int64)


def reduce_mean(ins, a):
    x, axes = ins[0], _axes(ins, a)
    axes = tuple(range(x.dim())) if not axes else tuple(ax % x.dim() for ax in axes)
    return x.mean(dim=axes, keepdim=bool(a.get("keepdims", 1)))


def slice_(ins, a):
    x = ins[0]
    starts, ends = ints(ins[1]), ints(ins[2])
    axes = ints(ins[3]) if len(ins) > 3 and ins[3] is not None else list(range(len(starts)))
    steps = ints(ins[4]) if len(ins) > 4 and ins[4] is not None else [1] * len(starts)
    idx = [slice(None)] * x.dim()
    for s, e, ax, st in zip(starts, ends, axes, steps):
        n = x.shape[ax]
        idx[ax] = slice(max(-n, min(n, s)), max(-n - 1, min(n, e)), st)
    return x[tuple(idx)]


def avgpool(ins, a):
    x = ins[0]
    nd = x.dim() - 2
    pads = _pool_pads(x, a, nd)
    if list(pads[:nd]) != list(pads[nd:]):
        raise NotImplementedError("AveragePool with asymmetric pads is not supported by the ONNX audit")
    fn = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[nd - 1]
    return fn(
        x,
        a["kernel_shape"],
        a.get("strides", [1] * nd),
        pads[:nd],
        bool(a.get("ceil_mode", 0)),
        bool(a.get("count_include_pad", 0)),
    )


def _pool_pads(x, a, nd) -> list[int]:
    """A pool's pads, with ``auto_pad`` SAME_UPPER / SAME_LOWER / VALID resolved."""
    mode = _s(a.get("auto_pad", "NOTSET"))
    k, strides, dil = a["kernel_shape"], a.get("strides", [1] * nd), a.get("dilations", [1] * nd)
    if mode in ("SAME_UPPER", "SAME_LOWER"):
        pb = [_pads_same(x.shape[2 + i], k[i], strides[i], dil[i], mode) for i in range(nd)]
        return [p[0] for p in pb] + [p[1] for p in pb]
    if mode == "VALID":
        return [0] * (2 * nd)
    return list(a.get("pads", [0] * (2 * nd)))


def maxpool(ins, a):
    x = ins[0]
    nd = x.dim() - 2
    pads = _pool_pads(x, a, nd)
    if list(pads[:nd]) != list(pads[nd:]):
        x = F.pad(x, [p for i in reversed(range(nd)) for p in (pads[i], pads[i + nd])], value=-math.inf)
        pads = [0] * (2 * nd)
    fn = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[nd - 1]
    return fn(
        x,
        a["kernel_shape"],
        a.get("strides", [1] * nd),
        pads[:nd],
        a.get("dilations", [1] * nd),
        bool(a.get("ceil_mode", 0)),
    )


def clip(ins):
    """Clip with its bounds as optional inputs (known ahead of time)."""
    lo, hi = (list(ins) + [None, None])[1:3]
    return torch.clamp(ins[0], *(None if v is None else float(np.asarray(v)) for v in (lo, hi)))


def resize(ins, a):
    """Resize: ``nearest`` (asymmetric coordinates, floor) and ``linear`` (half_pixel / align_corners /
    asymmetric / pytorch_half_pixel) over the spatial axes; scales or sizes given as inputs."""
    x = ins[0]
    scales = floats(ins[2]) if len(ins) > 2 and ins[2] is not None and ins[2].numel() else None
    sizes = ints(ins[3]) if len(ins) > 3 and ins[3] is not None else None
    mode, coords = _s(a.get("mode", "nearest")), _s(a.get("coordinate_transformation_mode", "half_pixel"))
    if sizes is None and scales is None:
        raise NotImplementedError("Resize without scales or sizes is not supported by the ONNX audit")
    if (sizes or scales) and (sizes or scales)[:2] not in ([1, 1], [1.0, 1.0], list(x.shape[:2])):
        raise NotImplementedError("Resize over the batch or channel axis is not supported by the ONNX audit")
    if sizes is not None:
        out = sizes[2:]
    else:
        out = [int(math.floor(n * s)) for n, s in zip(x.shape[2:], scales[2:])]
    if mode == "nearest":
        if coords != "asymmetric" or _s(a.get("nearest_mode", "round_prefer_floor")) != "floor":
            raise NotImplementedError(f"Resize nearest with {coords} coordinates is not supported by the ONNX audit")
        if scales is not None and sizes is None:
            return F.interpolate(x, scale_factor=tuple(scales[2:]), mode="nearest")
        return F.interpolate(x, size=tuple(out), mode="nearest")
    if mode == "linear":
        names = {1: "linear", 2: "bilinear", 3: "trilinear"}
        if coords == "align_corners":
            return F.interpolate(x, size=tuple(out), mode=names[len(out)], align_corners=True)
        if coords in ("half_pixel", "pytorch_half_pixel"):
            return F.interpolate(x, size=tuple(out), mode=names[len(out)], align_corners=False)
    raise NotImplementedError(f"Resize mode {mode!r} with {coords} coordinates is not supported by the ONNX audit")


def shape(ins, a):
    return torch.tensor(list(ins[0].shape)[a.get("start", 0) : a.get("end", None)], dtype=torch.int64)


def gather(ins, a):
    x, idx = ins[0], ins[1]
    axis = a.get("axis", 0) % x.dim()
    flat = torch.as_tensor(idx).long()
    flat = torch.where(flat < 0, flat + x.shape[axis], flat)
    return x.index_select(axis, flat.reshape(-1)).reshape(x.shape[:axis] + flat.shape + x.shape[axis + 1 :])


def expand(ins, a):
    x, sh = ins[0], ints(ins[1])
    return x * torch.ones(sh, dtype=x.dtype) if x.dtype != torch.bool else x.expand(torch.broadcast_shapes(x.shape, sh))


def _flatten(x, axis):
    return x.reshape(math.prod(x.shape[:axis]), -1)


OPS = {
    "Conv": conv,
    "ConvTranspose": conv_transpose,
    "BatchNormalization": batch_norm,
    "Gemm": gemm,
    "MatMul": lambda i, a: i[0] @ i[1],
    "Add": lambda i, a: i[0] + i[1],
    "Sub": lambda i, a: i[0] - i[1],
    "Mul": lambda i, a: i[0] * i[1],
    "Div": lambda i, a: i[0] / i[1],
    "Pow": lambda i, a: i[0] ** i[1],
    "Sqrt": lambda i, a: torch.sqrt(i[0]),
    "Relu": lambda i, a: torch.relu(i[0]),
    "Sigmoid": lambda i, a: torch.sigmoid(i[0]),
    "HardSigmoid": lambda i, a: torch.clamp(i[0] * a.get("alpha", 0.2) + a.get("beta", 0.5), 0, 1),
    "HardSwish": lambda i, a: F.hardswish(i[0]),
    "Tanh": lambda i, a: torch.tanh(i[0]),
    "Clip": lambda i, a: clip(i),
    "Identity": lambda i, a: i[0],
    "Dropout": lambda i, a: i[0],
    "Reshape": reshape,
    "Unsqueeze": unsqueeze,
    "Squeeze": squeeze,
    "Flatten": lambda i, a: _flatten(i[0], a.get("axis", 1)),
    "Transpose": lambda i, a: i[0].permute(*a["perm"]),
    "GlobalAveragePool": lambda i, a: i[0].mean(dim=tuple(range(2, i[0].dim())), keepdim=True),
    "MaxPool": maxpool,
    "AveragePool": avgpool,
    "ReduceMean": reduce_mean,
    "Softmax": lambda i, a: torch.softmax(i[0], dim=a.get("axis", -1)),
    "Slice": slice_,
    "Concat": lambda i, a: torch.cat(i, dim=a["axis"]),
    "Erf": lambda i, a: torch.erf(i[0]),
    "Gelu": lambda i, a: F.gelu(i[0], approximate=_s(a.get("approximate", "none"))),  # opset 20 (dynamo exports)
    "Resize": resize,
    "Shape": shape,
    "Gather": gather,
    "Expand": expand,
    "Neg": lambda i, a: -i[0],
    "Abs": lambda i, a: i[0].abs(),
    "Exp": lambda i, a: torch.exp(i[0]),
    "Log": lambda i, a: torch.log(i[0]),
    "Reciprocal": lambda i, a: 1 / i[0],
    "LeakyRelu": lambda i, a: F.leaky_relu(i[0], a.get("alpha", 0.01)),
    "Softplus": lambda i, a: F.softplus(i[0]),
    "Max": lambda i, a: torch.stack(torch.broadcast_tensors(*i)).amax(0),
    "Min": lambda i, a: torch.stack(torch.broadcast_tensors(*i)).amin(0),
}

#: ops whose inputs after the first are shapes, axes or bounds (read as Python numbers); every other
#: op takes each input as data
STATIC_ARGS = frozenset({"Reshape", "Unsqueeze", "Squeeze", "Slice", "Clip", "ReduceMean", "Expand", "Resize"})

#: ops whose output holds only values of their inputs, rearranged or selected: an fp16 runtime computes
#: them exactly (no rounding of their output)
EXACT_OPS = frozenset(
    "Reshape Transpose Squeeze Unsqueeze Flatten Identity Dropout Slice Concat Gather Expand MaxPool Relu Neg Abs "
    "Max Min Resize Shape".split()
)
#: of those, the ones whose error statistics equal their input's (the same elements, rearranged)
SAME_ERROR_OPS = frozenset("Reshape Transpose Squeeze Unsqueeze Flatten Identity Dropout".split())
#: ONNX layer ops and their kind
LAYER_OPS = {"Conv": "conv", "ConvTranspose": "conv_transpose", "Gemm": "linear", "MatMul": "matmul"}
