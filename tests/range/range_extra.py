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
