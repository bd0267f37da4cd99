"""A per-channel affine through a pool or a mean along other axes (issue 21), in every IR and in ONNX:

* a pre-activation ResNet's stem (timm resnetv2): conv -> max-pool -> the first block's BN -> ReLU.
  The BN folds back into the stem conv through the max-pool while its scale is >= 0 on every
  channel (``max(x * s + t) = max(x) * s + t`` only then); a negative channel is a skip with
  ``negative_scale``;
* BN -> global mean -> linear, and conv -> adaptive average pool -> flatten -> BN1d: a mean commutes
  with any per-channel affine;
* a max-pool whose indices are read is no hop.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from reparam_models import calibrate
from reparam_onnx import onnx_export, run_onnx

import bnfold
from bnfold.report import Code
from bnfold_testutil import assert_matches, export, norm_nodes, reference

IRS = ["default", "decomposed", "edge", "onnx"]


class PreActStem(nn.Module):
    """conv 7x7/2 -> max-pool 3/2 -> [BN -> ReLU] -> two convs (a shortcut reads the pre-activated value)."""

    def __init__(self, negative: bool = False):
        super().__init__()
        self.negative = negative
        self.stem, self.pool = nn.Conv2d(3, 8, 7, 2, 3), nn.MaxPool2d(3, 2, 1)
        self.norm1 = nn.BatchNorm2d(8)
        self.conv1, self.down = nn.Conv2d(8, 16, 3, padding=1), nn.Conv2d(8, 16, 1)

    def forward(self, x):
        pre = torch.relu(self.norm1(self.pool(self.stem(x))))
        return torch.cat([self.conv1(pre), self.down(pre)], 1)  # no sum: nothing for a merge


MAXIMA = {
    "max_pool2d": lambda y: F.max_pool2d(y, 2),
    "max_pool2d_indices": lambda y: F.max_pool2d(y, 3, 2, 1, return_indices=True)[0],
    "adaptive_max_pool2d": lambda y: F.adaptive_max_pool2d(y, 2),
    "amax": lambda y: y.amax((2, 3), keepdim=True),
}


class ConvMaxBn(nn.Module):
    """``conv -> a maximum over other axes -> BN -> ReLU -> conv``, the maximum spelled ``pool``."""

    def __init__(self, pool: str, negative: bool = False):
        super().__init__()
        self.pool, self.negative = MAXIMA[pool], negative
        self.conv, self.norm1, self.out = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.out(torch.relu(self.norm1(self.pool(self.conv(x)))))


class GlobalMeans(nn.Module):
    """``head(post(relu(...)).mean((2, 3)))`` (into the head) and ``bn1d(flatten(avg_pool(conv(x))))``."""

    def __init__(self):
        super().__init__()
        self.conv, self.post, self.head = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Linear(8, 5)
        self.conv2, self.bn1d = nn.Conv2d(3, 6, 3), nn.BatchNorm1d(6)

    def forward(self, x):
        a = self.head(self.post(torch.relu(self.conv(x))).mean((2, 3)))
        b = self.bn1d(F.adaptive_avg_pool2d(self.conv2(x), 1).flatten(1))
        return torch.cat([a, b], 1)


class PoolIndicesRead(nn.Module):
    """A max-pool whose indices are an output: the BN after it cannot move before it."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)

    def forward(self, x):
        y, idx = F.max_pool2d(self.conv(x), 2, return_indices=True)
        return self.bn(y), idx


def _model(make, shape, seed=3):
    model = calibrate(make(), shape, seed=seed)
    if getattr(model, "negative", False):
        with torch.no_grad():
            model.norm1.weight[5] = -0.7  # one channel's scale < 0
    return model, torch.randn(shape, generator=torch.Generator().manual_seed(seed + 1))


def _fold(model, x, ir):
    """The report, the folded model's outputs and the normalizations left, in ``ir``."""
    if ir != "onnx":
        result = bnfold.fold(export(model, (x,), ir))
        with torch.no_grad():
            out = result.model.module()(x)
        return result.report, list(out) if isinstance(out, (tuple, list)) else [out], len(norm_nodes(result.model))
    result = bnfold.fold(onnx_export(model, x))
    left = sum(n.op_type == "BatchNormalization" for n in result.model.graph.node)
    return result.report, run_onnx(result.model, x), left


@pytest.mark.parametrize("ir", IRS)
def test_pre_activation_stem_bn_folds_through_the_max_pool(ir):
    model, x = _model(PreActStem, (2, 3, 32, 32))
    report, (out,), left = _fold(model, x, ir)
    assert len(report.folded) == 1 and not report.skipped and not report.merged and left == 0, report
    (f,) = report.folded
    assert f.side == "output" and [s.action for s in f.steps] == ["kept", "removed"], f  # the pool stays
    assert_matches(out, reference(model, x))


@pytest.mark.parametrize("ir", IRS)
def test_a_negative_scale_does_not_cross_the_max_pool(ir):
    model, x = _model(lambda: PreActStem(negative=True), (2, 3, 32, 32))
    report, (out,), left = _fold(model, x, ir)
    assert not report.folded and left == 1, report
    (s,) = report.skipped
    assert s.code == Code.NEGATIVE_SCALE and "1 of 8 channels" in s.reason, s
    assert_matches(out, reference(model, x))


@pytest.mark.parametrize("ir", IRS)
def test_a_mean_over_other_axes_carries_the_affine(ir):
    model, x = _model(GlobalMeans, (2, 3, 10, 10))
    report, (out,), left = _fold(model, x, ir)
    assert len(report.folded) == 2 and not report.skipped and left == 0, report
    assert sorted(f.side for f in report.folded) == ["input", "output"]  # post into the head; bn1d into conv2
    assert_matches(out, reference(model, x))


@pytest.mark.parametrize("ir", ["default", "decomposed", "edge"])
def test_a_max_pool_whose_indices_are_read_is_no_hop(ir):
    model, x = _model(PoolIndicesRead, (2, 3, 8, 8))
    report, outs, left = _fold(model, x, ir)
    assert not report.folded and left == 1 and [s.code for s in report.skipped] == [Code.NO_LAYER], report
    ref = reference(model, x)
    assert_matches(outs[0], ref[0])
    assert torch.equal(outs[1], ref[1])


@pytest.mark.parametrize("ir", IRS)
@pytest.mark.parametrize("pool", list(MAXIMA))
@pytest.mark.parametrize("negative", [False, True])
def test_every_spelling_of_a_maximum(pool, negative, ir):
    if (pool, ir) == ("adaptive_max_pool2d", "edge"):
        pytest.skip("to_edge refuses aten.adaptive_max_pool2d (not in the core ATen opset)")
    model, x = _model(lambda: ConvMaxBn(pool, negative), (2, 3, 12, 12))
    report, (out,), left = _fold(model, x, ir)
    if negative:
        assert not report.folded and [s.code for s in report.skipped] == [Code.NEGATIVE_SCALE], report
    else:
        assert len(report.folded) == 1 and not report.skipped and left == 0, report
    assert_matches(out, reference(model, x))
