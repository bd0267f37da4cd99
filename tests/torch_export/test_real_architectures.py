"""Real-architecture patterns (LeViT, timm heads, EfficientDet, shared convs, bmm linears; see
``tests/fold_cases.py``) in every IR bnfold reads: the default export IR, the IR after
``run_decompositions()`` and the ExecuTorch edge IR, each with a static and a dynamic batch.

Every case folds exactly by hand (``test_by_hand_fold_is_exact``), so a case that does not fold
here is a gap of the fold engine."""

from __future__ import annotations

import pytest
import torch

import bnfold
from bnfold_testutil import assert_matches, reference
from fold_cases import BATCH, BY_NAME, CASES, OTHER_BATCH, REAL_CASES, summary, variants

pytest.importorskip("executorch.exir")

IRS = ["default", "decomposed", "edge"]
#: every real-architecture case, and the pre-activation BN that must stay with a reason
TORCH_CASES = REAL_CASES + [BY_NAME["preactivation_bn_relu_conv"]]


def op_nodes(program, word: str) -> list:
    """Every node whose op's schema name contains ``word`` (any IR, edge included)."""
    out = []
    for n in program.graph.nodes:
        schema = getattr(n.target, "_schema", None)
        if n.op == "call_function" and schema is not None and word in schema.name:
            out.append(n)
    return out


def batch_norm_nodes(program) -> list:
    return op_nodes(program, "batch_norm")


def _as_tuple(value) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _check_outputs(case, model, folded_program, batch: int) -> None:
    x = case.inputs(batch)
    with torch.no_grad():
        outs = _as_tuple(folded_program.module()(*x))
    refs = _as_tuple(reference(model, *x))
    assert len(outs) == len(refs)
    for out, ref in zip(outs, refs, strict=True):
        assert_matches(out, ref, rel=1e-5)


def _fold(case, ir: str, dynamic: bool):
    ep = case.program(ir, dynamic)
    before = ([n.name for n in ep.graph.nodes], {k: v.clone() for k, v in ep.state_dict.items()})
    result = bnfold.fold(ep)
    after = ([n.name for n in ep.graph.nodes], ep.state_dict)
    assert after[0] == before[0], "bnfold.fold modified the input program"
    assert all(torch.equal(after[1][k], v) for k, v in before[1].items()), "bnfold.fold modified the input weights"
    return ep, result


@pytest.mark.parametrize("case", [c for c in CASES if c.by_hand is not None], ids=str)
def test_by_hand_fold_is_exact(case):
    """The folded-by-hand function (no normalization left) equals the original in float64."""
    model = case.model()
    x = case.inputs()
    with torch.no_grad():
        hand = _as_tuple(case.by_hand(model.double())(*(t.double() for t in x)))
    refs = _as_tuple(reference(case.model(), *x))
    for h, ref in zip(hand, refs, strict=True):
        assert_matches(h, ref, rel=1e-12)


@pytest.mark.parametrize("ir", IRS)
@pytest.mark.parametrize("case, dynamic", variants(TORCH_CASES))
def test_real_architecture(case, dynamic, ir):
    model = case.model()
    ep, result = _fold(case, ir, dynamic)
    report, folded = result.report, result.model
    if case.affine_op:  # the op the checks below look for is spelled so in this IR
        assert op_nodes(ep, f"::{case.affine_op}")

    # the folded program computes the same function (at another batch too, when it is dynamic)
    for batch in (BATCH, OTHER_BATCH) if dynamic else (BATCH,):
        _check_outputs(case, model, folded, batch)
    # the report
    assert (len(report.folded), len(report.skipped)) == (case.folded, case.skipped), summary(case, report)
    for skip in report.skipped:
        assert case.reason_code is None or skip.code == case.reason_code, skip
    # the graph
    left = [n.name for n in batch_norm_nodes(folded)]
    assert len(left) == case.skipped, f"batch norms left in the folded graph: {left}"
    if case.affine_op:
        left = [n.name for n in op_nodes(folded, f"::{case.affine_op}")]
        assert not left, f"{case.affine_op} left in the folded graph: {left}"
    # names
    missing = [k for k in case.keys if k not in folded.state_dict]
    assert not missing, f"lost the original state_dict keys {missing}; has {sorted(folded.state_dict)}"


@pytest.mark.parametrize("ir", IRS)
def test_one_bias_free_conv_on_two_paths_folds_into_private_copies(ir):
    """``bn1(conv(x)) + bn2(conv(x2))`` with one bias-free conv: each path gets its own folded weight."""
    case = BY_NAME["shared_conv_two_bns"]
    model = case.model()
    _, result = _fold(case, ir, False)
    report = result.report
    assert sorted(f.norm for f in report.folded) == ["bn1", "bn2"], report
    assert len({f.into_node for f in report.folded}) == 2, report  # two conv nodes, one per path
    weight_bytes = model.conv.weight.numel() * model.conv.weight.element_size()
    assert report.extra_bytes >= weight_bytes, report.to_dict()  # one private copy of the weight at least
    weights = [k for k in result.model.state_dict if k.startswith("conv.weight")]
    assert len(weights) == 2 and "conv.weight" in weights, sorted(result.model.state_dict)
    # each path with its own BN: compare one path at a time (the other reads zeros)
    x, x2 = case.inputs()
    for args in ((x, torch.zeros_like(x2)), (torch.zeros_like(x), x2)):
        with torch.no_grad():
            out = result.model.module()(*args)
        assert_matches(out, reference(model, *args), rel=1e-5)


@pytest.mark.parametrize("ir", IRS)
def test_shared_head_keeps_the_original_names(ir):
    """EfficientDet head: one conv at three levels, a BN per level.  Every level gets a private copy;
    one of them keeps the original ``head.conv.weight`` / ``head.conv.bias`` names."""
    case = BY_NAME["efficientdet_shared_head"]
    _, result = _fold(case, ir, False)
    assert len(result.report.folded) == 3 and len({f.into_node for f in result.report.folded}) == 3, result.report
    keys = sorted(result.model.state_dict)
    assert "head.conv.weight" in keys and "head.conv.bias" in keys, keys
    assert len([k for k in keys if k.startswith("head.conv.weight")]) == 3, keys
    assert not any(k.startswith("head.bn.") for k in keys), keys
