"""Five small models that break in fp16 for reasons of range, not of BatchNorm, each built the way the field reports
the failure.  Every one is finite and well-conditioned in float32; under fp16 one value passes 65504.

- :class:`AttentionScores`: scores spelled ``(q @ kᵀ) / sqrt(d)``: the matmul overflows before the divide.
- :class:`ResidualStream`: a pre-RMSNorm residual stream (RMSNorm spelled as Llama/Gemma code spells it) that grows
  past 65504; its ``x²`` overflows first.
- :class:`HotChannels`: a conv whose hot channels pass 65504 before ReLU and max-pool; the next conv is scaled to
  compensate, so float32 is fine.
- :class:`SumMean`: an SE block whose mean is ``sum(x) * (1/HW)``: the sum overflows.
- :class:`SpelledLayerNorm`: a LayerNorm spelled out (``(x - u).pow(2).mean()``), or ``nn.LayerNorm`` exported to
  ONNX opset 14 (decomposed by the exporter): its ``Pow`` overflows and the output collapses to the bias, with no
  NaN.

``RANGE_MODELS`` maps a name to its class; ``build(name)`` makes the model (eval mode, fixed weights),
``batches(model, n)`` its inputs, ``program(model, ir)`` and ``onnx_model(model, exporter)`` its exports.
"""

from __future__ import annotations

import io
import math
import warnings

import torch
from torch import nn

CLASSES = 10


def _scale_rows(layer: nn.Module, rows, factor: float) -> None:
    with torch.no_grad():
        layer.weight[rows] *= factor
        if getattr(layer, "bias", None) is not None:
            layer.bias[rows] *= factor


class AttentionScores(nn.Module):
    """One attention head over ``[B, T, D]`` tokens, then a classifier on the mean token.  ``q`` and ``k`` share
    their projection's direction, so each token's score with itself is ``|q|²`` (~1.4e5)."""

    shapes = ((2, 16, 64),)

    def __init__(self, d: int = 64):
        super().__init__()
        self.d = d
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.head = nn.Linear(d, CLASSES)
        with torch.no_grad():
            self.q.weight.mul_(80.0)
            self.k.weight.copy_(self.q.weight)
            self.k.bias.copy_(self.q.bias)

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.d)
        return self.head((scores.softmax(dim=-1) @ v).mean(dim=1))


class RMSNorm(nn.Module):
    """RMSNorm as Llama and Gemma code spell it."""

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class ResidualStream(nn.Module):
    """An embedding projection writes a residual stream; each block adds ``proj(norm(h))`` to it; a final norm
    and a classifier read it.  The writers are large, so the stream passes 65504 by the last block."""

    shapes = ((2, 8, 32),)

    def __init__(self, d: int = 32, blocks: int = 3):
        super().__init__()
        self.embed = nn.Linear(d, d)
        self.norms = nn.ModuleList(RMSNorm(d) for _ in range(blocks))
        self.projs = nn.ModuleList(nn.Linear(d, d) for _ in range(blocks))
        self.final = RMSNorm(d)
        self.head = nn.Linear(d, CLASSES)
        with torch.no_grad():
            self.embed.weight.mul_(4e4)
            self.embed.bias.mul_(4e4)
            for p in self.projs:
                p.weight.mul_(2e4)
                p.bias.mul_(2e4)

    def forward(self, x):
        h = self.embed(x)
        for norm, proj in zip(self.norms, self.projs):
            h = h + proj(norm(h))
        return self.head(self.final(h)).mean(dim=1)


class HotChannels(nn.Module):
    """conv -> ReLU -> max-pool -> conv, with four of the first conv's output channels 4096 times hotter and the
    second conv's matching input channels 4096 times cooler: the same function as without them in float32."""

    shapes = ((2, 3, 32, 32),)

    def __init__(self, hot: float = 4096.0):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.head = nn.Linear(16, CLASSES)
        with torch.no_grad():
            self.conv1.weight.mul_(8.0)
            self.conv1.bias.add_(1.0)
            _scale_rows(self.conv1, slice(0, 4), hot)
            self.conv2.weight[:, 0:4] /= hot

    def forward(self, x):
        y = self.conv2(self.pool(self.conv1(x).relu())).relu()
        return self.head(y.mean(dim=(2, 3)))


class SumMean(nn.Module):
    """conv -> ReLU -> squeeze-and-excitation whose mean is spelled ``sum(x) * (1/HW)`` (a 64x64 map: the sum
    passes 65504 where the mean is ~20) -> conv -> classifier."""

    shapes = ((2, 3, 64, 64),)

    def __init__(self, c: int = 16):
        super().__init__()
        self.conv = nn.Conv2d(3, c, 3, padding=1)
        self.fc1 = nn.Conv2d(c, 4, 1)
        self.fc2 = nn.Conv2d(4, c, 1)
        self.out = nn.Conv2d(c, c, 3, padding=1)
        self.head = nn.Linear(c, CLASSES)
        with torch.no_grad():
            self.conv.weight.mul_(4.0)
            self.conv.bias.fill_(20.0)

    def forward(self, x):
        y = self.conv(x).relu()
        hw = y.shape[2] * y.shape[3]
        s = y.sum(dim=(2, 3), keepdim=True) * (1.0 / hw)
        y = y * self.fc2(self.fc1(s).relu()).sigmoid()
        return self.head(self.out(y).relu().mean(dim=(2, 3)))


class SpelledLayerNorm(nn.Module):
    """A token projection with large outputs, a LayerNorm (spelled out as ConvNeXt's channels-last code spells
    it, or ``nn.LayerNorm`` with ``fused=True``) and a classifier on the mean token.  ``(x - u)²`` reaches ~1e6."""

    shapes = ((2, 8, 32),)

    def __init__(self, d: int = 32, fused: bool = False, eps: float = 1e-5):
        super().__init__()
        self.proj = nn.Linear(d, d)
        self.fused = nn.LayerNorm(d, eps=eps) if fused else None
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))
        self.head = nn.Linear(d, CLASSES)
        with torch.no_grad():
            self.proj.weight.mul_(2000.0)
            self.weight.uniform_(0.5, 1.5)
            self.bias.uniform_(-0.5, 0.5)
            if self.fused is not None:
                self.fused.weight.copy_(self.weight)
                self.fused.bias.copy_(self.bias)

    def forward(self, x):
        x = self.proj(x)
        if self.fused is not None:
            x = self.fused(x)
        else:
            u = x.mean(-1, keepdim=True)
            s = (x - u).pow(2).mean(-1, keepdim=True)
            x = (x - u) / torch.sqrt(s + self.eps)
            x = self.weight * x + self.bias
        return self.head(x).mean(dim=1)


RANGE_MODELS = {
    "attention": AttentionScores,
    "residual": ResidualStream,
    "hot_channels": HotChannels,
    "sum_mean": SumMean,
    "layer_norm": SpelledLayerNorm,
}


def build(name: str, seed: int = 0, **kwargs) -> nn.Module:
    """The model ``name`` of :data:`RANGE_MODELS` with fixed weights, in eval mode."""
    torch.manual_seed(seed)
    return RANGE_MODELS[name](**kwargs).eval()


def batches(model: nn.Module, n: int = 2, seed: int = 1) -> list[tuple]:
    """``n`` batches of standard-normal inputs of the model's shapes (one tuple of forward arguments each)."""
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(*s, generator=g) for s in model.shapes) for _ in range(n)]


def program(model: nn.Module, ir: str = "default"):
    """``torch.export`` of ``model`` on its shapes, brought to ``ir``: default, decomposed or edge (ExecuTorch)."""
    ep = torch.export.export(model, batches(model, 1, seed=0)[0])
    if ir == "decomposed":
        return ep.run_decompositions()
    if ir == "edge":
        from executorch.exir import EdgeCompileConfig, to_edge

        return to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()
    if ir != "default":
        raise ValueError(f"unknown IR {ir!r}")
    return ep


def onnx_model(model: nn.Module, exporter: str = "torchscript", opset: int = 14):
    """``model`` exported to ONNX: ``torchscript`` (``dynamo=False`` at ``opset``; opset 14 spells LayerNorm
    out) or ``dynamo`` (``optimize=False``, the exporter's own opset).  Input names ``x0``, ``x1``, ..."""
    import onnx

    args = batches(model, 1, seed=0)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            return torch.onnx.export(model, args, dynamo=True, optimize=False, verbose=False).model_proto
        if exporter != "torchscript":
            raise ValueError(f"unknown exporter {exporter!r}")
        f = io.BytesIO()
        names = [f"x{i}" for i in range(len(args))]
        torch.onnx.export(model, args, f, dynamo=False, opset_version=opset, input_names=names)
        return onnx.load_from_string(f.getvalue())
