"""timm's own re-parameterizable classes (issue 30), exported without their ``reparameterize()``:
the merge on the graph equals timm's own merge node for node (convs, adds, BatchNorms, muls, divs) in
the default, decomposed and edge IR and in ONNX, exact against float64.

MobileOne's blocks without an identity still run ``out += identity_out`` with ``identity_out = 0``: an
in-place add of a constant, which the default IR keeps (``add_``).  RepViT's classifier averages two
linear heads of one feature, ``(head(x) + head_dist(x)) / 2``, which timm's ``fuse`` makes one linear.
Both are small instances of timm's classes (the blocks of ``mobileone_s0`` / ``repvit_m0_9``)."""

from __future__ import annotations

import copy
import dataclasses
import functools

import pytest
import torch
import torch.nn as nn
from reparam_onnx import onnx_export, run_onnx
from timm_models import calibrated, timm

import bnfold
from bnfold.torch_export.ops import op_name
from bnfold_testutil import assert_matches, export, reference

SHAPE = (1, 3, 32, 32)
IRS = ("default", "decomposed", "edge", "onnx")
KEYS = {
    "conv": ("conv", "Conv"),
    "sum": ("add", "sub", "Add", "Sub", "Gemm"),  # addmm and Gemm carry a linear's bias add
    "bn": ("batch_norm", "_native_batch_norm", "native_batch_norm", "BatchNormalization"),
    "mul": ("mul", "Mul"),
    "div": ("div", "Div"),
}


def _mobileone():
    from timm.models.byobnet import ByobNet, _mobileone_bcfg, model_cfgs

    blocks = _mobileone_bcfg(d=(1, 2, 1, 1), wf=(0.125, 0.125, 0.125, 0.25), num_conv_branches=4)
    return ByobNet(dataclasses.replace(model_cfgs["mobileone_s0"], blocks=blocks, stem_chs=8), num_classes=10)


def _repvit():
    return timm().create_model("repvit_m0_9", pretrained=False, embed_dim=(16, 32), depth=(1, 2), num_classes=10)


MODELS = {"mobileone_s0": _mobileone, "repvit_m0_9": _repvit}


@functools.cache
def _model(name: str):
    timm()
    torch.manual_seed(0)
    model = calibrated(MODELS[name](), (4, *SHAPE[1:]))
    own = timm().utils.reparameterize_model(copy.deepcopy(model))
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(1))
    return model, own, x, reference(model, x)


@functools.cache
def _default_exports(name: str):
    """The default exports of the model and of its own merge, made once: the other IRs start from a copy of them."""
    model, own, x, _ = _model(name)
    return export(model, (x,)), export(own, (x,))


def _counts(names) -> dict:
    return {key: sum(n.startswith(spellings) for n in names) for key, spellings in KEYS.items()}


def _fx_counts(ep) -> dict:
    return _counts([op_name(n.target) for n in ep.graph.nodes if n.op == "call_function"])


def _onnx_counts(model) -> dict:
    return _counts([n.op_type for n in model.graph.node])


@pytest.mark.parametrize("ir", IRS)
@pytest.mark.parametrize("name", list(MODELS))
def test_timm_class_merges_like_its_own_reparameterize(name, ir):
    model, own, x, ref = _model(name)
    if ir == "onnx":
        result = bnfold.fold(onnx_export(model, x))
        counts, expected = _onnx_counts(result.model), _onnx_counts(onnx_export(own, x))
        out = run_onnx(result.model, x)[0]
    else:
        base, own_base = _default_exports(name)
        result = bnfold.fold(export(model, (x,), ir, base=base))
        counts, expected = _fx_counts(result.model), _fx_counts(export(own, (x,), ir, base=own_base))
        with torch.no_grad():
            out = result.model.module()(x)
    assert expected["bn"] == 0 and expected["conv"] > 0, expected
    assert counts == expected, (counts, expected, result.report.kept_ops)
    assert not result.report.skipped and not result.report.kept_ops, result.report
    assert_matches(out, ref)


class InPlaceAffine(nn.Module):
    """``y = conv(x); y *= s; y += t`` (the default IR keeps ``mul_`` / ``add_``); with ``read_before``
    another op reads ``y`` before the mutation, which then must stay."""

    def __init__(self, read_before: bool):
        super().__init__()
        self.conv, self.read_before = nn.Conv2d(3, 4, 3, padding=1), read_before
        self.register_buffer("s", torch.tensor([0.5, -2.0, 1.5, 3.0]).reshape(1, 4, 1, 1))

    def forward(self, x):
        y = self.conv(x)
        z = torch.relu(y) if self.read_before else None
        y *= self.s
        y += 0.25
        return y if z is None else y + z


@pytest.mark.parametrize("read_before", [False, True])
def test_inplace_affine_folds_where_nothing_else_reads_what_it_mutates(read_before):
    model = InPlaceAffine(read_before).eval()
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(2))
    ep = export(model, (x,))
    assert any(op_name(n.target) == "mul_" for n in ep.graph.nodes if n.op == "call_function")
    result = bnfold.fold(ep)
    counts = _fx_counts(result.model)
    assert counts["mul"] == (1 if read_before else 0) and counts["sum"] == (2 if read_before else 0), counts
    with torch.no_grad():
        assert_matches(result.model.module()(x), reference(model, x))


class TwoNormHeads(nn.Module):
    """LeViT's classifier: ``(head(x) + head_dist(x)) / 2`` with each head timm's NormLinear (BatchNorm1d,
    Dropout, Linear) on one pooled feature; each head's eval dropout is its own identity node."""

    def __init__(self, dropout: bool):
        super().__init__()
        self.heads = nn.ModuleList(
            nn.Sequential(nn.BatchNorm1d(8), nn.Dropout(0.0) if dropout else nn.Identity(), nn.Linear(8, 5))
            for _ in range(2)
        )

    def forward(self, x):
        return (self.heads[0](x) + self.heads[1](x)) / 2


@pytest.mark.parametrize("ir", ("default", "decomposed", "onnx"))
@pytest.mark.parametrize("dropout", [False, True])
def test_two_norm_linear_heads_of_one_feature_merge_into_one_linear(dropout, ir):
    torch.manual_seed(3)
    model = calibrated(TwoNormHeads(dropout), (16, 8))
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(4))
    if ir == "onnx":
        result = bnfold.fold(onnx_export(model, x))
        counts, out = _onnx_counts(result.model), run_onnx(result.model, x)[0]
        layers = sum(n.op_type in ("Gemm", "MatMul") for n in result.model.graph.node)
    else:
        result = bnfold.fold(export(model, (x,), ir))
        names = [op_name(n.target) for n in result.model.graph.nodes if n.op == "call_function"]
        counts, layers = _counts(names), sum(n in ("linear", "addmm", "mm") for n in names)
        with torch.no_grad():
            out = result.model.module()(x)
    assert layers == 1 and counts["bn"] == counts["div"] == 0 and len(result.report.merged) == 1, counts
    assert not result.report.kept_ops, result.report.kept_ops
    assert_matches(out, reference(model, x))


def test_timm_levit_heads_merge_like_its_own_merge_folded():
    """timm's LeViT-128S in the default IR: as many adds as its own ``reparameterize_model`` folded."""
    timm()
    torch.manual_seed(0)
    model = calibrated(timm().create_model("levit_128s", pretrained=False, num_classes=10), (2, 3, 224, 224))
    own = timm().utils.reparameterize_model(copy.deepcopy(model))
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    counts = _fx_counts(bnfold.fold(export(model, (x,))).model)
    expected = _fx_counts(bnfold.fold(export(own, (x,))).model)
    assert counts == expected, (counts, expected)
