"""A float64 reference interpreter for the ONNX ops the tests use.

ONNX Runtime has no float64 Conv/ConvTranspose and onnx's own reference
evaluator mishandles grouped ConvTranspose, so the tests compute references
with torch in float64.  Every test also checks that ORT running the original
model agrees with this interpreter, so a mistake here cannot pass silently.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper


def _t(a) -> torch.Tensor:
    a = np.asarray(a)
    if a.dtype.kind == "f" or a.dtype.name == "bfloat16":
        return torch.from_numpy(a.astype(np.float64))
    if a.dtype == np.bool_:
        return torch.from_numpy(a.copy())
    return torch.from_numpy(a.astype(np.int64))


def _attrs(node) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _s(v):
    return v.decode() if isinstance(v, bytes) else v


def run(model: onnx.ModelProto, feeds: dict) -> list[torch.Tensor]:
    """The model's outputs computed in float64 (integers stay int64)."""
    return _graph(model.graph, {}, {k: _t(v) for k, v in feeds.items()})


def _graph(g: onnx.GraphProto, outer: dict, feeds: dict) -> list[torch.Tensor]:
    env = dict(outer)
    for t in g.initializer:
        env[t.name] = _t(numpy_helper.to_array(t))
    for i in g.input:
        if i.name in feeds:
            env[i.name] = feeds[i.name]
    for node in g.node:
        ins = [env[n] if n else None for n in node.input]
        outs = _OPS[node.op_type](node, ins, _attrs(node), env)
        if not isinstance(outs, (list, tuple)):
            outs = [outs]
        for name, v in zip(node.output, outs):
            if name:
                env[name] = v
    return [env[o.name] for o in g.output]


def _pads_same(in_sz, k, s, d, mode):
    out = math.ceil(in_sz / s)
    total = max(0, (out - 1) * s + (k - 1) * d + 1 - in_sz)
    begin = total // 2 if mode == "SAME_UPPER" else total - total // 2
    return begin, total - begin


def _conv(node, ins, a, env):
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    nd = w.dim() - 2
    strides = a.get("strides", [1] * nd)
    dil = a.get("dilations", [1] * nd)
    pads = a.get("pads", [0] * (2 * nd))
    mode = _s(a.get("auto_pad", "NOTSET"))
    if mode in ("SAME_UPPER", "SAME_LOWER"):
        pb = [_pads_same(x.shape[2 + i], w.shape[2 + i], strides[i], dil[i], mode) for i in range(nd)]
        pads = [p[0] for p in pb] + [p[1] for p in pb]
    elif mode == "VALID":
        pads = [0] * (2 * nd)
    fpad = []
    for i in reversed(range(nd)):
        fpad += [pads[i], pads[i + nd]]
    x = F.pad(x, fpad)
    fn = (F.conv1d, F.conv2d, F.conv3d)[nd - 1]
    return fn(x, w, b, tuple(strides), 0, tuple(dil), a.get("group", 1))


def _conv_transpose(node, ins, a, env):
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    nd = w.dim() - 2
    strides = a.get("strides", [1] * nd)
    dil = a.get("dilations", [1] * nd)
    opad = a.get("output_padding", [0] * nd)
    fn = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[nd - 1]
    y = fn(x, w, None, tuple(strides), 0, 0, a.get("group", 1), tuple(dil))
    y = F.pad(y, [p for i in reversed(range(nd)) for p in (0, opad[i])])
    mode = _s(a.get("auto_pad", "NOTSET"))
    if mode in ("SAME_UPPER", "SAME_LOWER"):
        pads = []
        for i in range(nd):
            total = y.shape[2 + i] - x.shape[2 + i] * strides[i]
            assert total % 2 == 0, "tests use an even total padding (no SAME_UPPER/LOWER ambiguity)"
            pads.append((total // 2, total // 2))
        pads = [p[0] for p in pads] + [p[1] for p in pads]
    else:
        pads = a.get("pads", [0] * (2 * nd))
    idx = [slice(None), slice(None)] + [slice(pads[i], y.shape[2 + i] - pads[i + nd]) for i in range(nd)]
    y = y[tuple(idx)]
    if b is not None:
        y = y + b.reshape(1, -1, *([1] * nd))
    return y


def _bn(node, ins, a, env):
    x, s, b, m, v = ins
    eps = a.get("epsilon", 1e-5)
    if a.get("spatial", 1) == 0 and s.dim() > 1:
        shape = (1, *s.shape)
    else:
        shape = (1, -1) + (1,) * (x.dim() - 2)
    s, b, m, v = (t.reshape(shape) for t in (s, b, m, v))
    return (x - m) / torch.sqrt(v + eps) * s + b


def _layer_norm(node, ins, a, env):
    """LayerNormalization: normalize over the axes from ``axis`` on; outputs Y, Mean, InvStdDev."""
    x, scale = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    axis = a.get("axis", -1) % x.dim()
    dims = tuple(range(axis, x.dim()))
    mean = x.mean(dim=dims, keepdim=True)
    inv = 1 / torch.sqrt(((x - mean) ** 2).mean(dim=dims, keepdim=True) + a.get("epsilon", 1e-5))
    y = (x - mean) * inv * scale
    return [y if bias is None else y + bias, mean, inv]


def _rms_norm(node, ins, a, env):
    x, scale = ins
    dims = tuple(range(a.get("axis", -1) % x.dim(), x.dim()))
    return x / torch.sqrt((x * x).mean(dim=dims, keepdim=True) + a.get("epsilon", 1e-5)) * scale


def _group_norm(node, ins, a, env):
    """GroupNormalization; scale and bias per channel (opset 21) or, with one entry per group, per group (18)."""
    x, scale, bias = ins
    groups = a["num_groups"]
    n, c = x.shape[:2]
    xg = x.reshape(n, groups, -1)
    mean = xg.mean(dim=-1, keepdim=True)
    var = ((xg - mean) ** 2).mean(dim=-1, keepdim=True)
    y = ((xg - mean) / torch.sqrt(var + a.get("epsilon", 1e-5))).reshape(x.shape)
    if scale.numel() == groups and groups != c:
        scale, bias = scale.repeat_interleave(c // groups), bias.repeat_interleave(c // groups)
    shape = (1, c) + (1,) * (x.dim() - 2)
    return y * scale.reshape(shape) + bias.reshape(shape)


def _gemm(node, ins, a, env):
    A, B = ins[0], ins[1]
    if a.get("transA", 0):
        A = A.T
    if a.get("transB", 0):
        B = B.T
    y = a.get("alpha", 1.0) * (A @ B)
    if len(ins) > 2 and ins[2] is not None:
        y = y + a.get("beta", 1.0) * ins[2]
    return y


def _reshape(node, ins, a, env):
    x, shape = ins[0], [int(s) for s in ins[1].tolist()]
    if not a.get("allowzero", 0):
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return x.reshape(shape)


def _axes(ins, a):
    if len(ins) > 1 and ins[1] is not None:
        return [int(v) for v in ins[1].tolist()]
    return a.get("axes")


def _unsqueeze(node, ins, a, env):
    x = ins[0]
    axes = _axes(ins, a)
    r = x.dim() + len(axes)
    for ax in sorted(ax % r for ax in axes):
        x = x.unsqueeze(ax)
    return x


def _squeeze(node, ins, a, env):
    x = ins[0]
    axes = _axes(ins, a)
    if axes is None:
        return x.squeeze()
    for ax in sorted((ax % x.dim() for ax in axes), reverse=True):
        x = x.squeeze(ax)
    return x


def _constant(node, ins, a, env):
    k, v = next(iter(a.items()))
    if k == "value":
        return _t(numpy_helper.to_array(v))
    return _t(np.array(v, dtype=np.float32 if k.startswith("value_float") else np.int64))


def _if(node, ins, a, env):
    branch = a["then_branch"] if bool(ins[0].reshape(-1)[0]) else a["else_branch"]
    return _graph(branch, env, {})


def _loop(node, ins, a, env):
    """Loop with loop-carried values only (no scan outputs)."""
    body = a["body"]
    trips = int(ins[0].reshape(-1)[0]) if ins[0] is not None else 2**31
    cond = bool(ins[1].reshape(-1)[0]) if len(ins) > 1 and ins[1] is not None else True
    state = list(ins[2:])
    i = 0
    while i < trips and cond:
        feeds = {body.input[0].name: torch.tensor(i), body.input[1].name: torch.tensor(cond)}
        feeds.update({v.name: s for v, s in zip(body.input[2:], state)})
        out = _graph(body, env, feeds)
        cond, state = bool(out[0]), out[1:]
        i += 1
    return state


def _reduce_mean(node, ins, a, env):
    x = ins[0]
    axes = _axes(ins, a)
    axes = tuple(range(x.dim())) if not axes else tuple(ax % x.dim() for ax in axes)
    return x.mean(dim=axes, keepdim=bool(a.get("keepdims", 1)))


def _slice(node, ins, a, env):
    x = ins[0]
    starts, ends = ins[1].tolist(), ins[2].tolist()
    axes = ins[3].tolist() if len(ins) > 3 and ins[3] is not None else list(range(len(starts)))
    steps = ins[4].tolist() if len(ins) > 4 and ins[4] is not None else [1] * len(starts)
    idx = [slice(None)] * x.dim()
    for s, e, ax, st in zip(starts, ends, axes, steps):
        n = x.shape[ax]
        s, e = max(-n, min(n, s)), max(-n - 1, min(n, e))
        idx[ax] = slice(s, e, st)
    return x[tuple(idx)]


def _avgpool(node, ins, a, env):
    x = ins[0]
    nd = x.dim() - 2
    pads = a.get("pads", [0] * (2 * nd))
    assert pads[:nd] == pads[nd:], "symmetric pads only"
    fn = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[nd - 1]
    return fn(
        x,
        a["kernel_shape"],
        a.get("strides", [1] * nd),
        pads[:nd],
        bool(a.get("ceil_mode", 0)),
        not a.get("count_include_pad", 0) == 0,
    )


def _dropout(node, ins, a, env):
    return [ins[0], torch.ones_like(ins[0], dtype=torch.bool)]


def _maxpool(node, ins, a, env):
    x = ins[0]
    nd = x.dim() - 2
    k = a["kernel_shape"]
    pads = a.get("pads", [0] * (2 * nd))
    fpad = [p for i in reversed(range(nd)) for p in (pads[i], pads[i + nd])]
    x = F.pad(x, fpad, value=-math.inf)
    fn = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[nd - 1]
    return fn(x, k, a.get("strides", [1] * nd), 0, a.get("dilations", [1] * nd))


_OPS = {
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
    "BatchNormalization": _bn,
    "LayerNormalization": _layer_norm,
    "RMSNormalization": _rms_norm,
    "GroupNormalization": _group_norm,
    "Pow": lambda n, i, a, e: i[0] ** i[1],
    "Sqrt": lambda n, i, a, e: torch.sqrt(i[0]),
    "Gemm": _gemm,
    "MatMul": lambda n, i, a, e: i[0] @ i[1],
    "Add": lambda n, i, a, e: i[0] + i[1],
    "Sub": lambda n, i, a, e: i[0] - i[1],
    "Mul": lambda n, i, a, e: i[0] * i[1],
    "Div": lambda n, i, a, e: i[0] / i[1],
    "Relu": lambda n, i, a, e: torch.relu(i[0]),
    "Sigmoid": lambda n, i, a, e: torch.sigmoid(i[0]),
    "Identity": lambda n, i, a, e: i[0],
    "Dropout": _dropout,
    "Reshape": _reshape,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Flatten": lambda n, i, a, e: i[0].reshape(math.prod(i[0].shape[: a.get("axis", 1)]), -1),
    "Transpose": lambda n, i, a, e: i[0].permute(*a["perm"]),
    "GlobalAveragePool": lambda n, i, a, e: i[0].mean(dim=tuple(range(2, i[0].dim())), keepdim=True),
    "MaxPool": _maxpool,
    "Constant": _constant,
    "Cast": lambda n, i, a, e: i[0],
    "If": _if,
    "Loop": _loop,
    "ReduceMean": _reduce_mean,
    "AveragePool": _avgpool,
    "Sum": lambda n, i, a, e: sum(i[1:], i[0]),
    "Softmax": lambda n, i, a, e: torch.softmax(i[0], dim=a.get("axis", -1)),
    "Slice": _slice,
    "Expand": lambda n, i, a, e: i[0].expand(torch.broadcast_shapes(i[0].shape, tuple(i[1].tolist()))),
    "CastLike": lambda n, i, a, e: i[0].to(i[1].dtype),
    "ConstantOfShape": lambda n, i, a, e: torch.full(
        i[0].tolist(), float(numpy_helper.to_array(a["value"]).reshape(-1)[0]), dtype=torch.float64
    ),
    "Shape": lambda n, i, a, e: torch.tensor(i[0].shape[a.get("start", 0) : a.get("end", None)], dtype=torch.int64),
    "Concat": lambda n, i, a, e: torch.cat(i, dim=a["axis"]),
}
