"""Models exported from PyTorch with their BatchNorms preserved.

In torch 2.13 the TorchScript exporter (``dynamo=False``) keeps every
BatchNormalization with ``training=TrainingMode.PRESERVE`` (or
``do_constant_folding=False``); its default eval export already fuses Conv+BN
itself but leaves ConvTranspose+BN and Gemm+BN.  The dynamo exporter keeps
them with ``optimize=False`` (its optimizer fuses them otherwise).
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
from onnx_testkit import check_fold, ops, ort_run, rel_err


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.bn_dw = nn.BatchNorm2d(8)
        self.up = nn.ConvTranspose2d(8, 6, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.bn_up = nn.BatchNorm2d(6)
        self.conv1d = nn.Conv1d(6, 4, 3)
        self.bn1d = nn.BatchNorm1d(4)
        self.fc = nn.Linear(4, 5)
        self.bn_fc = nn.BatchNorm1d(5)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        y = torch.relu(self.bn_dw(self.dw(y)))
        y = self.bn_up(self.up(y))  # [N, 6, 2H, 2W]
        y = y.flatten(2)  # [N, 6, 4HW]
        y = torch.relu(self.bn1d(self.conv1d(y)))
        return self.bn_fc(self.fc(y.mean(2)))


def _net(seed=0):
    torch.manual_seed(seed)
    net = Net()
    g = torch.Generator().manual_seed(seed)
    for m in net.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):  # distinct per-channel statistics
            c = m.num_features
            m.running_mean.copy_(torch.rand(c, generator=g) * 2 - 1)
            m.running_var.copy_(torch.rand(c, generator=g) * 1.5 + 0.5)
            m.weight.data.copy_(torch.rand(c, generator=g) * 4 - 2)
            m.bias.data.copy_(torch.rand(c, generator=g) * 2 - 1)
    return net.eval()


X = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))


def _export(net, **kw) -> onnx.ModelProto:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if kw.get("dynamo"):
            return torch.onnx.export(net, (X,), verbose=False, **kw).model_proto
        f = io.BytesIO()
        torch.onnx.export(net, (X,), f, dynamo=False, input_names=["x"], **kw)
        return onnx.load_from_string(f.getvalue())


def _check(model: onnx.ModelProto, net: nn.Module, n_bn: int):
    assert ops(model).count("BatchNormalization") == n_bn
    name = model.graph.input[0].name
    feeds = {name: X.numpy()}
    r = check_fold(model, feeds, folded=n_bn)
    with torch.no_grad():
        ref = net.double()(X.double())
    assert rel_err(ort_run(r.model, feeds)[0], ref) < 2e-5  # and the PyTorch module in float64
    return r


@pytest.mark.parametrize(
    "kw",
    [dict(training=torch.onnx.TrainingMode.PRESERVE), dict(do_constant_folding=False)],
    ids=["preserve", "no_constant_folding"],
)
def test_torchscript_export_keeping_bn(kw):
    net = _net()
    r = _check(_export(net, **kw), net, 5)
    assert {f.pattern for f in r.report.folded} == {
        "Conv+BatchNormalization",
        "ConvTranspose+BatchNormalization",
        "Gemm+BatchNormalization",
    }
    assert "Identity" not in ops(r.model)  # the exporter's aliases of shared constants went with the BNs


def test_torchscript_default_export_leaves_some_bn():
    net = _net(1)
    m = _export(net)
    assert 0 < ops(m).count("BatchNormalization") < 5  # the exporter fused Conv+BN itself
    _check(m, net, ops(m).count("BatchNormalization"))


def test_dynamo_export_without_optimizer():
    pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript (not in bnfold's extras)")
    net = _net(2)
    m = _export(net, dynamo=True, optimize=False)
    r = _check(m, net, 5)
    # the exporter's zero bias (Shape/Expand/CastLike of the weight) went; the weights kept their names
    assert r.report.extra_bytes == 0 and "conv.weight" in {t.name for t in r.model.graph.initializer}
    assert not {"Shape", "Expand", "CastLike"} & set(ops(r.model))
    assert [o.version for o in r.model.opset_import if o.domain == ""] == [
        o.version for o in m.opset_import if o.domain == ""
    ]
    np.testing.assert_equal([i.name for i in r.model.graph.input], [i.name for i in m.graph.input])


class ChannelSplit(nn.Module):
    """ShuffleNetV2's unit: split the channels, convolve one half, shuffle them; then uneven parts."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.branch = nn.Conv2d(4, 4, 1)
        self.bn_branch = nn.BatchNorm2d(4)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        a, b = y.chunk(2, dim=1)
        y = torch.cat([a, self.bn_branch(self.branch(b))], 1)
        n, c, h, w = y.shape
        y = y.view(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w)
        p, q = y.split([3, 5], dim=1)
        return p.mean(1, keepdim=True) * q


def test_dynamo_export_of_a_channel_split_folds_and_audits(tmp_path):
    """The dynamo exporter writes torch.split / chunk as SplitToSequence + SequenceAt: the fold keeps
    them, and the audit emulates them (a sequence is a list of tensors to its runner)."""
    pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript (not in bnfold's extras)")
    from bnfold.cli import main
    from bnfold.numerics.onnx_program import OnnxEmulator

    torch.manual_seed(0)
    net = ChannelSplit().eval()
    m = _export(net, dynamo=True, optimize=False)
    assert ops(m).count("SplitToSequence") == 2 and "SequenceAt" in ops(m)
    r = _check(m, net, 2)
    assert not [s for s in OnnxEmulator(r.model).not_emulated if "Sequence" in s[1]]
    path = tmp_path / "split.onnx"
    onnx.save(m, str(path))
    assert main(["audit", str(path), "--random", "1", "--json"]) == 0
