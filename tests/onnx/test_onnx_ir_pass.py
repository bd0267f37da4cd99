"""The ONNX fold as an onnx-ir ``FunctionalPass``, composed with onnx-ir's own passes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx_testkit import ort_run

from bnfold_testutil import onnx_conv_bn

ir = pytest.importorskip("onnx_ir")
common = pytest.importorskip("onnx_ir.passes.common")

from bnfold.onnx import FoldNormalizationPass  # noqa: E402
from bnfold.report import Code  # noqa: E402


def test_fold_pass_is_functional_and_composes():
    proto = onnx_conv_bn()
    model = ir.from_proto(proto)
    before = ir.to_proto(model).SerializeToString()
    fold = FoldNormalizationPass()
    assert not fold.in_place and not fold.changes_input
    result = ir.passes.Sequential(fold, common.RemoveUnusedNodesPass())(model)
    assert result.modified and result.model is not model
    assert ir.to_proto(model).SerializeToString() == before  # the input is untouched
    assert [f.norm for f in fold.report.folded] == ["bn"]
    assert "BatchNormalization" not in [n.op_type for n in result.model.graph]
    feeds = {"X": np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    (a,), (b,) = ort_run(proto, feeds), ort_run(ir.to_proto(result.model), feeds)
    assert np.abs(a - b).max() <= 1e-5 * (1 + np.abs(a).max())


def test_fold_pass_validates_and_reports():
    with pytest.raises(ValueError, match="unknown kind"):
        FoldNormalizationPass(only="convolution")
    fold = FoldNormalizationPass(exclude="bn")
    result = fold(ir.from_proto(onnx_conv_bn()))
    assert not result.modified and [s.code for s in fold.report.skipped] == [Code.EXCLUDED]
