"""The dynamo export of a bias-less Conv3d (torchvision's video ResNets): onnxscript's torch_lib writes its zero
bias as ``[out_channels, 2]``, which ONNX Runtime refuses to run and no fold can use.  The zoo's export
(``reparam_onnx.onnx_export``) gives it a valid bias, so the BatchNorm after it folds; on the exporter's own
output bnfold names the bias shape as the reason."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from reparam_onnx import onnx_export, run_onnx

import bnfold
from bnfold.report import Code
from bnfold_testutil import assert_matches, reference


class Conv3dBn(nn.Module):
    """torchvision's video ResNet stem: Conv3d without a bias, BatchNorm3d, ReLU."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv3d(3, 8, (3, 7, 7), (1, 2, 2), (1, 3, 3), bias=False), nn.BatchNorm3d(8)
        g = torch.Generator().manual_seed(10)
        with torch.no_grad():
            self.bn.weight.copy_(torch.rand(8, generator=g) + 0.5)
            self.bn.bias.copy_(torch.randn(8, generator=g))
            self.bn.running_mean.copy_(torch.randn(8, generator=g))
            self.bn.running_var.copy_(torch.rand(8, generator=g) + 0.5)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def _model():
    return Conv3dBn().eval(), torch.randn(1, 3, 4, 16, 16, generator=torch.Generator().manual_seed(11))


def test_zoo_export_of_a_bias_less_conv3d_runs_and_its_batch_norm_folds():
    model, x = _model()
    exported = onnx_export(model, x)
    assert_matches(run_onnx(exported, x)[0], reference(model, x))
    result = bnfold.fold(exported)
    assert [f.kind for f in result.report.folded] == ["batch_norm"] and not result.report.skipped
    assert "BatchNormalization" not in [n.op_type for n in result.model.graph.node]
    assert_matches(run_onnx(result.model, x)[0], reference(model, x))


def test_exporter_bias_of_the_wrong_shape_is_the_reason():
    model, x = _model()
    exported = onnx_export(model, x, fix_conv3d=False)
    try:
        run_onnx(exported, x)
    except Exception as e:  # onnxruntime's own refusal
        assert "bias must be a 1D tensor" in str(e)
    else:
        pytest.skip("this onnxscript writes a valid Conv3d bias")
    (skipped,) = bnfold.fold(exported).report.skipped
    assert skipped.code == Code.LAYER_WEIGHTS
    assert "its bias has shape [8, 2], not [8]: ONNX requires a Conv bias of one value per output" in skipped.reason
