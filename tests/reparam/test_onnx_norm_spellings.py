"""What the dynamo exporter writes for a normalization's affine (issue 30), folded like the torch IRs fold it:

* GroupNorm: ``Reshape -> InstanceNormalization (scale 1, bias 0) -> Reshape``, then ``* w + b`` with ``w``
  and ``b`` unsqueezed along ``Range(1, rank - 1)``; a GroupNorm without a bias (timm's
  ``GroupNorm1NoBias``) gets a zero bias ``Expand``-ed to ``Shape(x)[1:2]`` of the data;
* a frozen BatchNorm written as ``x * scale + bias`` (Hugging Face DETR's ``FrozenBatchNorm2d``), its scale
  ``w * (var + eps).rsqrt()`` exported as ``Reciprocal(Sqrt(...))``.

The constants are computed (``Range``, ``Reciprocal``, ``Shape`` of a value whose dims shape inference
knows) and the affine folds into the conv next to it; the computation goes with it.  The report names the
GroupNorm as the torch IRs do (``bnfold.engine.spelled``): a ``group_norm`` fold entry, or a skipped entry
when its affine stays, counted as in the default IR."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from reparam_onnx import onnx_export, run_onnx
from timm_models import timm

import bnfold
from bnfold.report import Code
from bnfold_testutil import assert_matches, export, reference


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
    (instance_norm,) = [n.name for n in result.model.graph.node if n.op_type == "InstanceNormalization"]
    assert [(f.kind, f.node) for f in result.report.folded] == [("group_norm", instance_norm)]
    assert _kinds(bnfold.fold(export(model, (x,))).report) == _kinds(result.report) and not result.report.skipped
    assert_matches(run_onnx(result.model, x)[0], reference(model, x))


def _kinds(report) -> tuple[list, list]:
    """The kinds of the report's fold entries and the codes of its skipped entries."""
    return [f.kind for f in report.folded], [s.code for s in report.skipped]


class PoolMixer(nn.Module):
    """PoolFormer's token mixer: the GroupNorm feeds ``pool(y) - y`` and no layer (its affine stays), or
    (``padded``) a 3x3 conv with padding, which its shift cannot cross exactly."""

    def __init__(self, norm, padded: bool = False):
        super().__init__()
        self.padded = padded
        self.c1, self.norm, self.c2 = nn.Conv2d(3, 8, 3, padding=1), norm(8), nn.Conv2d(8, 4, 3 if padded else 1)
        self.pool = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        if padded:
            self.c2.padding = (1, 1)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 2)
            if self.norm.bias is not None:
                self.norm.bias.uniform_(-1, 1)

    def forward(self, x):
        x = self.c1(x)
        y = self.norm(x)
        return self.c2(y if self.padded else x + self.pool(y) - y)


@pytest.mark.parametrize(("padded", "code"), [(False, Code.NO_LAYER), (True, Code.SHIFT_PADDING)])
@pytest.mark.parametrize("norm", ["group_norm_1", "timm_group_norm1"])
def test_dynamo_group_norm_whose_affine_stays_is_reported_as_skipped(norm, padded, code):
    """One skipped normalization, as in the default IR, not an affine chain nobody names (or a kept_ops note)."""
    model = PoolMixer(NORMS[norm], padded).eval()
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(7))
    result = bnfold.fold(onnx_export(model, x))
    (instance_norm,) = [n.name for n in result.model.graph.node if n.op_type == "InstanceNormalization"]
    (skipped,) = result.report.skipped
    assert (skipped.node, skipped.code, skipped.producer) == (instance_norm, code, "node_conv2d"), skipped
    assert not result.report.kept_ops and not result.report.folded
    assert _kinds(bnfold.fold(export(model, (x,))).report) == _kinds(result.report)
    assert_matches(run_onnx(result.model, x)[0], reference(model, x))


class BnThenGroupNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.bn, self.norm = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.GroupNorm(2, 8)
        self.c2 = nn.Conv2d(8, 4, 1)
        g = torch.Generator().manual_seed(8)
        with torch.no_grad():
            for p in (self.bn.weight, self.bn.running_var, self.norm.weight):
                p.copy_(torch.rand(8, generator=g) + 0.5)
            for p in (self.bn.bias, self.bn.running_mean, self.norm.bias):
                p.copy_(torch.randn(8, generator=g))

    def forward(self, x):
        return self.c2(self.norm(torch.relu(self.bn(self.c1(x)))))


@pytest.mark.parametrize(
    ("kw", "code"),
    [({"only": "batch_norm"}, Code.NOT_REQUESTED), ({"exclude": "*InstanceNormalization*"}, Code.EXCLUDED)],
)
def test_dynamo_group_norm_left_alone_keeps_its_affine(kw, code):
    """``only`` / ``exclude`` leave the GroupNorm where it is: its Mul and Add fold into no conv."""
    model = BnThenGroupNorm().eval()
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(9))
    result = bnfold.fold(onnx_export(model, x), **kw)
    ops = [n.op_type for n in result.model.graph.node]
    assert "BatchNormalization" not in ops and "Mul" in ops and "Add" in ops, ops
    assert _kinds(result.report) == (["batch_norm"], [code])
    if "only" in kw:
        assert _kinds(bnfold.fold(export(model, (x,)), **kw).report) == _kinds(result.report)
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


class SwinHead(nn.Module):
    """torchvision Swin's head: a channels-last LayerNorm, permute to NCHW, AdaptiveAvgPool2d(1), Flatten, Linear.
    The decomposed IR writes the flatten as a flat-order ``as_strided`` and the ONNX exporter that as a
    ``Gather`` of ``0 .. n-1`` from the flattened mean: both are reshapes."""

    def __init__(self, c: int = 12):
        super().__init__()
        self.norm, self.pool, self.flatten, self.head = (
            nn.LayerNorm(c),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(1),
            nn.Linear(c, 5),
        )
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.head(self.flatten(self.pool(self.norm(x).permute(0, 3, 1, 2))))


@pytest.mark.parametrize("ir", ["default", "decomposed", "edge", "onnx"])
def test_swin_head_layer_norm_folds_through_the_flat_order_view(ir):
    torch.manual_seed(0)
    model, x = SwinHead().eval(), torch.randn(1, 4, 4, 12)
    program = onnx_export(model, x) if ir == "onnx" else export(model, (x,), ir)
    if ir != "default":  # the spelling this test is about is there
        ops = [n.op_type for n in program.graph.node] if ir == "onnx" else [str(n.target) for n in program.graph.nodes]
        assert any("Gather" == o for o in ops) if ir == "onnx" else any("as_strided" in o for o in ops), ops
    result = bnfold.fold(program)
    assert [f.kind for f in result.report.folded] == ["layer_norm"] and not result.report.skipped, result.report
    out = run_onnx(result.model, x)[0] if ir == "onnx" else result.model.module()(x)
    assert_matches(out, reference(model, x))
