"""A model beside ``tests/range_models.py`` for the range tests: a value whose producer takes no scale."""

from __future__ import annotations

import torch


class SiluSum(torch.nn.Module):
    """``sum(silu(conv(x))) * (1/HW)``: the sum passes 65504 / 16, and SiLU, not homogeneous, takes no scale: a
    multiply goes after it (the report counts it), and the next layer takes the inverse."""

    shapes = ((2, 3, 32, 32),)

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Conv2d(8, 8, 1)
        self.head = torch.nn.Linear(8, 10)
        with torch.no_grad():
            self.conv.bias.fill_(20.0)

    def forward(self, x):
        y = torch.nn.functional.silu(self.conv(x))
        s = y.sum(dim=(2, 3), keepdim=True) * (1.0 / (y.shape[2] * y.shape[3]))
        return self.head((y * self.fc(s).sigmoid()).mean(dim=(2, 3)))


class HotChain(torch.nn.Module):
    """``blocks`` blocks of a 1x1 conv (an orthogonal weight: magnitudes kept) and a BatchNorm whose scale is 2^13
    on every second block and 2^-13 on the next: after the fold every second conv's output passes 65504 / 16 and
    the next conv brings it back, ``blocks / 2`` values to rewrite (more than one per block's worth of work)."""

    def __init__(self, blocks: int, channels: int = 4):
        super().__init__()
        torch.manual_seed(blocks)
        self.shapes = ((2, channels, 4, 4),)
        layers = []
        for i in range(blocks):
            conv = torch.nn.Conv2d(channels, channels, 1, bias=False)
            norm = torch.nn.BatchNorm2d(channels)
            with torch.no_grad():
                conv.weight.copy_(torch.linalg.qr(torch.randn(channels, channels))[0].reshape(conv.weight.shape))
                norm.weight.fill_(2.0**13 if i % 2 == 0 else 2.0**-13)
                norm.bias.uniform_(-0.1, 0.1)
            layers += [conv, norm]
        self.body = torch.nn.Sequential(*layers)

    def forward(self, x):
        return self.body(x)
