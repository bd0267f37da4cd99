"""Models and pipeline helpers shared by the ExecuTorch tests (the blocks themselves live in ``tests/zoo.py``)."""

from __future__ import annotations

import torch
import torch.nn as nn

from bnfold_testutil import randomize_bn
from zoo import ConvBn, MBConv  # noqa: F401  (re-exported: the ExecuTorch tests import them from here)


class LinearBn(nn.Module):
    def __init__(self, i=24, o=16):
        super().__init__()
        self.fc = nn.Linear(i, o)
        self.bn = nn.BatchNorm1d(o)

    def forward(self, x):
        return torch.relu(self.bn(self.fc(x)))


class BnMeanLinear(nn.Module):
    """conv -> BN -> ReLU, then a BN whose global mean feeds a linear head (it folds into the head)."""

    def __init__(self, c=16, classes=10):
        super().__init__()
        self.conv, self.bn, self.post = nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.BatchNorm2d(c)
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        return self.head(self.post(torch.relu(self.bn(self.conv(x)))).mean((2, 3)))


class ConvBnHardtanhMean(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.act = nn.Hardtanh(-2.0, 2.0)

    def forward(self, x):
        return self.act(self.bn(self.conv(x))).mean(dim=(2, 3))


class SharedBnResidual(nn.Module):
    """A residual block that applies one BatchNorm module after two convs."""

    def __init__(self, c=8):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv1(x)))
        return x + self.bn(self.conv2(y))


def prepared(module: nn.Module, seed: int = 0) -> nn.Module:
    """``module`` in eval mode with seeded weights and distinct per-channel BN statistics."""
    module.eval()
    randomize_bn(module, seed=seed)
    return module


def build(name: str, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A named test model (eval, random BN statistics) and an example input."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    models = {
        "conv1d": lambda: (ConvBn(nn.Conv1d(4, 8, 5, padding=2), nn.BatchNorm1d(8), nn.ReLU()), (2, 4, 32)),
        "conv2d_depthwise": lambda: (
            ConvBn(nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False), nn.BatchNorm2d(16), nn.ReLU6()),
            (1, 16, 20, 20),
        ),
        "conv3d": lambda: (ConvBn(nn.Conv3d(3, 8, 3, padding=1), nn.BatchNorm3d(8)), (1, 3, 6, 8, 8)),
        "conv_transpose2d_grouped": lambda: (
            ConvBn(nn.ConvTranspose2d(4, 8, 3, stride=2, groups=2), nn.BatchNorm2d(8)),
            (1, 4, 7, 7),
        ),
        "linear_bn1d": lambda: (LinearBn(24, 16), (5, 24)),
        "mbconv": lambda: (MBConv(16), (1, 16, 16, 16)),
        # The QNN set
        "dw_conv1d_2048_k15_bias": lambda: (
            ConvBn(nn.Conv1d(2048, 2048, 15, padding=7, groups=2048), nn.BatchNorm1d(2048)),
            (1, 2048, 24),
        ),
        "dw_conv1d_2048_k15_nobias": lambda: (
            ConvBn(nn.Conv1d(2048, 2048, 15, padding=7, groups=2048, bias=False), nn.BatchNorm1d(2048)),
            (1, 2048, 24),
        ),
        "conv2d_bn_hardtanh_mean": lambda: (ConvBnHardtanhMean(), (1, 3, 12, 12)),
        "conv_transpose2d_8_8": lambda: (
            ConvBn(nn.ConvTranspose2d(8, 8, 3, bias=False), nn.BatchNorm2d(8)),
            (1, 8, 6, 6),
        ),
        "conv_transpose2d_4_8_g2": lambda: (
            ConvBn(nn.ConvTranspose2d(4, 8, 3, groups=2), nn.BatchNorm2d(8)),
            (1, 4, 6, 6),
        ),
        "conv_transpose1d_dilated": lambda: (
            ConvBn(nn.ConvTranspose1d(4, 6, 3, dilation=2, groups=2), nn.BatchNorm1d(6)),
            (1, 4, 10),
        ),
        "shared_bn_residual": lambda: (SharedBnResidual(8), (1, 8, 10, 10)),
        "bn_mean_linear": lambda: (BnMeanLinear(), (2, 3, 12, 12)),
    }
    module, shape = models[name]()
    return prepared(module, seed), (torch.randn(*shape, generator=g),)


def count_delegates(ep) -> int:
    return sum(1 for n in ep.graph.nodes if n.op == "call_function" and "executorch_call_delegate" in str(n.target))


def run_pte(buffer: bytes, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Run a serialized program with the ExecuTorch python runtime."""
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(buffer).load_method("forward")
    (out,) = method.execute(list(inputs))
    return out
