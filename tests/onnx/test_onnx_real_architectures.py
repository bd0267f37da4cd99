"""The real-architecture cases of ``tests/fold_cases.py`` exported to ONNX with their BatchNorms kept
(the dynamo exporter with ``optimize=False``, and the TorchScript exporter with
``training=TrainingMode.PRESERVE``), static and with a dynamic batch, folded with ``bnfold.fold``.

The folded model must be valid, hold no BatchNormalization where the case folds fully, report the
expected folds and skips, and compute in ONNX Runtime what the PyTorch module computes in float64.
Every case folds exactly by hand (``torch_export/test_real_architectures.py::test_by_hand_fold_is_exact``),
so a case that does not fold here is a gap of the fold engine."""

from __future__ import annotations

import onnx
import pytest
from onnx_testkit import ops, ort_run, rel_err

import bnfold
from bnfold_testutil import reference
from fold_cases import (
    BATCH,
    BY_NAME,
    OTHER_BATCH,
    REAL_CASES,
    n_batch_norms,
    summary,
    variants,
)

pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")

EXPORTERS = ["dynamo", "torchscript"]
ONNX_CASES = REAL_CASES + [BY_NAME["preactivation_bn_relu_conv"]]
REL = 1e-5


def _initializers(model: onnx.ModelProto) -> set[str]:
    return {t.name for t in model.graph.initializer}


def _check_outputs(case, original: onnx.ModelProto, folded: onnx.ModelProto, batch: int) -> None:
    """ORT on the original agrees with the float64 module (so the export is right), and so does ORT
    on the folded model."""
    x = case.inputs(batch)
    refs = reference(case.model(), *x)
    refs = refs if isinstance(refs, tuple) else (refs,)
    feeds = case.feeds(original, batch)
    for which, model in (("original", original), ("folded", folded)):
        outs = ort_run(model, feeds)
        assert len(outs) == len(refs)
        for out, ref in zip(outs, refs, strict=True):
            err = rel_err(out, ref)
            assert err <= REL, f"{which} model at batch {batch}: error {err:.3g} of the output magnitude"


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("case, dynamic", variants(ONNX_CASES))
def test_real_architecture_onnx(case, dynamic, exporter):
    original = case.onnx(exporter, dynamic)
    assert ops(original).count("BatchNormalization") == n_batch_norms(case.model()), "the export fused a BN"
    before = original.SerializeToString()
    result = bnfold.fold(original)
    assert original.SerializeToString() == before, "bnfold.fold modified its input"
    folded, report = result.model, result.report
    onnx.checker.check_model(folded)

    for batch in (BATCH, OTHER_BATCH) if dynamic else (BATCH,):
        _check_outputs(case, original, folded, batch)
    assert (len(report.folded), len(report.skipped)) == (case.folded, case.skipped), summary(case, report)
    for skip in report.skipped:
        assert case.reason_code is None or skip.code == case.reason_code, skip
    left = ops(folded).count("BatchNormalization")
    assert left == case.skipped, f"{left} BatchNormalization nodes left in the folded model"
    if case.affine_op:
        op = case.affine_op.capitalize()
        assert op in ops(original) and op not in ops(folded), f"{op} left: {ops(folded)}"
    # names: an original initializer name the case keeps must survive the fold
    missing = [k for k in case.keys if k in _initializers(original) and k not in _initializers(folded)]
    assert not missing, f"lost the original initializers {missing}; has {sorted(_initializers(folded))}"


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_one_bias_free_conv_on_two_paths_onnx(exporter):
    """Two Convs read one weight initializer; each BN folds into a private copy, one keeps the name."""
    case = BY_NAME["shared_conv_two_bns"]
    original = case.onnx(exporter, False)
    result = bnfold.fold(original)
    report = result.report
    assert len(report.folded) == 2 and len({f.into for f in report.folded}) == 2, report
    conv_weights = [n.input[1] for n in result.model.graph.node if n.op_type == "Conv"]
    assert len(set(conv_weights)) == 2 and "conv.weight" in conv_weights, conv_weights
    assert report.extra_bytes >= 4 * 3 * 3 * 3 * 4, report.to_dict()  # one private float32 [4, 3, 3, 3] copy
    _check_outputs(case, original, result.model, BATCH)


def test_levit_linear_norm_shape_user_is_not_a_data_user():
    """LeViT LinearNorm from the TorchScript exporter: the MatMul's output feeds Flatten and a Shape node
    (reshape_as).  The Shape reads only the shape, which the fold keeps."""
    case = BY_NAME["levit_linear_norm"]
    original = case.onnx("torchscript", True)
    matmul = next(n for n in original.graph.node if n.op_type == "MatMul")
    users = sorted(n.op_type for n in original.graph.node if matmul.output[0] in n.input)
    assert users == ["Flatten", "Shape"], users  # the pattern this test is about
    result = bnfold.fold(original)
    assert len(result.report.folded) == 1 and not result.report.skipped, summary(case, result.report)
    assert "BatchNormalization" not in ops(result.model)
    _check_outputs(case, original, result.model, OTHER_BATCH)
