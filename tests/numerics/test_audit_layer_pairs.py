"""Every folded layer's row is paired with its value in the folded program, in every format: a layer whose
BatchNorm feeds another conv folded into (that conv gains a bias, so its inputs change in number) is measured
in the folded run too (mobilenet_v3's SE-block project conv printed ``-`` in its measured loss)."""

import pytest
import torch
from numerics_helpers import calibrated, onnx_keeping_batch_norms
from torch import nn

import bnfold

onnx = pytest.importorskip("onnx")


class TwoConvs(nn.Module):
    """conv -> BN -> conv -> BN -> relu: the first BN's only reader is the second conv (no bias)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn_a = nn.BatchNorm2d(8)
        self.b = nn.Conv2d(8, 8, 1, bias=False)
        self.bn_b = nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn_b(self.b(self.bn_a(self.a(x)))))


def _net():
    torch.manual_seed(0)
    return calibrated(TwoConvs(), (8, 3, 8, 8), rounds=4, shift=1.0)


def _dynamo(net, x):
    return torch.onnx.export(net, (x,), dynamo=True, optimize=False, verbose=False).model_proto


@pytest.mark.parametrize("fmt", ["pt2", "onnx_torchscript", "onnx_dynamo"])
def test_a_layer_read_by_a_folded_conv_is_measured_folded(fmt):
    net, x = _net(), torch.randn(2, 3, 8, 8)
    model = {
        "pt2": lambda: torch.export.export(net, (x,)),
        "onnx_torchscript": lambda: onnx_keeping_batch_norms(net, x),
        "onnx_dynamo": lambda: _dynamo(net, x),
    }[fmt]()
    rep = bnfold.audit(model, [(x,)], local=True)
    assert len(rep.norms) == 2 and all(n.folded for n in rep.norms)
    first = rep.layers[0]
    assert first.norm is not None and first.folded is not None, first
    assert first.local_folded is not None
    assert all(n.risk.measured.loss_db is not None for n in rep.norms)
    folded = {e["node"] for e in rep.to_dict()["tensors"]["folded"]}
    assert first.folded.node in folded
