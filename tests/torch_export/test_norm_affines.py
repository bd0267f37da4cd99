"""Norm affines into every consumer (fan-out), the lowering of what cannot fold, computed weights.

Every model is checked on the graph (no LayerNorm affine, no BatchNorm left where it should be
gone) and against a float64 reference, in the default, decomposed and edge IRs.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bnfold.report import Code
from bnfold.torch_export import fold_program
from bnfold.torch_export.ops import node_key
from bnfold_testutil import export, randomize_bn, record_max, reference, relative_error

IRS = ["default", "decomposed", "edge"]
TOL = 1e-5


@pytest.fixture(autouse=True)
def _seeded():
    """Weights and inputs drawn from a fixed seed: the same numbers whatever ran before."""
    torch.manual_seed(0)


def _norm_nodes(ep, word: str) -> list:
    return [n for n in ep.graph.nodes if n.op == "call_function" and word in node_key(n)]


def _affine_args(node) -> list:
    """The weight/bias arguments a layer/group/rms norm node still has (None when stripped)."""
    key = node_key(node)
    if "group_norm" in key:
        slots = (1, 2) if "native" in key else (2, 3)
    elif "rms_norm" in key:
        slots = (2,)
    else:
        slots = (2, 3)
    return [node.args[i] for i in slots if i < len(node.args) and node.args[i] is not None]


def _random_affine(norm: nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(norm.weight.shape, generator=g) * 1.5 + 0.25)
        if getattr(norm, "bias", None) is not None:
            norm.bias.copy_(torch.rand(norm.bias.shape, generator=g) * 2 - 1)


def _check(model: nn.Module, inputs: tuple, ir: str, **kw):
    ep = export(model, inputs, ir)
    result = fold_program(ep, **kw)
    out = result.model.module()(*inputs)
    out = out[0] if isinstance(out, tuple) else out
    ref = reference(model, *inputs)
    ref = ref[0] if isinstance(ref, tuple) else ref
    err = relative_error(out, ref)
    record_max("norm affines / lowering: largest error / output magnitude", err)
    assert err < TOL, (err, result.report)
    return result


class VitBlock(nn.Module):
    """Pre-norm attention with separate q, k, v projections, then a pre-norm MLP."""

    def __init__(self, d: int = 16, bias: bool = True):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d, bias=bias), nn.LayerNorm(d, bias=bias)
        self.q, self.k, self.v = (nn.Linear(d, d, bias=bias) for _ in range(3))
        self.proj = nn.Linear(d, d, bias=bias)
        self.fc1, self.fc2 = nn.Linear(d, 2 * d, bias=bias), nn.Linear(2 * d, d, bias=bias)
        for i, norm in enumerate((self.norm1, self.norm2)):
            _random_affine(norm, i)

    def forward(self, x):
        h = self.norm1(x)
        att = torch.softmax(self.q(h) @ self.k(h).transpose(-2, -1) / 4.0, dim=-1)
        x = x + self.proj(att @ self.v(h))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("ir", IRS)
def test_vit_block_layer_norm_affines_fold_into_every_projection(ir, bias):
    model = VitBlock(bias=bias).eval()
    result = _check(model, (torch.randn(2, 5, 16),), ir)
    norms = _norm_nodes(result.model, "layer_norm")
    assert len(norms) == 2 and all(_affine_args(n) == [] for n in norms), result.report
    assert sorted(f.norm for f in result.report.folded) == ["norm1", "norm2"]
    (fan,) = [f for f in result.report.folded if f.norm == "norm1"]
    assert fan.into.count(",") == 2, fan  # q, k and v
    assert not result.report.skipped


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("ir", IRS)
def test_transformer_encoder_layer_norm_first(ir, bias):
    model = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, norm_first=True, batch_first=True, bias=bias).eval()
    for i, norm in enumerate((model.norm1, model.norm2)):
        _random_affine(norm, i + 3)
    result = _check(model, (torch.randn(2, 5, 16),), ir)
    norms = _norm_nodes(result.model, "layer_norm")
    assert norms and all(_affine_args(n) == [] for n in norms), result.report
    # (decomposed, the in-projection is a bmm: the bias the fold adds after it then merges with the
    # projection's own bias add, a second, affine-only entry)
    assert sorted(f.norm for f in result.report.folded if "layer_norm" in f.pattern) == ["norm1", "norm2"]


class GroupNormConvs(nn.Module):
    """A GroupNorm feeding two unpadded 1x1 convs (Inception-style branches)."""

    def __init__(self):
        super().__init__()
        self.gn = nn.GroupNorm(2, 8)
        self.a, self.b = nn.Conv2d(8, 4, 1), nn.Conv2d(8, 6, 1)
        _random_affine(self.gn, 7)

    def forward(self, x):
        h = self.gn(x)
        return torch.cat([self.a(h), self.b(h)], 1)


@pytest.mark.parametrize("ir", IRS)
def test_group_norm_affine_folds_into_both_branches(ir):
    result = _check(GroupNormConvs().eval(), (torch.randn(2, 8, 5, 5),), ir)
    (gn,) = _norm_nodes(result.model, "group_norm")
    assert _affine_args(gn) == [], result.report
    assert [f.norm for f in result.report.folded] == ["gn"]


class SpelledGroupNorm(nn.Module):
    """``F.group_norm`` without weight and bias, then the affine computed by hand (``bnfold.engine.spelled``)."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(8)
        self.w = nn.Parameter(torch.rand(8, 1, 1, generator=g) + 0.5)
        self.b = nn.Parameter(torch.randn(8, 1, 1, generator=g))
        self.conv = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.conv(F.group_norm(x, 2) * self.w + self.b)


@pytest.mark.parametrize("ir", IRS)
def test_group_norm_with_its_affine_spelled_out_is_reported_as_group_norm(ir):
    result = _check(SpelledGroupNorm().eval(), (torch.randn(2, 8, 5, 5),), ir)
    (f,) = result.report.folded
    assert (f.kind, f.rule) == ("group_norm", "input") and not result.report.skipped, result.report


class BnBranches(nn.Module):
    """A BatchNorm feeding two convs; ``padded`` makes the second one pad (a shift cannot fold into it)."""

    def __init__(self, padded: bool):
        super().__init__()
        self.bn = nn.BatchNorm2d(6)
        self.a = nn.Conv2d(6, 4, 1)
        self.b = nn.Conv2d(6, 4, 3, padding=1 if padded else 0)

    def forward(self, x):
        h = self.bn(x)  # both outputs kept whole: a sum would cancel and hide (or fake) an error
        return torch.cat([self.a(h).flatten(1), self.b(h).flatten(1)], 1)


@pytest.mark.parametrize("ir", IRS)
def test_batch_norm_feeding_two_convs_folds_into_both(ir):
    model = randomize_bn(BnBranches(padded=False)).eval()
    result = _check(model, (torch.randn(2, 6, 7, 7),), ir)
    assert _norm_nodes(result.model, "batch_norm") == [], result.report
    assert [f.norm for f in result.report.folded] == ["bn"] and not result.report.skipped


@pytest.mark.parametrize("ir", IRS)
def test_one_padded_consumer_stops_the_fan_out(ir):
    model = randomize_bn(BnBranches(padded=True)).eval()
    result = _check(model, (torch.randn(2, 6, 7, 7),), ir)
    assert len(_norm_nodes(result.model, "batch_norm")) == 1
    (skip,) = result.report.skipped
    assert skip.norm == "bn" and skip.code == Code.SHIFT_PADDING, skip


class LayerNormAndResidual(nn.Module):
    """A LayerNorm whose output feeds a linear and is also added back: the add cannot take it."""

    def __init__(self):
        super().__init__()
        self.ln, self.fc = nn.LayerNorm(8), nn.Linear(8, 8)
        _random_affine(self.ln, 11)

    def forward(self, x):
        h = self.ln(x)
        return h + self.fc(h)


@pytest.mark.parametrize("ir", IRS)
def test_a_user_that_is_not_a_layer_keeps_the_affine(ir):
    result = _check(LayerNormAndResidual().eval(), (torch.randn(3, 4, 8),), ir)
    (ln,) = _norm_nodes(result.model, "layer_norm")
    assert len(_affine_args(ln)) == 2 and not result.report.folded
    (skip,) = result.report.skipped
    assert skip.norm == "ln" and skip.code == Code.FANOUT_NOT_ALL_LAYERS, skip


class SharedLayerNorm(nn.Module):
    """One LayerNorm module used twice: before a linear (folds) and before a ReLU (stays)."""

    def __init__(self):
        super().__init__()
        self.ln, self.fc = nn.LayerNorm(8), nn.Linear(8, 8)
        _random_affine(self.ln, 13)

    def forward(self, x, y):
        return self.fc(self.ln(x)) + torch.relu(self.ln(y))


@pytest.mark.parametrize("ir", IRS)
def test_a_shared_norm_module_folds_only_where_it_can(ir):
    result = _check(SharedLayerNorm().eval(), (torch.randn(3, 8), torch.randn(3, 8)), ir)
    lns = _norm_nodes(result.model, "layer_norm")
    assert sorted(len(_affine_args(n)) for n in lns) == [0, 2], result.report
    assert len(result.report.folded) == 1 and len(result.report.skipped) == 1


class DenseBlock(nn.Module):
    """DenseNet-style pre-activation: BN -> ReLU -> conv, twice, with a concatenation."""

    def __init__(self):
        super().__init__()
        self.bn1, self.conv1 = nn.BatchNorm2d(4), nn.Conv2d(4, 4, 3, padding=1)
        self.bn2, self.conv2 = nn.BatchNorm2d(8), nn.Conv2d(8, 4, 1)

    def forward(self, x):
        y = torch.cat([x, self.conv1(torch.relu(self.bn1(x)))], 1)
        return self.conv2(torch.relu(self.bn2(y)))


@pytest.mark.parametrize("ir", IRS)
def test_lowering_rewrites_every_unfoldable_batch_norm(ir):
    model = randomize_bn(DenseBlock(), var=(1e-6, 2.0)).eval()
    x = torch.randn(2, 4, 6, 6)
    plain = fold_program(export(model, (x,), ir))
    assert len(plain.report.skipped) == 2 and not plain.report.lowered
    result = _check(model, (x,), ir, lower_unfoldable=True)
    assert _norm_nodes(result.model, "batch_norm") == [], result.report
    assert sorted(x.norm for x in result.report.lowered) == ["bn1", "bn2"] and not result.report.skipped
    assert all(x.code == Code.NO_LAYER for x in result.report.lowered)
    muls = [n for n in result.model.graph.nodes if n.op == "call_function" and "mul" in node_key(n)]
    assert len(muls) == 2


class ComputedWeight(nn.Module):
    """A conv whose weight is computed from a constant (``w.unsqueeze(2)``), then a BatchNorm."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3, 3) / 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(F.conv2d(x, self.w.unsqueeze(2)))


@pytest.mark.parametrize("ir", IRS)
def test_a_computed_weight_folds_into_a_new_constant(ir):
    result = _check(randomize_bn(ComputedWeight()).eval(), (torch.randn(2, 3, 5, 7),), ir)
    assert _norm_nodes(result.model, "batch_norm") == [] and len(result.report.folded) == 1, result.report
    assert "w" not in result.model.state_dict  # the source weight has no other user: it is replaced


@pytest.mark.parametrize(
    "only, folded", [("layer_norm", ["norm1", "norm2"]), ("batch_norm", []), ("linear,layer_norm", ["norm1", "norm2"])]
)
def test_only_names_normalization_kinds(only, folded):
    import bnfold

    model = VitBlock().eval()
    result = bnfold.fold(export(model, (torch.randn(2, 5, 16),), "default"), only=only)
    assert sorted(f.norm for f in result.report.folded) == folded
    if not folded:
        assert all(s.code == Code.NOT_REQUESTED for s in result.report.skipped), result.report
