"""Small models and export helpers for the numerics tests."""

import copy

import torch
from torch import nn


class Fn(nn.Module):
    """Wrap a function of the inputs as a module (for exporting hand-made graphs)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def export(module, *args, ir="default"):
    """Export ``module`` and bring it to ``ir``: default, decomposed (run_decompositions) or edge (ExecuTorch)."""
    ep = torch.export.export(module.eval(), args)
    if ir == "decomposed":
        return ep.run_decompositions()
    if ir == "edge":
        from executorch.exir import EdgeCompileConfig, to_edge

        return to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()
    return ep


def float64_forward(module, *args):
    """The eager module run in float64: an independent reference for the emulator's own."""
    m = copy.deepcopy(module).double().eval()
    with torch.no_grad():
        return m(*(a.double() for a in args))


def batch_norm_with(channels, mean, var, weight=None, bias=None, eps=1e-5):
    bn = nn.BatchNorm2d(channels, eps=eps).eval()
    with torch.no_grad():
        bn.running_mean.copy_(torch.as_tensor(mean, dtype=torch.float32))
        bn.running_var.copy_(torch.as_tensor(var, dtype=torch.float32))
        if weight is not None:
            bn.weight.copy_(torch.as_tensor(weight, dtype=torch.float32))
        if bias is not None:
            bn.bias.copy_(torch.as_tensor(bias, dtype=torch.float32))
    return bn


class SmallNet(nn.Module):
    """conv -> BN -> SiLU -> depthwise conv -> BN -> SiLU -> pool -> linear."""

    def __init__(self, c=8, classes=5):
        super().__init__()
        self.conv = nn.Conv2d(3, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.fc = nn.Linear(c, classes)

    def forward(self, x):
        x = nn.functional.silu(self.bn(self.conv(x)))
        x = nn.functional.silu(self.bn2(self.dw(x)))
        return self.fc(x.mean((2, 3)))


def small_net(seed=0):
    """A SmallNet whose BN statistics are the real statistics of its inputs (as after training)."""
    torch.manual_seed(seed)
    net = SmallNet()
    net.train()
    with torch.no_grad():
        for _ in range(20):
            net(torch.randn(16, 3, 8, 8))
    return net.eval()


class Mixed(nn.Module):
    """BatchNorms that fold (after a conv, after a linear, before a 1x1 conv) and ones that do not
    (on the input, after an add, after a conv whose output has a second user)."""

    def __init__(self):
        super().__init__()
        self.bn_in = nn.BatchNorm2d(3)
        self.conv1, self.bn1 = nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6)
        self.conv2, self.bn2 = nn.Conv2d(6, 6, 1), nn.BatchNorm2d(6)
        self.bn_add = nn.BatchNorm2d(6)
        self.bn_pre, self.conv3 = nn.BatchNorm2d(6), nn.Conv2d(6, 6, 1)
        self.fc, self.bn_fc = nn.Linear(6, 4), nn.BatchNorm1d(4)

    def forward(self, x):
        x = torch.relu(self.bn_in(x))
        a = torch.relu(self.bn1(self.conv1(x)))
        b = self.conv2(a)
        y = torch.relu(self.bn_add(self.bn2(b) + b + a))
        y = self.conv3(self.bn_pre(y))
        return self.bn_fc(self.fc(y.mean((2, 3))))


def mixed(seed=0):
    torch.manual_seed(seed)
    net = Mixed().train()
    with torch.no_grad():
        for _ in range(10):
            net(torch.randn(8, 3, 8, 8) + 2)
    return net.eval()
