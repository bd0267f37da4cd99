"""``fold(..., fp16_range=batches)`` on torch programs (default, decomposed and ExecuTorch edge IR) and modules: the
five range-breaking models (``tests/range_models.py``) rewritten exactly, fp16-safe under the audit's ``fp16``
profile and in torch's real half precision."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from range_extra import HotChain, SiluSum

import bnfold
import range_models as rm
from bnfold.report import Code

#: the value each model overflows first, the kind of rewrite that fixes it, and whether an output NaNs before
EXPECTED = {
    "attention": ("linear_map", True),
    "residual": ("residual", True),
    "hot_channels": ("cross_layer", True),
    "sum_mean": ("reduction", True),
    "layer_norm": ("norm", False),  # wrong numbers (the output collapses to the bias), no NaN
}


def _f64(program, batch: tuple) -> torch.Tensor:
    module = copy.deepcopy(program.module()).to(torch.float64)
    with torch.no_grad():
        return module(*(x.double() for x in batch))


def _end_to_end(model, batches) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rep = bnfold.audit(model, batches, profile="fp16", fold=False, local=False)
    return rep.to_dict()["end_to_end"]["unfolded"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_rewritten_program_is_exact_and_fp16_safe(name):
    model = rm.build(name)
    calibration, fresh = rm.batches(model, 2), rm.batches(model, 2, seed=7)
    program = rm.program(model)
    result = bnfold.fold(program, fp16_range=calibration)
    done = [e for e in result.report.rescaled if e.factor != 1.0]
    kind, nan_before = EXPECTED[name]
    assert done and done[0].kind == kind and done[0].code is Code.RESCALED, result.report.rescaled
    assert done[0].peak_after <= 65504 / 16 < done[0].peak
    folded = bnfold.fold(program).model  # the fold alone (it rounds folded weights to float32 once)
    for batch in fresh:  # float64: powers of two change no bit of the function
        ref, got = _f64(folded, batch), _f64(result.model, batch)
        assert float((ref - got).abs().max()) <= 1e-9 * float(ref.abs().max())
    before, after = _end_to_end(program, fresh), _end_to_end(result.model, fresh)
    assert (before["nonfinite_share"] > 0) == nan_before
    assert before["nonfinite_share"] > 0 or before["output_finite_sqnr_db"] < 20
    assert after["nonfinite_share"] == 0 and after["output_finite_sqnr_db"] > 40  # measured 58-67 dB
    assert after["top1_agreement"] == 1.0


@pytest.mark.parametrize("ir", ["decomposed", "edge"])
@pytest.mark.parametrize("name", ["attention", "residual", "hot_channels", "layer_norm", "sum_mean"])
def test_every_ir(name, ir):
    model = rm.build(name)
    calibration, fresh = rm.batches(model, 2), rm.batches(model, 1, seed=7)
    program = rm.program(model, ir)
    result = bnfold.fold(program, fp16_range=calibration)
    assert any(e.code is Code.RESCALED for e in result.report.rescaled), result.report.rescaled
    ref, got = _f64(bnfold.fold(program).model, fresh[0]), _f64(result.model, fresh[0])
    assert float((ref - got).abs().max()) <= 1e-9 * float(ref.abs().max())
    if ir == "decomposed":
        assert _end_to_end(result.model, fresh)["nonfinite_share"] == 0


@pytest.mark.parametrize("name", ["attention", "hot_channels", "sum_mean"])
def test_torch_half_real_runtime(name):
    """torch's own half kernels on the rewritten module: no NaN/inf where the original gives them."""
    model = rm.build(name)
    calibration, fresh = rm.batches(model, 2), rm.batches(model, 2, seed=7)
    result = bnfold.fold(model, calibration[0], fp16_range=calibration)  # an nn.Module: a GraphModule back
    original = copy.deepcopy(model).half()
    rewritten = copy.deepcopy(result.model).half()
    for batch in fresh:
        x = tuple(t.half() for t in batch)
        ref = model(*batch)
        assert not torch.isfinite(original(*x)).all()
        got = rewritten(*x).float()
        assert torch.isfinite(got).all()
        assert float((got - ref).abs().max()) <= 0.05 * float(ref.abs().max())


def test_a_model_that_needs_nothing_is_left_as_it_is():
    model = rm.build("attention")
    with torch.no_grad():
        model.q.weight.div_(80.0)
        model.k.weight.div_(80.0)
    program = rm.program(model)
    plain = bnfold.fold(program)
    result = bnfold.fold(program, fp16_range=rm.batches(model, 2))
    assert result.report.rescaled == []
    assert result.report.to_dict()["rescaled"] == []
    assert str(result.model.graph) == str(plain.model.graph)
    assert all(torch.equal(result.model.state_dict[k], v) for k, v in plain.model.state_dict.items())


def test_report_entries_are_data():
    model = rm.build("attention")
    result = bnfold.fold(rm.program(model), fp16_range=rm.batches(model, 2), fp16_margin=16.0)
    d = result.report.to_dict()
    assert d["summary"]["rescaled"] == 1
    codes = {e["code"] for e in d["rescaled"]}
    assert codes == {"rescaled", "nonlinear_reader"}  # the softmax input is itself above 65504 / 16
    entry = next(e for e in d["rescaled"] if e["code"] == "rescaled")
    assert entry["factor"] == 2.0**-6 and entry["nodes"] and entry["kind"] == "linear_map"
    assert "rescaled" in str(result.report)


def test_bad_margin_is_refused_before_any_work():
    model = rm.build("attention")
    with pytest.raises(ValueError, match="fp16_margin"):
        bnfold.fold(rm.program(model), fp16_range=rm.batches(model, 1), fp16_margin=0.5)


def test_a_rewrite_that_changes_the_function_is_refused(monkeypatch):
    """The float64 proof is what decides: a rewrite made inexact on purpose is not applied (``inexact``)."""
    from bnfold import fold_math

    exact = fold_math.scale_pow2
    monkeypatch.setattr(fold_math, "scale_pow2", lambda t, e, dtype, what: exact(t, e, dtype, what) * 1.001)
    model = rm.build("sum_mean")
    program = rm.program(model)
    result = bnfold.fold(program, fp16_range=rm.batches(model, 2))
    assert [e.code for e in result.report.rescaled] == [Code.INEXACT]
    assert result.report.rescaled[0].factor == 1.0
    plain = bnfold.fold(program).model
    assert all(torch.equal(result.model.state_dict[k], v) for k, v in plain.state_dict.items())


class _InplaceBlock(torch.nn.Module):
    """A torchvision-style basic block with in-place ops (``relu_``, ``+=``), its values past 65504 / 16."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.skip = torch.nn.Conv2d(3, 8, 1)
        self.head = torch.nn.Linear(8, 10)
        with torch.no_grad():
            for conv in (self.conv1, self.skip):
                conv.weight.mul_(3000.0)

    def forward(self, x):
        out = self.conv2(self.conv1(x).relu_())
        out += self.skip(x)
        return self.head(out.relu_().mean(dim=(2, 3)))


def test_in_place_ops_carry_the_scale_where_nothing_else_reads_what_they_write():
    torch.manual_seed(0)
    model = _InplaceBlock().eval()
    calibration = [(torch.randn(2, 3, 16, 16),) for _ in range(2)]
    program = torch.export.export(model, calibration[0])
    assert any(n.target == torch.ops.aten.add_.Tensor for n in program.graph.nodes)
    result = bnfold.fold(program, fp16_range=calibration)
    assert {e.code for e in result.report.rescaled} == {Code.RESCALED}, result.report.rescaled
    x = (torch.randn(2, 3, 16, 16),)
    ref, got = _f64(bnfold.fold(program).model, x), _f64(result.model, x)
    assert float((ref - got).abs().max()) <= 1e-9 * float(ref.abs().max())


@pytest.mark.parametrize("ir", ["default", "decomposed", "edge"])
def test_a_multiply_goes_where_no_layer_takes_the_factor(ir):
    torch.manual_seed(0)
    model = SiluSum().eval()
    calibration = [(torch.randn(2, 3, 32, 32),) for _ in range(2)]
    program = rm.program(model, ir)
    result = bnfold.fold(program, fp16_range=calibration)
    (entry,) = [e for e in result.report.rescaled if e.factor != 1.0]
    assert entry.code is Code.RESCALED and entry.muls == 1
    muls = [n for n in result.model.graph.nodes if "mul" in str(n.target)]
    assert len(muls) == len([n for n in bnfold.fold(program).model.graph.nodes if "mul" in str(n.target)]) + 1
    x = (torch.randn(2, 3, 32, 32),)
    ref, got = _f64(bnfold.fold(program).model, x), _f64(result.model, x)
    assert float((ref - got).abs().max()) <= 1e-9 * float(ref.abs().max())


def _peaks(program, batches) -> dict:
    """The largest magnitude of each float node's output on ``batches`` (float32)."""
    peaks: dict = {}

    class Peak(torch.fx.Interpreter):
        def run_node(self, node):
            out = super().run_node(node)
            if node.op == "call_function" and isinstance(out, torch.Tensor) and out.is_floating_point():
                peaks[node.name] = max(peaks.get(node.name, 0.0), float(out.abs().max()))
            return out

    with torch.no_grad():
        for batch in batches:
            Peak(program.module()).run(*batch)
    return peaks


def test_more_hot_values_than_rounds_once_allowed():
    """70 values past the limit (the rewrite once stopped after 64, leaving the rest without an entry): each gets
    its entry and is brought under the limit, and the model stays the same function in float64."""
    model = HotChain(140).eval()
    calibration, fresh = rm.batches(model, 2), rm.batches(model, 1, seed=7)
    program = torch.export.export(model, calibration[0])
    folded = bnfold.fold(program).model
    limit = 65504 / 16
    hot = {name for name, peak in _peaks(folded, calibration).items() if peak > limit}
    assert len(hot) == 70
    result = bnfold.fold(program, fp16_range=calibration)
    entries = {e.value: e for e in result.report.rescaled}
    assert set(entries) == hot, sorted(hot - set(entries))
    assert all(e.code is Code.RESCALED and e.factor < 1.0 for e in entries.values())
    assert not [name for name, peak in _peaks(result.model, calibration).items() if peak > limit]
    ref, got = _f64(folded, fresh[0]), _f64(result.model, fresh[0])
    assert float((ref - got).abs().max()) <= 1e-9 * float(ref.abs().max())
