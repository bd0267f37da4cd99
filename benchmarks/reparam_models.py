"""The models ``benchmarks/reparam.py`` compares (issue 21), written here: timm is not a dependency.

Each is shaped like the published network (widths, depths, branches per block) and is built with
random weights; ``calibrated()`` gives its BNs statistics from a few train-mode batches.  Every
re-parameterizable block has its own ``reparameterize()`` (plain torch, float64-exact), which
``Net.reparameterize()`` calls: the benchmark's ``own`` program.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def _conv_bn(cin, cout, k, stride, groups):
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout))


class RepBlock(nn.Module):
    """``act(Σ conv_bn_k(x) + conv_bn_1x1(x) + bn(x))`` with its own ``reparameterize()``.

    ``inplace`` sums the way GhostNetV3 (and timm's MobileOne) write it: the scale and identity
    branches (or ``0``), then ``out += conv(x)`` per conv branch, and an in-place ReLU."""

    def __init__(self, cin, cout, k, stride, groups, n_conv, scale_branch, act=True, inplace=False):
        super().__init__()
        self.k, self.stride, self.groups, self.inplace = k, stride, groups, inplace
        self.convs = nn.ModuleList(_conv_bn(cin, cout, k, stride, groups) for _ in range(n_conv))
        self.scale = _conv_bn(cin, cout, 1, stride, groups) if scale_branch and k > 1 else None
        self.skip = nn.BatchNorm2d(cin) if cin == cout and stride == 1 else None
        self.act = nn.ReLU(inplace) if act else nn.Identity()
        self.deploy = None

    def forward(self, x):
        if self.deploy is not None:
            return self.act(self.deploy(x))
        if self.inplace:
            first = [branch(x) for branch in (self.scale, self.skip) if branch is not None]
            out = first[0] + first[1] if len(first) == 2 else first[0] if first else 0
            for conv in self.convs:
                out += conv(x)
            return self.act(out)
        out = 0
        if self.scale is not None:
            out = self.scale(x)
        if self.skip is not None:
            out = out + self.skip(x)
        for conv in self.convs:
            out = out + conv(x)
        return self.act(out)

    @staticmethod
    def _fuse(kernel, bn):
        std = (bn.running_var + bn.eps).sqrt()
        t = (bn.weight / std).reshape(-1, 1, 1, 1)
        return kernel * t, bn.bias - bn.running_mean * bn.weight / std

    @torch.no_grad()
    def reparameterize(self):
        conv0 = self.convs[0][0]
        kernel = torch.zeros_like(conv0.weight)
        bias = torch.zeros(conv0.out_channels, dtype=kernel.dtype)
        for conv, bn in self.convs:
            k, b = self._fuse(conv.weight, bn)
            kernel, bias = kernel + k, bias + b
        p = self.k // 2
        if self.scale is not None:
            k, b = self._fuse(self.scale[0].weight, self.scale[1])
            kernel, bias = kernel + nn.functional.pad(k, [p, p, p, p]), bias + b
        if self.skip is not None:
            per_group = conv0.in_channels // self.groups
            ident = torch.zeros_like(conv0.weight)
            for o in range(conv0.out_channels):
                ident[o, o % per_group, p, p] = 1.0
            k, b = self._fuse(ident, self.skip)
            kernel, bias = kernel + k, bias + b
        deploy = nn.Conv2d(
            conv0.in_channels, conv0.out_channels, self.k, self.stride, p, groups=self.groups, dtype=kernel.dtype
        )
        deploy.weight.copy_(kernel)
        deploy.bias.copy_(bias)
        self.deploy = deploy
        del self.convs, self.scale, self.skip
        self.convs, self.scale, self.skip = nn.ModuleList(), None, None


class Net(nn.Module):
    def __init__(self, blocks, channels, classes=1000):
        super().__init__()
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(channels, classes)

    def forward(self, x):
        return self.head(self.blocks(x).mean((2, 3)))

    def reparameterize(self):
        merge_blocks(self)


def merge_blocks(model: nn.Module) -> None:
    """Every re-parameterizable block of ``model`` merged by its own ``reparameterize()``."""
    for m in list(model.modules()):
        if m is not model and hasattr(m, "reparameterize"):
            m.reparameterize()


def mobileone_s0():
    """MobileOne-s0: widths 48/48/128/256/1024, blocks 2/8/10/1, 4 conv branches, depthwise + pointwise."""
    blocks = [RepBlock(3, 48, 3, 2, 1, 4, True)]
    cin = 48
    for cout, n in ((48, 2), (128, 8), (256, 10), (1024, 1)):
        for i in range(n):
            stride = 2 if i == 0 else 1
            blocks.append(RepBlock(cin, cin, 3, stride, cin, 4, True))
            blocks.append(RepBlock(cin, cout, 1, 1, 1, 4, True))
            cin = cout
    return Net(blocks, cin)


def repvgg_a0():
    """RepVGG-A0: widths 48/48/96/192/1280, blocks 1/2/4/14/1; a 3×3 and a 1×1 branch, identity BN."""
    blocks, cin = [], 3
    for cout, n in ((48, 1), (48, 2), (96, 4), (192, 14), (1280, 1)):
        for i in range(n):
            blocks.append(RepBlock(cin, cout, 3, 2 if i == 0 else 1, 1, 1, True))
            cin = cout
    return Net(blocks, cin)


class RepVGGDW(nn.Module):
    """RepViT's token mixer: ``bn(conv_bn_3x3(x) + conv_1x1(x) + x)``, depthwise, with its own ``fuse``."""

    def __init__(self, c):
        super().__init__()
        self.conv = _conv_bn(c, c, 3, 1, c)
        self.conv1 = nn.Conv2d(c, c, 1, groups=c)
        self.bn = nn.BatchNorm2d(c)
        self.deploy = None

    def forward(self, x):
        if self.deploy is not None:
            return self.deploy(x)
        return self.bn(self.conv(x) + self.conv1(x) + x)

    @torch.no_grad()
    def reparameterize(self):
        k, b = RepBlock._fuse(self.conv[0].weight, self.conv[1])
        k = k + nn.functional.pad(self.conv1.weight, [1, 1, 1, 1])
        b = b + self.conv1.bias
        ident = torch.zeros_like(k)
        ident[:, 0, 1, 1] = 1.0
        k, b = k + ident, b
        k, b2 = RepBlock._fuse(k, self.bn)
        b = b * (self.bn.weight / (self.bn.running_var + self.bn.eps).sqrt()) + b2
        deploy = nn.Conv2d(k.shape[0], k.shape[0], 3, 1, 1, groups=k.shape[0], dtype=k.dtype)
        deploy.weight.copy_(k)
        deploy.bias.copy_(b)
        self.deploy = deploy
        del self.conv, self.conv1, self.bn


class RepViTBlock(nn.Module):
    """Token mixer (RepVGGDW, or a stride-2 depthwise conv_bn + pointwise conv_bn), then a residual
    channel mixer ``x + conv_bn(gelu(conv_bn(x)))``."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        if stride == 1:
            self.token = RepVGGDW(cin)
        else:
            self.token = nn.Sequential(_conv_bn(cin, cin, 3, 2, cin), _conv_bn(cin, cout, 1, 1, 1))
        self.mix = nn.Sequential(_conv_bn(cout, 2 * cout, 1, 1, 1), nn.GELU(), _conv_bn(2 * cout, cout, 1, 1, 1))

    def forward(self, x):
        x = self.token(x)
        return x + self.mix(x)


def repvit_m0_9():
    """RepViT-M0.9-shaped: stem to 48, widths 48/96/192/384, blocks 2/2/14/2 (stride 2 at each new stage)."""
    blocks = [_conv_bn(3, 24, 3, 2, 1), nn.GELU(), _conv_bn(24, 48, 3, 2, 1)]
    cin = 48
    for cout, n in ((48, 2), (96, 2), (192, 14), (384, 2)):
        for i in range(n):
            stride = 2 if i == 0 and cout != cin else 1
            blocks.append(RepViTBlock(cin, cout, stride))
            cin = cout
    net = Net(blocks, cin)
    return net


# GhostNetV3 (Liu et al. 2024, "GhostNetV3: Exploring the Training Strategies for Compact Models"):
# GhostNet's bottlenecks with every conv of a ghost module (and the stride-2 depthwise conv)
# trained as parallel conv+BN branches that its ``reparameterize()`` merges.

#: GhostNet's bottlenecks (v1, v2 and v3 alike): dw kernel, expansion, out channels, SE ratio, stride.
GHOST_BLOCKS = (
    (3, 16, 16, 0, 1),
    (3, 48, 24, 0, 2),
    (3, 72, 24, 0, 1),
    (5, 72, 40, 0.25, 2),
    (5, 120, 40, 0.25, 1),
    (3, 240, 80, 0, 2),
    (3, 200, 80, 0, 1),
    (3, 184, 80, 0, 1),
    (3, 184, 80, 0, 1),
    (3, 480, 112, 0.25, 1),
    (3, 672, 112, 0.25, 1),
    (5, 672, 160, 0.25, 2),
    (5, 960, 160, 0, 1),
    (5, 960, 160, 0.25, 1),
    (5, 960, 160, 0, 1),
    (5, 960, 160, 0.25, 1),
)


def _divisible(v: float, divisor: int = 4) -> int:
    """``v`` rounded to a multiple of ``divisor``, never more than 10% below ``v`` (GhostNet's width rule)."""
    n = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return n + divisor if n < 0.9 * v else n


class GhostModuleV3(nn.Module):
    """``cat(x1, cheap(x1))`` with ``x1 = primary(x)``: the primary conv (kernel 1) as 3 conv+BN branches
    (plus an identity BN where it keeps the channels), the cheap operation a depthwise 3×3 as 3 conv+BN
    branches, a depthwise 1×1 conv+BN and an identity BN; each followed by the activation.  With
    ``attn`` (GhostNetV3's "shortcut" mode) the result is gated by a DFC attention computed at half
    resolution: ``sigmoid(bn(dw5x1(bn(dw1x5(bn(conv1x1(avg_pool2(x))))))))``, upsampled (nearest)."""

    def __init__(self, cin, cout, relu, attn):
        super().__init__()
        self.cout = cout
        init = math.ceil(cout / 2)
        self.primary = RepBlock(cin, init, 1, 1, 1, 3, True, act=relu, inplace=True)
        self.cheap = RepBlock(init, init, 3, 1, init, 3, True, act=relu, inplace=True)
        self.attn = None
        if attn:
            self.attn = nn.Sequential(
                nn.Conv2d(cin, cout, 1, bias=False),
                nn.BatchNorm2d(cout),
                nn.Conv2d(cout, cout, (1, 5), padding=(0, 2), groups=cout, bias=False),
                nn.BatchNorm2d(cout),
                nn.Conv2d(cout, cout, (5, 1), padding=(2, 0), groups=cout, bias=False),
                nn.BatchNorm2d(cout),
            )

    def forward(self, x):
        x1 = self.primary(x)
        out = torch.cat([x1, self.cheap(x1)], 1)
        if self.attn is None:
            return out
        gate = torch.sigmoid(self.attn(F.avg_pool2d(x, 2, 2)))
        return out[:, : self.cout] * F.interpolate(gate, size=out.shape[-2:], mode="nearest")


class SqueezeExcite(nn.Module):
    """``x * hard_sigmoid(conv(relu(conv(mean(x)))))``, the reduced width a multiple of 4."""

    def __init__(self, c, ratio):
        super().__init__()
        mid = _divisible(c * ratio)
        self.reduce, self.expand = nn.Conv2d(c, mid, 1), nn.Conv2d(mid, c, 1)

    def forward(self, x):
        s = self.expand(F.relu(self.reduce(x.mean((2, 3), keepdim=True))))
        return x * F.hardsigmoid(s)


class GhostBottleneckV3(nn.Module):
    """ghost module (ReLU) → [stride-2 depthwise k×k as 3 conv+BN branches + a 1×1 conv+BN] → [SE]
    → ghost module (no activation), ``+=`` the input (or a depthwise k×k conv+BN → 1×1 conv+BN of it)."""

    def __init__(self, cin, mid, cout, k, stride, se, attn):
        super().__init__()
        self.ghost1 = GhostModuleV3(cin, mid, True, attn)
        self.dw = RepBlock(mid, mid, k, stride, mid, 3, True, act=False, inplace=True) if stride > 1 else None
        self.se = SqueezeExcite(mid, se) if se else None
        self.ghost2 = GhostModuleV3(mid, cout, False, False)
        self.shortcut = None
        if cin != cout or stride != 1:
            self.shortcut = nn.Sequential(_conv_bn(cin, cin, k, stride, cin), _conv_bn(cin, cout, 1, 1, 1))

    def forward(self, x):
        y = self.ghost1(x)
        if self.dw is not None:
            y = self.dw(y)
        if self.se is not None:
            y = self.se(y)
        y = self.ghost2(y)
        y += x if self.shortcut is None else self.shortcut(x)
        return y


class GhostNetV3(nn.Module):
    """Stem (3×3 stride-2 conv+BN+ReLU), the 16 bottlenecks (DFC attention in the first ghost module
    from the third on), a 1×1 conv+BN+ReLU, global average pool, a 1×1 conv (bias) + ReLU to 1280
    and the classifier."""

    def __init__(self, width=1.0, classes=1000):
        super().__init__()
        cin = _divisible(16 * width)
        layers = [_conv_bn(3, cin, 3, 2, 1), nn.ReLU(inplace=True)]
        for i, (k, exp, c, se, stride) in enumerate(GHOST_BLOCKS):
            cout = _divisible(c * width)
            layers.append(GhostBottleneckV3(cin, _divisible(exp * width), cout, k, stride, se, attn=i > 1))
            cin = cout
        last = _divisible(GHOST_BLOCKS[-1][1] * width)
        layers += [_conv_bn(cin, last, 1, 1, 1), nn.ReLU(inplace=True)]
        self.blocks = nn.Sequential(*layers)
        self.conv_head = nn.Conv2d(last, 1280, 1)
        self.head = nn.Linear(1280, classes)

    def forward(self, x):
        x = F.adaptive_avg_pool2d(self.blocks(x), 1)
        return self.head(F.relu(self.conv_head(x)).flatten(1))

    def reparameterize(self):
        merge_blocks(self)


def ghostnetv3_050():
    """GhostNetV3-0.5×: GhostNet's 16 bottlenecks at width 0.5 (stem 8, outputs 8…80, head 480 → 1280)."""
    return GhostNetV3(width=0.5)


MODELS = {
    "mobileone_s0": mobileone_s0,
    "repvgg_a0": repvgg_a0,
    "repvit_m0_9": repvit_m0_9,
    "ghostnetv3_050": ghostnetv3_050,
}


def calibrated(make, size, seed=0):
    torch.manual_seed(seed)
    model = make()
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(4, 3, size, size))
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    return model.eval()
