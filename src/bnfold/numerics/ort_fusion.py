"""ONNX Runtime's Conv+BatchNormalization fusion on a float16 model, as the ``ort-cpu`` profile emulates it
(on an ONNX graph: :func:`fused_convs`; a torch program's conv + batch norm go through :func:`fuse_fp16` too).

ORT's basic graph optimizations fold a BatchNormalization that directly follows a Conv into the
Conv's weight and bias (ConvBNFusion).  In a float16 model those weights are fp16 and each
arithmetic step of the fusion is stored in fp16: the fold bnfold does in float64 happens there in
fp16.  (ORT also fuses Conv+Mul and Conv+Add of constants; emulating those made the PP-OCRv4
recognizer 8 dB worse than the real run, so they are not emulated.)
"""

from __future__ import annotations

import onnx
import torch

from .profiles import round_fp16 as r


def fused_convs(model: onnx.ModelProto, names: list[str], consts: dict, outputs: set) -> dict[str, tuple]:
    """``{conv node name: (weight, bias, [(absorbed node name, the value it reads)])}`` for each Conv
    whose output only a BatchNormalization reads; ``consts``: the fp16-rounded constants by value name."""
    nodes = dict(zip(names, model.graph.node))
    readers: dict[str, list[str]] = {}
    for name, n in nodes.items():
        for v in n.input:
            readers.setdefault(v, []).append(name)
    out = {}
    for name, n in nodes.items():
        if n.op_type != "Conv" or n.input[1] not in consts or (len(n.input) > 2 and n.input[2] not in consts):
            continue
        value = n.output[0]
        if value in outputs or len(readers.get(value, [])) != 1:
            continue
        bn = nodes[readers[value][0]]
        if bn.op_type != "BatchNormalization" or bn.input[0] != value or not all(i in consts for i in bn.input[1:5]):
            continue
        if any(a.name == "training_mode" and a.i for a in bn.attribute):
            continue
        w = consts[n.input[1]]
        b = consts[n.input[2]] if len(n.input) > 2 and n.input[2] else None
        eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        out[name] = (*fuse_fp16(w, b, *(consts[i] for i in bn.input[1:5]), eps), [(readers[value][0], value)])
    return out


def fuse_fp16(w, b, gamma, beta, mean, var, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """ORT's ConvBNFusion on fp16 constants: the fused ``(weight, bias)``, each arithmetic step rounded to
    fp16 (``b`` None: no bias).  Emulation of the runtime's arithmetic; the exact fold is ``bnfold.fold_math``."""
    gamma, beta, mean, var = (t.reshape(-1).to(torch.float32) for t in (gamma, beta, mean, var))
    b = torch.zeros(w.shape[0]) if b is None else b.reshape(-1).to(torch.float32)
    scale = r(gamma / r(torch.sqrt(r(var + eps))))
    shape = (-1,) + (1,) * (w.dim() - 1)
    return r(w.to(torch.float32) * scale.reshape(shape)), r(r(r(b - mean) * scale) + beta)
