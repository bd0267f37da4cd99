"""What the dynamo exporter writes for a normalization's affine (issue 30), folded like the torch IRs fold it:

* GroupNorm: ``Reshape -> InstanceNormalization (scale 1, bias 0) -> Reshape``, then ``* w + b`` with ``w``
  and ``b`` unsqueezed along ``Range(1, rank - 1)``; a GroupNorm without a bias (timm's
  ``GroupNorm1NoBias``) gets a zero bias ``Expand``-ed to ``Shape(x)[1:2]`` of the data;
* a frozen BatchNorm written as ``x * scale + bias`` (Hugging Face DETR's ``FrozenBatchNorm2d``), its scale
  ``w * (var + eps).rsqrt()`` exported as ``Reciprocal(Sqrt(...))``.

The constants are computed (``Range``, ``Reciprocal``, ``Shape`` of a value whose dims shape inference
knows) and the affine folds into the conv next to it; the computation goes with it."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from reparam_onnx import onnx_export, run_onnx
from timm_models import timm

import bnfold
from bnfold_testutil import assert_matches, reference


def _timm_norm(name: str):
    def make(c: int) -> nn.Module:
        timm()
        from timm.layers import GroupNorm1
        from timm.models.metaformer import GroupNorm1NoBias

        return {"GroupNorm1": GroupNorm1, "GroupNorm1NoBias": GroupNorm1NoBias}[name](c)

    return make


NORMS = {
    "group_norm_1": lambda c: nn.GroupNorm(1, c),
    "group_norm_2": lambda c: nn.GroupNorm(2, c),
    "timm_group_norm1": _timm_norm("GroupNorm1"),  # MobileViTv2, PoolFormer
    "timm_group_norm1_no_bias": _timm_norm("GroupNorm1NoBias"),  # PoolFormerV2
}


class NormBetween(nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.c1, self.norm, self.c2 = nn.Conv2d(3, 8, 3, padding=1), norm(8), nn.Conv2d(8, 4, 1)
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            self.norm.weight.copy_(torch.rand(8, generator=g) * 1.5 + 0.5)
            if self.norm.bias is not None:
                self.norm.bias.copy_(torch.randn(8, generator=g))

    def forward(self, x):
        return self.c2(self.norm(self.c1(x)))


@pytest.mark.parametrize("norm", list(NORMS))
def test_dynamo_group_norm_affine_folds_into_the_next_conv(norm):
    model = NormBetween(NORMS[norm]).eval()
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(4))
    result = bnfold.fold(onnx_export(model, x))
    ops = [n.op_type for n in result.model.graph.node]
    assert ops.count("Conv") == 2 and "Mul" not in ops and "Add" not in ops, ops
    assert "Range" not in ops and "Unsqueeze" not in ops and "CastLike" not in ops[ops.index("InstanceNormalization") :]
    assert [f.pattern for f in result.report.folded] == ["Mul+Add+Conv"]  # no bias: an Add of zeros
    assert_matches(run_onnx(result.model, x)[0], reference(model, x))


class FrozenBatchNorm2d(nn.Module):
    """Hugging Face DETR's FrozenBatchNorm2d, its forward reproduced (transformers is not installed)."""

    def __init__(self, n: int):
        super().__init__()
        g = torch.Generator().manual_seed(5)
        self.register_buffer("weight", torch.rand(n, generator=g) + 0.5)
        self.register_buffer("bias", torch.randn(n, generator=g))
        self.register_buffer("running_mean", torch.randn(n, generator=g))
        self.register_buffer("running_var", torch.rand(n, generator=g) + 0.5)

    def forward(self, x):
        weight = self.weight.reshape(1, -1, 1, 1)
        bias = self.bias.reshape(1, -1, 1, 1)
        running_var = self.running_var.reshape(1, -1, 1, 1)
        running_mean = self.running_mean.reshape(1, -1, 1, 1)
        epsilon = 1e-5
        scale = weight * (running_var + epsilon).rsqrt()
        bias = bias - running_mean * scale
        return x * scale + bias


class ConvFrozenBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, bias=False), FrozenBatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def test_dynamo_frozen_batch_norm_folds_into_the_conv():
    model = ConvFrozenBN().eval()
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(6))
    result = bnfold.fold(onnx_export(model, x))
    assert [n.op_type for n in result.model.graph.node] == ["Conv", "Relu"], result.report
    assert [f.pattern for f in result.report.folded] == ["Conv+Mul+Add"]
    assert_matches(run_onnx(result.model, x)[0], reference(model, x))
