"""The fp16 range rewrite on graphs built to break its planner: a chain thousands of ops deep (the walk back from
its last value runs on a stack of its own, no RecursionError), regions past the planner's bounds, constants that do
not scale exactly (NaN, inf, a value that underflows: refused before anything is written, the graph untouched),
and powers whose exponents explode.  Through ``bnfold.fold`` and ``bnfold fold --fp16-range``: an entry with a
reason and a code, exit 0, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import range_graphs as rg
import torch
from range_cli import cli

import bnfold
from bnfold.engine import range_planner
from bnfold.report import Code

#: relu + add: 2400 ops between the two convs in ONNX, 1200 in the torch chain (``ReluAddChain(DEEP // 2)``): past
#: Python's stack of 1000 frames even at one frame an op (the recursive walk stopped near 300 ops); a chain of 2500
#: made these tests 3x slower (the export and the fold grow faster than the chain) and proved no more
DEEP = 1200


def _ort(model, batch) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": batch[0].numpy()})[0]


def _same_function(a, b) -> None:
    """``a`` and ``b`` (ONNX) compute the same outputs on fresh inputs (float32: powers of two move exponents)."""
    for batch in rg.batches(2, seed=7):
        ref, got = _ort(a, batch), _ort(b, batch)
        assert np.abs(ref - got).max() <= 1e-5 * np.abs(ref).max()


def _inits(model) -> dict:
    return {t.name: bytes(t.raw_data) or tuple(t.float_data) for t in model.graph.initializer}


def _rescaled_in_one_region(report, values: int) -> None:
    (entry,) = [e for e in report.rescaled if e.factor != 1.0]
    assert entry.code is Code.RESCALED and f"with {values} value(s)" in entry.reason
    assert entry.peak_after <= 65504 / 16 < entry.peak


def test_a_deep_onnx_chain_is_one_region():
    model = rg.relu_add_chain(DEEP)
    result = bnfold.fold(model, fp16_range=rg.batches())
    _rescaled_in_one_region(result.report, 2 * DEEP)
    _same_function(bnfold.fold(model).model, result.model)


@pytest.fixture(scope="module")
def chain_files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("deep")
    (d / "chain.onnx").write_bytes(rg.relu_add_chain(DEEP).SerializeToString())
    np.savez(d / "x.npz", x=torch.stack([b[0] for b in rg.batches()]).numpy())
    model = rg.ReluAddChain(DEEP // 2).eval()
    torch.export.save(torch.export.export(model, rg.batches(1)[0]), d / "chain.pt2")
    return d


@pytest.mark.parametrize("name", ["chain.onnx", "chain.pt2"])
def test_the_cli_rewrites_a_deep_chain(chain_files, name):
    out = f"out_{name}"
    done = cli("--json", "fold", name, "-o", out, "--fp16-range", "x.npz", "--force", cwd=chain_files)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    (entry,) = [e for e in json.loads(done.stdout)["rescaled"] if e["factor"] != 1.0]
    assert entry["code"] == "rescaled" and (chain_files / out).exists()


def test_a_deep_torch_chain_is_one_region(chain_files):
    program = torch.export.load(chain_files / "chain.pt2")
    batches = rg.batches()
    result = bnfold.fold(program, fp16_range=batches)
    _rescaled_in_one_region(result.report, DEEP)
    folded = bnfold.fold(program).model
    for (x,) in rg.batches(2, seed=7):
        ref, got = folded.module()(x), result.model.module()(x)
        assert (ref - got).abs().max() <= 1e-5 * ref.abs().max()


def test_a_region_past_the_bounds_is_refused_with_its_code(monkeypatch):
    monkeypatch.setattr(range_planner, "MAX_REGION", 64)
    monkeypatch.setattr(range_planner, "WORK_PER_NODE", 2)
    model = rg.relu_add_chain(100)
    result = bnfold.fold(model, fp16_range=rg.batches())
    entries = result.report.rescaled
    assert entries and all(e.code is Code.REGION_LIMIT and e.factor == 1.0 and not e.nodes for e in entries)
    reasons = {e.reason for e in entries}
    assert "its region passes 64 values" in reasons
    assert any("work budget is spent" in r for r in reasons)  # once spent, each value left costs one step
    assert _inits(result.model) == _inits(bnfold.fold(model).model)


@pytest.mark.parametrize(
    ("c", "value", "code"),
    [
        ([1.0, 1.2345678e-38, 1.0, 1.0], "h1", Code.LIMIT_BOUND),  # a normal float32 whose scale by 2^-k is subnormal
        ([1.0, float("nan"), 1.0, 1.0], "h1", Code.NOT_FINITE),
        ([1.0, float("inf"), 1.0, 1.0], "h1", Code.NOT_FINITE),
        ([1.0, 3.4e38, 1.0, 1.0], "h0", Code.NOT_FINITE),  # x * c overflows float32: the values' peaks are infinite
    ],
)
def test_a_constant_that_does_not_scale_leaves_the_graph_untouched(c, value, code):
    """The conv's weights and the constant are scaled together: the conv's check passes, the constant's fails.
    Before, the conv was written and then the constant raised (a fold failure with a half-edited graph)."""
    model = rg.plus_scaled_constant(c)
    folded = bnfold.fold(model).model
    result = bnfold.fold(model, fp16_range=rg.batches())
    (entry,) = [e for e in result.report.rescaled if e.value == value]
    assert entry.code is code and entry.factor == 1.0 and not entry.nodes, entry
    assert all(e.factor == 1.0 for e in result.report.rescaled)
    assert _inits(result.model) == _inits(folded)
    assert [n.op_type for n in result.model.graph.node] == [n.op_type for n in folded.graph.node]


def test_a_torch_constant_that_does_not_scale_leaves_the_program_untouched():
    program = torch.export.export(rg.PlusScaledConstant([1.0, 1.2345678e-38, 1.0, 1.0]).eval(), rg.batches(1)[0])
    folded = bnfold.fold(program).model
    result = bnfold.fold(program, fp16_range=rg.batches())
    (entry,) = [e for e in result.report.rescaled if e.value == "add"]
    assert entry.code is Code.LIMIT_BOUND and "'mul'" in entry.reason and not entry.nodes, entry
    assert all(e.factor == 1.0 for e in result.report.rescaled)
    assert result.model.graph_module.code == folded.graph_module.code
    after, before = result.model.state_dict, folded.state_dict
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)


@pytest.mark.parametrize(
    ("model", "code"),
    [
        (rg.power_chain("Sqrt", 1100), Code.REGION_LIMIT),  # the next conv's exponent is 2^-1100
        (rg.power_chain("Pow", 40, 0.5), Code.REGION_LIMIT),
        (rg.power_chain("Pow", 1, 1e30), Code.REGION_LIMIT),
        (rg.power_chain("Pow", 1, float("nan")), Code.NONLINEAR_READER),
        (rg.power_chain("Pow", 1, float("inf")), Code.NONLINEAR_READER),
        (rg.power_chain("Pow", 1, 1 / 3), Code.NONLINEAR_READER),  # float32(1/3) is no fraction of s's exponent
    ],
    ids=["sqrt_1100", "pow_half_40", "pow_1e30", "pow_nan", "pow_inf", "pow_third"],
)
def test_exploding_powers_are_refused_with_a_code(model, code):
    result = bnfold.fold(model, fp16_range=rg.batches())
    (entry,) = [e for e in result.report.rescaled if e.value == "h0"]
    assert entry.code is code and entry.factor == 1.0, entry
    assert _inits(result.model) == _inits(bnfold.fold(model).model)


@pytest.mark.parametrize("eps", [float("nan"), 1e-44])
def test_an_eps_that_would_not_stay_exact_is_refused(eps):
    """LayerNormalization's epsilon (a float32 attribute) times 2^-2k: a NaN stays NaN, 1e-44 (subnormal) would lose
    its bits (main wrote 0)."""
    model = rg.layer_norm(eps)
    result = bnfold.fold(model, fp16_range=rg.batches())
    (entry,) = [e for e in result.report.rescaled if e.value == "h0"]
    assert entry.code is Code.LIMIT_BOUND and "its eps" in entry.reason and entry.factor == 1.0, entry
    assert list(result.model.graph.node[1].attribute) == list(model.graph.node[1].attribute)


def test_a_normal_eps_moves_with_the_scale():
    result = bnfold.fold(rg.layer_norm(1e-5), fp16_range=rg.batches())
    (entry,) = [e for e in result.report.rescaled if e.value == "h0"]
    assert entry.code is Code.RESCALED, entry
    (eps,) = [a.f for a in result.model.graph.node[1].attribute if a.name == "epsilon"]
    assert eps == np.float32(1e-5) * entry.factor**2


def test_the_cli_refuses_a_hostile_constant_in_its_report(tmp_path):
    (tmp_path / "nan.onnx").write_bytes(rg.plus_scaled_constant([1.0, float("nan"), 1.0, 1.0]).SerializeToString())
    np.savez(tmp_path / "x.npz", x=torch.stack([b[0] for b in rg.batches()]).numpy())
    done = cli("--json", "fold", "nan.onnx", "-o", "out.onnx", "--fp16-range", "x.npz", cwd=tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    codes = {e["value"]: e["code"] for e in json.loads(done.stdout)["rescaled"]}
    assert codes["h1"] == "not_finite"
