"""The model zoo shared by the tests and the benchmarks: the building blocks several of them need.

Each block is plain ``torch.nn`` (no torchvision); weights are PyTorch's defaults, so a caller seeds
and calibrates (``bnfold_testutil.randomize_bn``, ``benchmarks/models.py:calibrate``).  The
benchmarks import this file with ``tests/`` on ``sys.path`` (``benchmarks/pte_latency.py``).
"""

from __future__ import annotations

import torch
import torch.nn as nn


class ConvBn(nn.Module):
    """conv (any kind) followed by a batch norm, optionally an activation."""

    def __init__(self, conv: nn.Module, bn: nn.Module, act: nn.Module | None = None):
        super().__init__()
        self.conv, self.bn, self.act = conv, bn, act or nn.Identity()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class SqueezeExcite(nn.Module):
    def __init__(self, c, squeeze):
        super().__init__()
        self.reduce = nn.Conv2d(c, squeeze, 1)
        self.expand = nn.Conv2d(squeeze, c, 1)

    def forward(self, x):
        s = x.mean(dim=(2, 3), keepdim=True)
        return x * torch.sigmoid(self.expand(nn.functional.silu(self.reduce(s))))


class MBConv(nn.Module):
    """An EfficientNet-style block: expand 1x1 -> depthwise 3x3 -> SiLU -> squeeze-excite
    -> project 1x1, each conv with its BatchNorm, plus the residual."""

    def __init__(self, c=16, expand=4, se_ratio=0.25):
        super().__init__()
        hidden = c * expand
        self.expand = nn.Conv2d(c, hidden, 1, bias=False)
        self.bn0 = nn.BatchNorm2d(hidden)
        self.dw = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False)
        self.bn1 = nn.BatchNorm2d(hidden)
        self.se = SqueezeExcite(hidden, max(1, int(c * se_ratio)))
        self.project = nn.Conv2d(hidden, c, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        y = nn.functional.silu(self.bn0(self.expand(x)))
        y = nn.functional.silu(self.bn1(self.dw(y)))
        y = self.se(y)
        return x + self.bn2(self.project(y))
