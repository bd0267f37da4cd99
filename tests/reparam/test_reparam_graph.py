"""Structural re-parameterization on the graph (issue 21): each over-parameterized block becomes the
convs of its own merge, exact against float64, in the default, decomposed and edge IR and in ONNX."""

from __future__ import annotations

import functools

import pytest
import torch
from reparam_models import (
    ACNet,
    ActivationInBranch,
    AvgBranch,
    BranchTwice,
    DifferentDilations,
    DifferentGroups,
    DifferentInputs,
    DifferentStrides,
    InPlaceIntoInput,
    InPlaceSums,
    Misaligned,
    MobileOne,
    RepMixer,
    RepVGG,
    RepViTGhost,
    SamePadding,
    SharedBranch,
    StemThenRepVGG,
    calibrate,
)
from reparam_onnx import onnx_export, run_onnx

import bnfold
from bnfold.report import Code
from bnfold.torch_export.ops import op_name
from bnfold_testutil import assert_matches, export, reference

SHAPE = (2, 4, 8, 8)

#: name -> (block, convs after the merge, merges)
CASES = {
    "repvgg": (lambda: RepVGG(), 1, 1),
    "repvgg_no_identity": (lambda: RepVGG(identity=False), 1, 1),
    "repvgg_stride2": (lambda: RepVGG(cout=6, stride=2), 1, 1),
    "repvgg_groups2": (lambda: RepVGG(groups=2), 1, 1),
    "repvgg_depthwise": (lambda: RepVGG(groups=4), 1, 1),
    "repvgg_depthwise_stride2": (lambda: RepVGG(groups=4, stride=2), 1, 1),
    "mobileone": (lambda: MobileOne(), 2, 2),
    "repvit_repghost": (lambda: RepViTGhost(), 2, 2),
    "fastvit_repmixer": (lambda: RepMixer(), 1, 1),
    "acnet": (lambda: ACNet(), 1, 1),
    "avg_pool_branch": (lambda: AvgBranch(), 1, 1),
    "stem_then_repvgg": (lambda: StemThenRepVGG(), 2, 1),
    "same_padding": (lambda: SamePadding(), 1, 1),
    "inplace_sums": (lambda: InPlaceSums(), 3, 3),
    "branch_summed_twice": (lambda: BranchTwice(), 1, 1),
}
IRS = ("default", "decomposed", "edge", "onnx")


@functools.cache
def _model(name: str):
    block = calibrate(CASES[name][0](), SHAPE, seed=len(name))
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(7))
    return block, x, reference(block, x)


@functools.cache
def _default(name: str):
    """The default export, made once: the decomposed and edge IR start from a copy of it."""
    block, x, _ = _model(name)
    return export(block, (x,))


def _fx_counts(ep) -> dict:
    names = [op_name(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    count = lambda *keys: sum(any(t.startswith(k) for k in keys) for t in names)  # noqa: E731
    return {
        "conv": count("conv"),
        "sum": count("add", "sub"),
        "bn": count("batch_norm", "_native_batch_norm", "native_batch_norm"),
        "pool": count("avg_pool"),
        "mul": count("mul"),
    }


def _onnx_counts(model) -> dict:
    ops = [n.op_type for n in model.graph.node]
    return {
        "conv": ops.count("Conv"),
        "sum": ops.count("Add") + ops.count("Sub"),
        "bn": ops.count("BatchNormalization"),
        "pool": ops.count("AveragePool"),
        "mul": ops.count("Mul"),
    }


def _fold(name: str, ir: str):
    block, x, ref = _model(name)
    if ir == "onnx":
        result = bnfold.fold(onnx_export(block, x))
        return result, _onnx_counts(result.model), run_onnx(result.model, x)[0], ref
    ep = _default(name) if ir == "default" else export(block, (x,), ir, base=_default(name))
    result = bnfold.fold(ep)
    with torch.no_grad():
        out = result.model.module()(x)
    return result, _fx_counts(result.model), out, ref


@pytest.mark.parametrize("ir", IRS)
@pytest.mark.parametrize("name", list(CASES))
def test_block_merges_into_its_own_convs(name, ir):
    result, counts, out, ref = _fold(name, ir)
    convs, merges = CASES[name][1:]
    assert counts == {"conv": convs, "sum": 0, "bn": 0, "pool": 0, "mul": 0}, (counts, result.report)
    assert len(result.report.merged) == merges, result.report
    assert not result.report.skipped, result.report
    assert_matches(out, ref)
    entry = result.report.to_dict()["merged"][0]
    assert entry["into"] and len(entry["branches"]) >= 2 and "+" in entry["pattern"]


REFUSED = {
    "activation": (ActivationInBranch, Code.MERGE_ACTIVATION),
    "shared_branch": (SharedBranch, Code.MERGE_SHARED),
    "different_inputs": (DifferentInputs, Code.MERGE_INPUTS),
    "different_strides": (DifferentStrides, Code.MERGE_GEOMETRY),
    "different_groups": (DifferentGroups, Code.MERGE_GEOMETRY),
    "different_dilations": (DifferentDilations, Code.MERGE_GEOMETRY),
    "misaligned_padding": (Misaligned, Code.MERGE_PADDING),
    "pool_without_pad_count": (lambda: AvgBranch(count_include_pad=False), Code.MERGE_POOL),
}


def _refusals(report) -> list[Code]:
    """The codes of the sums left unmerged: notes on their adds, never skipped normalizations."""
    return [k.code for k in report.kept_ops if k.code.name.startswith("MERGE_")]


@pytest.mark.parametrize("ir", ["default", "onnx"])
@pytest.mark.parametrize("name", list(REFUSED))
def test_refused_merges_keep_the_branches_and_say_why(name, ir):
    make, code = REFUSED[name]
    block = calibrate(make(), SHAPE, seed=3)
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(7))
    ref = reference(block, x)
    if ir == "onnx":
        result = bnfold.fold(onnx_export(block, x))
        outs = run_onnx(result.model, x)[:1]
    else:
        result = bnfold.fold(export(block, (x,)))
        with torch.no_grad():
            outs = result.model.module()(x)
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    refs = ref if isinstance(ref, (list, tuple)) else [ref]
    assert not result.report.merged, result.report
    assert _refusals(result.report) == [code], result.report
    assert not [s for s in result.report.skipped if s.code.name.startswith("MERGE_")], result.report
    assert_matches(outs[0], refs[0])


@pytest.mark.parametrize("ir", ["default", "decomposed", "edge"])
def test_inplace_add_into_the_branch_input_is_refused_until_functional(ir):
    """``x += conv_bn(x)``: the default IR's ``add_`` mutates a value its branch reads, and is kept with
    the reason; the decomposed and edge IR spell it ``add``, which merges.  Exact in all three."""
    block = calibrate(InPlaceIntoInput(), SHAPE, seed=5)
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(7))
    ref = reference(block, x)
    result = bnfold.fold(export(block, (x,), ir))
    counts = _fx_counts(result.model)
    if ir == "default":
        assert not result.report.merged, result.report
        assert _refusals(result.report) == [Code.MERGE_SHARED], result.report
        assert "adds in place into" in result.report.kept_ops[0].reason, result.report
        assert counts == {"conv": 1, "sum": 1, "bn": 0, "pool": 0, "mul": 0}, counts
    else:
        assert len(result.report.merged) == 1, result.report
        assert counts == {"conv": 1, "sum": 0, "bn": 0, "pool": 0, "mul": 0}, counts
    with torch.no_grad():
        assert_matches(result.model.module()(x), ref)


def test_exclude_and_only_keep_the_branches():
    block, x, ref = _model("repvgg")
    ep = _default("repvgg")
    for kw in (dict(exclude=["one.*"]), dict(exclude=["dense.*"]), dict(only=["linear"])):
        result = bnfold.fold(ep, **kw)
        assert not result.report.merged, (kw, result.report)
        assert _fx_counts(result.model)["conv"] == 2, kw
        with torch.no_grad():
            assert_matches(result.model.module()(x), ref)
    assert bnfold.fold(ep, only=["conv"]).report.merged


def test_executorch_pass_merges_in_place():
    pytest.importorskip("executorch.exir")
    from executorch.exir import to_edge

    from bnfold.executorch import FoldBatchNormPass

    block, x, ref = _model("mobileone")
    fold = FoldBatchNormPass()
    edge = to_edge(_default("mobileone")).transform([fold])
    assert len(fold.report.merged) == 2, fold.report
    counts = _fx_counts(edge.exported_program())
    assert counts == {"conv": 2, "sum": 0, "bn": 0, "pool": 0, "mul": 0}, counts
    with torch.no_grad():
        assert_matches(edge.exported_program().module()(x), ref)
