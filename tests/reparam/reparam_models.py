"""Over-parameterized blocks written for the re-parameterization tests (random weights, BN
statistics calibrated with a few train-mode batches): RepVGG, MobileOne, RepViT / RepGhost,
FastViT RepMixer, ACNet, a DBB-like avg-pool branch, and the refused variants."""

from __future__ import annotations

import torch
import torch.nn as nn


def conv_bn(cin, cout, k, stride=1, padding=None, groups=1, bias=False):
    padding = tuple(x // 2 for x in k) if padding is None and isinstance(k, tuple) else padding
    padding = k // 2 if padding is None else padding
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, padding, groups=groups, bias=bias), nn.BatchNorm2d(cout))


class RepVGG(nn.Module):
    def __init__(self, c=4, cout=None, groups=1, stride=1, identity=True):
        super().__init__()
        cout = cout or c
        self.dense = conv_bn(c, cout, 3, stride, groups=groups)
        self.one = conv_bn(c, cout, 1, stride, groups=groups)
        self.skip = nn.BatchNorm2d(c) if identity and stride == 1 and c == cout else None

    def forward(self, x):
        y = self.dense(x) + self.one(x)
        return torch.relu(y + self.skip(x) if self.skip is not None else y)


class MobileOne(nn.Module):
    """k conv branches + a 1×1 scale branch + an identity BN (depthwise), then a pointwise one."""

    def __init__(self, c=4, k=3):
        super().__init__()
        self.dw = nn.ModuleList(conv_bn(c, c, 3, groups=c) for _ in range(k))
        self.dw_scale = conv_bn(c, c, 1, groups=c)
        self.dw_skip = nn.BatchNorm2d(c)
        self.pw = nn.ModuleList(conv_bn(c, c, 1) for _ in range(k))
        self.pw_skip = nn.BatchNorm2d(c)

    def forward(self, x):
        out = self.dw_scale(x) + self.dw_skip(x)
        for branch in self.dw:
            out = out + branch(x)
        x = torch.relu(out)
        out = self.pw_skip(x)
        for branch in self.pw:
            out = out + branch(x)
        return torch.relu(out)


class RepViTGhost(nn.Module):
    """RepViT's RepVGGDW (``bn(conv_bn(x) + conv1x1(x) + x)``) then a RepGhost-like identity BN on a depthwise conv."""

    def __init__(self, c=4):
        super().__init__()
        self.conv = conv_bn(c, c, 3, groups=c)
        self.conv1 = nn.Conv2d(c, c, 1, groups=c)
        self.bn = nn.BatchNorm2d(c)
        self.ghost = conv_bn(c, c, 3, groups=c)
        self.fusion = nn.BatchNorm2d(c)

    def forward(self, x):
        x = self.bn(self.conv(x) + self.conv1(x) + x)
        x = torch.relu(x)
        return torch.relu(self.ghost(x) + self.fusion(x))


class RepMixer(nn.Module):
    """FastViT: ``x + layer_scale * (mixer(x) - norm(x))``, mixer a depthwise conv+BN, norm an identity BN."""

    def __init__(self, c=4):
        super().__init__()
        self.mixer = conv_bn(c, c, 3, groups=c)
        self.norm = nn.BatchNorm2d(c)
        self.layer_scale = nn.Parameter(torch.rand(c, 1, 1) + 0.5)

    def forward(self, x):
        return x + self.layer_scale * (self.mixer(x) - self.norm(x))


class ACNet(nn.Module):
    def __init__(self, c=4, cout=6):
        super().__init__()
        self.square = conv_bn(c, cout, 3)
        self.hor = conv_bn(c, cout, (1, 3), padding=(0, 1))
        self.ver = conv_bn(c, cout, (3, 1), padding=(1, 0))

    def forward(self, x):
        return torch.relu(self.square(x) + self.hor(x) + self.ver(x))


class AvgBranch(nn.Module):
    def __init__(self, c=4, stride=1, count_include_pad=True):
        super().__init__()
        self.dense = conv_bn(c, c, 3, stride)
        self.one = conv_bn(c, c, 1, stride)
        self.pool = nn.Sequential(nn.AvgPool2d(3, stride, 1, count_include_pad=count_include_pad), nn.BatchNorm2d(c))

    def forward(self, x):
        return self.pool(x) + self.dense(x) + self.one(x)


class InPlaceSums(nn.Module):
    """GhostNetV3's ghost module and stride-2 depthwise conv, summed as it (and timm's MobileOne) writes
    it: ``out = 0`` or the scale and identity branches, then ``out += branch(x)`` per conv branch
    (``add_`` in the default IR; the stride-2 one subtracts, ``sub_``), an in-place ReLU."""

    def __init__(self, c=4):
        super().__init__()
        self.primary = nn.ModuleList(conv_bn(c, c, 1) for _ in range(3))
        self.cheap = nn.ModuleList(conv_bn(c, c, 3, groups=c) for _ in range(3))
        self.cheap_scale, self.cheap_skip = conv_bn(c, c, 1, groups=c), nn.BatchNorm2d(c)
        self.dw = nn.ModuleList(conv_bn(2 * c, 2 * c, 3, 2, groups=2 * c) for _ in range(3))
        self.dw_scale = conv_bn(2 * c, 2 * c, 1, 2, groups=2 * c)

    def forward(self, x):
        x1 = 0
        for branch in self.primary:
            x1 += branch(x)
        x1 = torch.relu_(x1)
        x2 = self.cheap_scale(x1) + self.cheap_skip(x1)
        for branch in self.cheap:
            x2 += branch(x1)
        y = torch.cat([x1, x2], 1)
        out = self.dw_scale(y)
        for branch in self.dw:
            out -= branch(y)
        return out


class BranchTwice(nn.Module):
    """One branch's value summed twice (``y + y``) with a second branch: the kept conv appears twice."""

    def __init__(self, c=4):
        super().__init__()
        self.dense, self.one = conv_bn(c, c, 3), conv_bn(c, c, 1)

    def forward(self, x):
        y = self.dense(x)
        return y + y + self.one(x)


# ------------------------------------------------------------------------------------------- refused


class ActivationInBranch(nn.Module):
    def __init__(self, c=4):
        super().__init__()
        self.dense, self.one = conv_bn(c, c, 3), conv_bn(c, c, 1)

    def forward(self, x):
        return torch.relu(self.dense(x)) + self.one(x)


class SharedBranch(nn.Module):
    def __init__(self, c=4):
        super().__init__()
        self.dense, self.one = conv_bn(c, c, 3), conv_bn(c, c, 1)

    def forward(self, x):
        y = self.one(x)
        return self.dense(x) + y, y


class DifferentInputs(nn.Module):
    def __init__(self, c=4):
        super().__init__()
        self.dense, self.one, self.other = conv_bn(c, c, 3), conv_bn(c, c, 1), conv_bn(c, c, 1)

    def forward(self, x):
        return self.dense(x) + self.other(torch.relu(x)) + self.one(x)


class DifferentStrides(nn.Module):
    """A 3×3 stride-1 branch and a 1×1 stride-2 branch with the same output size (6×6 of 8×8)."""

    def __init__(self, c=4):
        super().__init__()
        self.dense, self.one = conv_bn(c, c, 3, 1, padding=0), conv_bn(c, c, 1, 2, padding=2)

    def forward(self, x):
        return self.dense(x) + self.one(x)


class DifferentGroups(nn.Module):
    def __init__(self, c=4):
        super().__init__()
        self.dense, self.one = conv_bn(c, c, 3), conv_bn(c, c, 1, groups=2)

    def forward(self, x):
        return self.dense(x) + self.one(x)


class DifferentDilations(nn.Module):
    def __init__(self, c=4):
        super().__init__()
        self.dense = conv_bn(c, c, 3)
        self.wide = nn.Sequential(nn.Conv2d(c, c, 3, padding=2, dilation=2, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        return self.dense(x) + self.wide(x)


class Misaligned(nn.Module):
    """A 3×3 stride-2 branch padded by 1 and a 2×2 one padded by 0: the same 4×4 output of 8×8, but
    the 2×2 window is half a tap off the 3×3's centre."""

    def __init__(self, c=4):
        super().__init__()
        self.dense, self.two = conv_bn(c, c, 3, 2), conv_bn(c, c, 2, 2, padding=0)

    def forward(self, x):
        return self.dense(x) + self.two(x)


class InPlaceIntoInput(nn.Module):
    """``x += conv_bn(x)``: the in-place add writes into the value its branch reads (exact as a sum once
    functional, in the decomposed IR; refused on the ``add_`` of the default IR)."""

    def __init__(self, c=4):
        super().__init__()
        self.conv = conv_bn(c, c, 3)

    def forward(self, x):
        x = torch.relu(x)
        x += self.conv(x)
        return x


def calibrate(module: nn.Module, shape, seed: int = 0) -> nn.Module:
    """Random weights, BN statistics from a few train-mode batches, random BN affines; eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        module.train()
        for _ in range(3):
            module(torch.randn(8, *shape[1:], generator=g) * 2 + 0.5)
        for m in module.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.copy_(torch.rand(m.num_features, generator=g) * 1.5 + 0.25)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.5)
    return module.eval()


class StemThenRepVGG(nn.Module):
    """A RepVGG block whose input is a conv's output (the identity term is then that conv's value)."""

    def __init__(self, c=4):
        super().__init__()
        self.stem, self.block = conv_bn(c, c, 3), RepVGG(c)

    def forward(self, x):
        return self.block(self.stem(x))


class SamePadding(nn.Module):
    """ACNet-like branches written with ``padding="same"`` (torch's ``conv2d.padding`` overload) and an identity."""

    def __init__(self, c=4):
        super().__init__()
        self.square = nn.Sequential(nn.Conv2d(c, c, 3, padding="same", bias=False), nn.BatchNorm2d(c))
        self.one = nn.Sequential(nn.Conv2d(c, c, 1, padding="same", bias=False), nn.BatchNorm2d(c))
        self.hor = nn.Sequential(nn.Conv2d(c, c, (1, 3), padding="same", bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        return self.square(x) + self.one(x) + self.hor(x) + x
