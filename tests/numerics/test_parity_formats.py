"""One model, two formats, one audit: the ``.pt2`` and the ``.onnx`` of a net audit alike under every profile.

The net (conv + BN, depthwise conv + BN, linear; ReLU between) is exported as a torch program and,
with the TorchScript exporter keeping its BatchNorms, as ONNX.  Both graphs compute the same ops on
the same values, so a profile (a set of rounding rules for a runtime) must give both the same rows
and the same errors, unfolded and folded.  The tolerance is fp16 noise: one fp16 rounding of a
value adds a relative error of RMS ``u / sqrt(3)`` (``u = 2^-11``), a noise power of ``u^2 / 3`` of
the signal; the two formats' noise powers of a row may differ by less than that (where the graphs
spell an op differently, ``aten.mean`` / ``ReduceMean``, ``linear`` / ``Gemm``, the float32 result
may differ in its last bits and flip an fp16 rounding here and there, never round a whole tensor
once more).  A runtime setting applied to one format only (``ort-cpu``'s fp16 Conv+BN fusion) rounds
every weight once more and shows, and so does its fp16 Flatten.
"""

import math

import pytest
import torch
from numerics_helpers import onnx_keeping_batch_norms
from torch import nn

import bnfold
from bnfold.numerics import PROFILE_NAMES

onnx = pytest.importorskip("onnx")

U16 = 2.0**-11  # fp16's unit roundoff


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.dw, self.bn2 = nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        x = torch.relu(self.bn2(self.dw(x)))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))  # ResNet's head: a Flatten


def _net():
    torch.manual_seed(0)
    net = Net().train()
    with torch.no_grad():
        for _ in range(10):
            net(torch.randn(16, 3, 8, 8) + 1)
        net.dw.bias.add_(3.0)  # a real kappa (the unfolded program loses precision in bn2), the same output
        net.bn2.running_mean.add_(3.0)
    return net.eval()


def _onnx(net, x):
    model = onnx_keeping_batch_norms(net, x)
    assert [n.op_type for n in model.graph.node].count("BatchNormalization") == 2
    return model


@pytest.fixture(scope="module")
def formats():
    net = _net()
    torch.manual_seed(1)
    batches = [(torch.randn(8, 3, 8, 8) + 1,) for _ in range(2)]
    return torch.export.export(net, batches[0]), _onnx(net, batches[0][0]), batches


def _close(a, b, what: str) -> None:
    """``a`` and ``b`` (one row's error in each format) differ by less than one rounding's noise power."""
    assert (a is None) == (b is None), what
    if a is None:
        return
    assert a.count == b.count and a.nonfinite == b.nonfinite == 0, what
    assert math.isclose(a.signal, b.signal, rel_tol=1e-6), what
    pa, pb, tol = a.noise / a.signal, b.noise / b.signal, U16 * U16 / 3
    assert abs(pa - pb) <= tol, f"{what}: relative noise power {pa:.3g} (.pt2) vs {pb:.3g} (.onnx), allowed {tol:.2g}"


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_pt2_and_onnx_audit_alike(formats, profile):
    ep, model, batches = formats
    a = bnfold.audit(ep, batches, profile=profile)
    b = bnfold.audit(model, batches, profile=profile)
    # the same rows: layers of the same kinds, measuring through the same norms, in the same order
    assert [(r.kind, len(r.norms)) for r in a.layers] == [(r.kind, len(r.norms)) for r in b.layers]
    assert [r.kind for r in a.layers] == ["conv", "conv", "linear"]
    assert len(a.norms) == len(b.norms) == 2
    assert [n.folded for n in a.norms] == [n.folded for n in b.norms] == [True, True]
    assert [n.verdict for n in a.norms] == [n.verdict for n in b.norms]
    for i, (ra, rb) in enumerate(zip(a.layers, b.layers)):
        for key in ("unfolded", "folded", "local_unfolded", "local_folded"):
            _close(getattr(ra, key), getattr(rb, key), f"{profile} layer {i} {key}")
    _close(a.unfolded.output, b.unfolded.output, f"{profile} output unfolded")
    _close(a.folded.output, b.folded.output, f"{profile} output folded")
