"""Benchmark models: the conv-BN-ReLU chain (part A) and three architectures (parts B and C).

Every architecture is built from plain ``nn`` layers so that the same class
can be instantiated with BatchNorm (the model to fold) or with every
BatchNorm replaced by ``nn.Identity`` (the ideal a fold can reach: the same
convs, no normalization at all).

Realistic BatchNorm statistics come from :func:`calibrate`: the model runs in
train mode (BatchNorm momentum ``None``, i.e. a cumulative average) on a few
batches of structured random inputs, then switches to eval; the affine
parameters (gamma, beta) are drawn around 1 and 0 beforehand.  The running
statistics are therefore what the network actually produces on such inputs,
not the 0/1 defaults (with the defaults, BatchNorm is almost the identity and
fp16 sees nothing).
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn


def _norm(kind: str, channels: int, bn: bool) -> nn.Module:
    if not bn:
        return nn.Identity()
    return {"2d": nn.BatchNorm2d, "1d": nn.BatchNorm1d}[kind](channels)


# -- part A: the chain ---------------------------------------------------------------------------


class Chain(nn.Module):
    """``blocks`` conv-BN-ReLU blocks, alternating a plain 3x3 conv and a depthwise 3x3 conv."""

    def __init__(self, blocks: int, channels: int = 8):
        super().__init__()
        layers = []
        for i in range(blocks):
            groups = channels if i % 2 else 1
            layers += [
                nn.Conv2d(channels, channels, 3, padding=1, groups=groups, bias=False),
                nn.BatchNorm2d(channels),
                nn.ReLU(),
            ]
        self.body = nn.Sequential(*layers)

    def forward(self, x):
        return self.body(x)


def chain(blocks: int, channels: int = 8, size: int = 8) -> tuple[nn.Module, tuple]:
    torch.manual_seed(blocks)
    model = Chain(blocks, channels)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            _random_affine(m)
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    return model.eval(), (torch.randn(1, channels, size, size),)


def hot_chain(blocks: int, channels: int = 8, size: int = 8, gain: float = 2.0**13) -> tuple[nn.Module, tuple]:
    """Part A's chain for the fp16 range rewrite: calibrated statistics, every second BatchNorm's affine times ``gain``,
    so that every second block's output passes fp16's range over the default margin (65504 / 16) and the next block
    brings it back: ``blocks / 2`` values to rewrite, the same work per block at every size.

    The statistics come from 2 batches of 64: from 2 batches of 4 (as before) some channels' variance came out
    small, and in eval mode the chain's scale grew with depth from where that happened (which blocks, a matter of
    the seed: with ``chain(800)``'s weights the odd blocks' outputs had a standard deviation of 50 at block 101 and
    1e8 at block 799 where about 1 was meant, with or without ``gain``): 670 values past the limit at 800 blocks."""
    model, x = chain(blocks, channels, size)
    calibrate(model, x[0].shape, batches=2, batch_size=64, gain=lambda i: gain if i % 2 == 0 else 1.0)
    return model, x


# -- parts B and C: three architectures ----------------------------------------------------------


class ConvBN(nn.Sequential):
    def __init__(self, cin, cout, k=1, stride=1, groups=1, act: type | None = nn.SiLU, bn=True):
        layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), _norm("2d", cout, bn)]
        if act is not None:
            layers.append(act())
        super().__init__(*layers)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, reduced: int):
        super().__init__()
        self.reduce = nn.Conv2d(channels, reduced, 1)
        self.expand = nn.Conv2d(reduced, channels, 1)

    def forward(self, x):
        s = x.mean((2, 3), keepdim=True)
        return x * torch.sigmoid(self.expand(nn.functional.silu(self.reduce(s))))


class MBConv(nn.Module):
    def __init__(self, cin, cout, expand, stride, bn=True):
        super().__init__()
        mid = cin * expand
        self.expand = ConvBN(cin, mid, bn=bn) if expand != 1 else nn.Identity()
        self.depthwise = ConvBN(mid, mid, 3, stride, groups=mid, bn=bn)
        self.se = SqueezeExcite(mid, max(1, cin // 4))
        self.project = ConvBN(mid, cout, act=None, bn=bn)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.project(self.se(self.depthwise(self.expand(x))))
        return x + y if self.residual else y


class EfficientNetish(nn.Module):
    """EfficientNet-B0-like at reduced width: stem, MBConv stages (depthwise + squeeze-excite), head."""

    STAGES = ((16, 16, 1, 1, 1), (16, 24, 4, 2, 2), (24, 40, 4, 2, 2), (40, 80, 4, 2, 2), (80, 112, 4, 1, 1))

    def __init__(self, bn=True, classes=100, width=1.0):
        super().__init__()
        w = lambda c: max(8, int(round(c * width / 8)) * 8)  # noqa: E731
        self.stem = ConvBN(3, w(16), 3, 2, bn=bn)
        blocks = []
        for cin, cout, e, s, n in self.STAGES:
            for i in range(n):
                blocks.append(MBConv(w(cin) if i == 0 else w(cout), w(cout), e, s if i == 0 else 1, bn=bn))
        self.blocks = nn.Sequential(*blocks)
        self.head = ConvBN(w(self.STAGES[-1][1]), w(320), bn=bn)
        self.classifier = nn.Linear(w(320), classes)

    def forward(self, x):
        return self.classifier(self.head(self.blocks(self.stem(x))).mean((2, 3)))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride, bn=True):
        super().__init__()
        self.conv1 = ConvBN(cin, cout, 3, stride, act=nn.ReLU, bn=bn)
        self.conv2 = ConvBN(cout, cout, 3, 1, act=None, bn=bn)
        self.down = ConvBN(cin, cout, 1, stride, act=None, bn=bn) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x):
        return torch.relu(self.conv2(self.conv1(x)) + self.down(x))


class ResNetish(nn.Module):
    """ResNet-18-like at reduced width: 3x3 stem, four stages of two basic blocks, global pool, linear."""

    def __init__(self, bn=True, classes=100, width=16):
        super().__init__()
        self.stem = ConvBN(3, width, 3, 1, act=nn.ReLU, bn=bn)
        chans = [width, width * 2, width * 4, width * 8]
        blocks, cin = [], width
        for i, c in enumerate(chans):
            blocks += [BasicBlock(cin, c, 1 if i == 0 else 2, bn=bn), BasicBlock(c, c, 1, bn=bn)]
            cin = c
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


class ConvBN1d(nn.Sequential):
    def __init__(self, cin, cout, k, stride=1, groups=1, dilation=1, bn=True, act=True):
        pad = dilation * (k // 2)
        layers = [
            nn.Conv1d(cin, cout, k, stride, pad, dilation=dilation, groups=groups, bias=False),
            _norm("1d", cout, bn),
        ]
        if act:
            layers.append(nn.ReLU())
        super().__init__(*layers)


class Separable1d(nn.Sequential):
    """Time-channel separable conv: depthwise Conv1d + BN1d, pointwise Conv1d + BN1d (+ ReLU)."""

    def __init__(self, cin, cout, k, stride=1, dilation=1, bn=True, act=True):
        super().__init__(
            ConvBN1d(cin, cin, k, stride, groups=cin, dilation=dilation, bn=bn, act=False),
            ConvBN1d(cin, cout, 1, bn=bn, act=act),
        )


class AudioNet(nn.Module):
    """A MatchboxNet-like keyword-spotting net on 40 log-mel channels: separable prologue (k=11,
    stride 2), residual blocks of time-channel separable convs (depthwise + pointwise Conv1d, each
    followed by BatchNorm1d; 1x1 conv + BN1d on the residual path), separable epilogue (k=29,
    dilation 2), 1x1 convs to the classes, mean over time."""

    def __init__(self, bn=True, classes=35, mels=40, width=64, blocks=3, sub_blocks=2):
        super().__init__()
        self.stem = Separable1d(mels, width, 11, stride=2, bn=bn)
        body = []
        for i in range(blocks):
            k = (13, 15, 17, 19, 21, 23)[i % 6]
            subs = [Separable1d(width, width, k, bn=bn, act=j < sub_blocks - 1) for j in range(sub_blocks)]
            body.append(
                nn.ModuleDict({"main": nn.Sequential(*subs), "res": ConvBN1d(width, width, 1, bn=bn, act=False)})
            )
        self.body = nn.ModuleList(body)
        self.head = nn.Sequential(
            Separable1d(width, width, 29, dilation=2, bn=bn), ConvBN1d(width, 2 * width, 1, bn=bn)
        )
        self.out = nn.Conv1d(2 * width, classes, 1)

    def forward(self, x):
        x = self.stem(x)
        for b in self.body:
            x = torch.relu(b["main"](x) + b["res"](x))
        return self.out(self.head(x)).mean(2)


# name -> (constructor, input shape for benchmarks)
ARCHS = {
    "efficientnet": (EfficientNetish, (1, 3, 112, 112)),
    "resnet": (ResNetish, (1, 3, 32, 32)),
    "audio": (AudioNet, (1, 40, 200)),
}
QUICK_SHAPES = {"efficientnet": (1, 3, 32, 32), "resnet": (1, 3, 16, 16), "audio": (1, 40, 48)}
DESCRIPTIONS = {
    "efficientnet": "EfficientNet-B0-like (stem, 8 MBConv blocks: 1x1 expand, depthwise 3x3, SE, 1x1 project; head), "
    "SiLU, 100 classes",
    "resnet": "ResNet-18-like at width 16 (3x3 stem, 8 basic blocks, 1x1 conv+BN downsample), ReLU, 100 classes",
    "audio": "MatchboxNet-3x2-like 1-D net on 40 log-mel channels (separable Conv1d+BatchNorm1d "
    "prologue k=11/2, 3 residual blocks of 2 separable sub-blocks, epilogue k=29 dil. 2), 35 classes",
}


def _random_affine(m: nn.modules.batchnorm._BatchNorm) -> None:
    with torch.no_grad():
        m.weight.uniform_(0.5, 1.5)
        m.bias.uniform_(-0.3, 0.3)


def structured_inputs(shape: tuple, batches: int, seed: int = 0) -> list[torch.Tensor]:
    """Inputs with structure rather than white noise: smooth low-frequency fields plus noise,
    a per-sample gain and a non-zero mean (images: per-channel offsets like un-normalized pixels;
    audio: log-mel-like, negative mean and a per-band profile)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(batches):
        n, c, *spatial = shape
        small = [max(2, s // 8) for s in spatial]
        base = torch.randn(n, c, *small, generator=g)
        mode = "bilinear" if len(spatial) == 2 else "linear"
        smooth = nn.functional.interpolate(base, size=tuple(spatial), mode=mode, align_corners=False)
        noise = 0.3 * torch.randn(n, c, *spatial, generator=g)
        gain = torch.empty(n, *([1] * (len(shape) - 1))).uniform_(0.5, 2.0, generator=g)
        if len(spatial) == 1:  # log-mel-like: each band has its own level, overall negative
            level = torch.linspace(-2.0, -6.0, c).view(1, c, 1)
            x = level + gain * (smooth + noise)
        else:  # un-normalized-image-like: positive offsets per channel
            offset = torch.tensor([0.5, 0.4, 0.3][:c] + [0.4] * max(0, c - 3)).view(1, c, 1, 1)
            x = offset + 0.25 * gain * (smooth + noise)
        out.append(x)
    return out


@torch.no_grad()
def calibrate(
    model: nn.Module, shape: tuple, batches: int = 8, batch_size: int = 16, seed: int = 0, gain=None
) -> nn.Module:
    """Give every BatchNorm realistic statistics: random gamma/beta, then cumulative running
    mean/var from ``batches`` train-mode forward passes on structured inputs; returns the model in eval.
    ``gain(i)``: a factor on the i-th BatchNorm's gamma and beta, before the statistics are measured."""
    torch.manual_seed(seed)
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for i, m in enumerate(norms):
        _random_affine(m)
        if gain is not None:
            with torch.no_grad():
                m.weight.mul_(gain(i))
                m.bias.mul_(gain(i))
        m.reset_running_stats()
        m.momentum = None  # cumulative moving average over the calibration batches
    model.train()
    for x in structured_inputs((batch_size, *shape[1:]), batches, seed):
        model(x)
    for m in norms:
        m.momentum = 0.1
    return model.eval()


def build(arch: str, shape: tuple | None = None, calib_batches: int = 8, seed: int = 0) -> dict:
    """The calibrated model, the same network without BatchNorm (the ideal), and example inputs.

    The ideal network copies every conv / linear weight of the calibrated model unchanged; its
    outputs differ (no normalization), its cost is what a perfect fold reaches.
    """
    ctor, default_shape = ARCHS[arch]
    shape = tuple(shape or default_shape)
    torch.manual_seed(seed)
    model = calibrate(ctor(bn=True), shape, batches=calib_batches, seed=seed)
    ideal = ctor(bn=False)
    own = {k: v for k, v in model.state_dict().items()}
    missing = ideal.load_state_dict({k: v for k, v in own.items() if k in ideal.state_dict()}, strict=False)
    assert not missing.missing_keys, missing.missing_keys
    ideal.eval()
    example = (structured_inputs(shape, 1, seed=seed + 1000)[0],)
    n_bn = sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    params = sum(p.numel() for p in model.parameters())
    return {
        "model": model,
        "ideal": ideal,
        "example": example,
        "shape": shape,
        "batchnorms": n_bn,
        "parameters": params,
    }


@torch.no_grad()
def bn_stats_summary(model: nn.Module) -> dict:
    """How far the calibrated statistics are from the 0/1 defaults (reported next to the results)."""
    kappas, scales = [], []
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            std = torch.sqrt(m.running_var + m.eps)
            kappas.append(float((m.running_mean.abs() / std).max()))
            scales.append(float((m.weight.abs() / std).max()))
    return {
        "max_kappa": max(kappas) if kappas else math.nan,
        "median_kappa": sorted(kappas)[len(kappas) // 2] if kappas else math.nan,
        "max_scale": max(scales) if scales else math.nan,
    }


def clone(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model)


def ideal_with_bias(arch: str, folded_state: dict) -> nn.Module:
    """The BatchNorm-free network with a bias on every conv / linear that the fold gave one, loaded with the
    folded program's tensors: structurally what a fold produces, built directly (a control for part B)."""
    ctor, _ = ARCHS[arch]
    net = ctor(bn=False)
    for name, m in net.named_modules():
        if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Linear)) and m.bias is None and f"{name}.bias" in folded_state:
            m.bias = nn.Parameter(torch.zeros(m.weight.shape[0]))
    own = net.state_dict()
    missing = net.load_state_dict({k: v for k, v in folded_state.items() if k in own}, strict=False)
    assert not missing.missing_keys, missing.missing_keys
    return net.eval()
