"""Constants beyond a runtime's limits (onnxconverter-common clamps every constant above 1e4 before float16): a
layer whose weight passes 1e4 while its output stays small moves down by a power of two, the next layer takes the
inverse.  Checked under the ``ort-cpu`` profile and in ONNX Runtime on the float16 conversion."""

from __future__ import annotations

import io
import warnings

import onnx
import pytest
import torch
from torch import nn

import bnfold
from bnfold.report import Code


class BigWeight(nn.Module):
    """A linear layer of weights up to 2e4 reading probabilities (so its output stays near 1e3), then a head."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(256, 10)
        self.out = nn.Linear(10, 10)
        with torch.no_grad():
            self.fc.weight.uniform_(-2e4, 2e4)

    def forward(self, x):
        return self.out(self.fc(x.softmax(-1)))


def _model(kind: str):
    torch.manual_seed(0)
    model = BigWeight().eval()
    example = (torch.randn(4, 256),)
    if kind == "pt2":
        return torch.export.export(model, example)
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, example, f, dynamo=False, opset_version=14, input_names=["x0"])
    return onnx.load_from_string(f.getvalue())


def _sqnr(model, batches, runtime=None) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rep = bnfold.audit(model, batches, profile="ort-cpu", fold=False, local=False, runtime=runtime).to_dict()
    return (rep["runtime"] if runtime else rep["end_to_end"])["unfolded"]["output_finite_sqnr_db"]


@pytest.mark.parametrize("kind", ["pt2", "onnx"])
def test_a_weight_beyond_the_converter_clamp_moves_down(kind):
    model = _model(kind)
    gen = torch.Generator().manual_seed(3)
    calibration = [(torch.randn(4, 256, generator=gen),) for _ in range(2)]
    fresh = [(torch.randn(4, 256, generator=gen),) for _ in range(2)]
    result = bnfold.fold(model, fp16_range=calibration)
    (entry,) = result.report.rescaled
    assert entry.code is Code.RESCALED and entry.kind == "constant" and entry.factor == 0.5
    assert entry.peak > 1e4 >= entry.peak_after
    before, after = _sqnr(model, fresh), _sqnr(result.model, fresh)
    assert before < 20 and after > 50  # measured 10.9 -> 68.3 dB
    if kind == "onnx":  # the real runtime: ONNX Runtime on onnxconverter-common's float16 model
        assert _sqnr(model, fresh, "onnxruntime") < 20 and _sqnr(result.model, fresh, "onnxruntime") > 50


def test_a_named_profile_sets_the_limits():
    """``profile="fp16"``: fp16's 65504 bounds constants, so a 2e4 weight is no constant beyond a limit."""
    model = _model("pt2")
    result = bnfold.fold(model, fp16_range=[(torch.randn(4, 256),)], profile="fp16")
    assert result.report.rescaled == []
