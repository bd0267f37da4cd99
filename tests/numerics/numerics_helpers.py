"""Small models and export helpers for the numerics tests."""

import copy
import io

import torch
from torch import nn

from bnfold_testutil import require_executorch


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
        require_executorch()
        from executorch.exir import EdgeCompileConfig, to_edge

        return to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()
    return ep


def onnx_keeping_batch_norms(net, x):
    """``net`` exported by the TorchScript exporter (opset 17) with its BatchNormalization nodes kept (no
    constant folding, training mode preserved: an eval-mode net keeps inference-mode nodes)."""
    import onnx

    f = io.BytesIO()
    torch.onnx.export(
        net,
        (x,),
        f,
        dynamo=False,
        opset_version=17,
        do_constant_folding=False,
        training=torch.onnx.TrainingMode.PRESERVE,
        input_names=["x"],
    )
    return onnx.load_from_string(f.getvalue())


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


def calibrated(net, shape=(16, 3, 8, 8), rounds=20, shift=0.0):
    """``net`` in eval mode, its BN statistics those of ``rounds`` random batches of ``shape`` (plus ``shift``)."""
    net.train()
    with torch.no_grad():
        for _ in range(rounds):
            net(torch.randn(*shape) + shift)
    return net.eval()


def small_net(seed=0):
    """A SmallNet whose BN statistics are the real statistics of its inputs (as after training)."""
    torch.manual_seed(seed)
    return calibrated(SmallNet())


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


class ScaledByMatmul(nn.Module):
    """A conv scaled per channel by ``a @ b`` of two parameters: the fold folds the scale into the
    conv and removes the matmul, a layer-like node, with the rest of the constant subgraph."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.a = nn.Parameter(torch.rand(4, 2) + 1)
        self.b = nn.Parameter(torch.rand(2, 1) + 1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        s = (self.a @ self.b).reshape(1, -1, 1, 1)
        y = torch.relu(self.conv(x) * s)
        return self.fc(y.mean((2, 3)))


class NormChain(nn.Module):
    """conv -> bn1 -> bn2: both fold into the conv, which then computes bn2's output."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn1 = batch_norm_with(4, mean=[1.0, -2.0, 3.0, 0.5], var=[4.0, 1.0, 9.0, 2.0])
        self.bn2 = batch_norm_with(
            4, mean=[0.5, 0.0, -1.0, 2.0], var=[0.25, 1.0, 0.01, 4.0], weight=[3.0, 2.0, 1.0, 5.0]
        )

    def forward(self, x):
        return torch.relu(self.bn2(self.bn1(self.conv(x))))


class HopInChain(nn.Module):
    """conv1d -> unsqueeze -> BatchNorm2d -> squeeze: the fold keeps the unsqueeze, which then
    holds the normalized tensor (the conv itself holds it before the unsqueeze)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 4, 3, padding=1)
        self.bn = batch_norm_with(
            4, mean=[1.0, -2.0, 3.0, 0.5], var=[0.04, 1.0, 9.0, 0.01], weight=[3.0, 2.0, 1.0, 5.0]
        )

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x).unsqueeze(-1)).squeeze(-1))


class TokenLinearNorm(nn.Module):
    """LeViT's LinearNorm over transposed tokens: a bias-free linear, BatchNorm1d over the flattened
    tokens, reshape_as back.  The linear's output has a second user (reshape_as reads its shape);
    decomposed, the linear is a bmm with no bias argument, so the fold adds the bias after it."""

    def __init__(self):
        super().__init__()
        self.c, self.bn = nn.Linear(8, 12, bias=False), nn.BatchNorm1d(12)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-2, 2)
            self.bn.running_var.uniform_(0.1, 4)
            self.bn.weight.uniform_(0.5, 3)

    def forward(self, x):
        x = self.c(x.transpose(1, 2))
        return self.bn(x.flatten(0, 1)).reshape_as(x)
