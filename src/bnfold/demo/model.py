"""The demo network: a small EfficientNet-style classifier for 8x8 handwritten digits.

A stem conv, four MBConv blocks (1x1 expand, depthwise 3x3, squeeze-excite,
1x1 project; residual when shapes allow) and a 1x1 head conv, each conv
followed by a BatchNorm; SiLU activations; global average pool and a linear
classifier.
"""

from __future__ import annotations

import torch
from torch import nn

#: (in, out, expand ratio, stride) of each MBConv block
BLOCKS = ((16, 16, 1, 1), (16, 24, 4, 2), (24, 24, 4, 1), (24, 32, 4, 2))
STEM, HEAD, CLASSES = 16, 64, 10


def conv_bn(cin: int, cout: int, k: int = 1, stride: int = 1, groups: int = 1, act: bool = True) -> nn.Sequential:
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    if act:
        layers.append(nn.SiLU())
    return nn.Sequential(*layers)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, reduced: int):
        super().__init__()
        self.reduce = nn.Conv2d(channels, reduced, 1)
        self.expand = nn.Conv2d(reduced, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean((2, 3), keepdim=True)
        return x * torch.sigmoid(self.expand(nn.functional.silu(self.reduce(s))))


class MBConv(nn.Module):
    def __init__(self, cin: int, cout: int, expand: int, stride: int):
        super().__init__()
        mid = cin * expand
        self.expand = conv_bn(cin, mid) if expand != 1 else nn.Identity()
        self.depthwise = conv_bn(mid, mid, 3, stride, groups=mid)
        self.se = SqueezeExcite(mid, max(1, cin // 4))
        self.project = conv_bn(mid, cout, act=False)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.project(self.se(self.depthwise(self.expand(x))))
        return x + y if self.residual else y


class DigitNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = conv_bn(1, STEM, 3)
        self.blocks = nn.Sequential(*(MBConv(*b) for b in BLOCKS))
        self.head = conv_bn(BLOCKS[-1][1], HEAD)
        self.classifier = nn.Linear(HEAD, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head(self.blocks(self.stem(x)))
        return self.classifier(x.mean((2, 3)))
