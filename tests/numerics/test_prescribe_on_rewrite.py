"""A range rewrite that fixes part of a model, and a float32 island for the rest: a residual stream past 65504 (the
exact rewrite rescales it) feeds one attention head whose scores pass 65504 at the softmax (nothing exact fixes
that).  The island is searched on the rewritten model, so it holds the scores only, not the stream; through
``bnfold fold --fp16-range``, onnxconverter-common's ``node_block_list`` and ONNX Runtime the model keeps the task."""

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import bnfold
from bnfold.numerics import block_list

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import range_models as rm  # noqa: E402

onnx = pytest.importorskip("onnx")


class StreamThenScores(nn.Module):
    """``rm.ResidualStream``'s stream and final norm, then one attention head whose q and k are 160x: the scores
    after ``/ sqrt(d)`` reach ~1e5."""

    shapes = ((2, 8, 32),)

    def __init__(self, d: int = 32):
        super().__init__()
        torch.manual_seed(0)
        self.stream = rm.ResidualStream(d)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.head = nn.Linear(d, 10)
        self.d = d
        with torch.no_grad():
            self.q.weight.mul_(160.0)
            self.k.weight.copy_(self.q.weight)
            self.k.bias.copy_(self.q.bias)

    def forward(self, x):
        s = self.stream
        h = s.embed(x)
        for norm, proj in zip(s.norms, s.projs):
            h = h + proj(norm(h))
        h = s.final(h)
        scores = (self.q(h) @ self.k(h).transpose(-2, -1)) / math.sqrt(self.d)
        return self.head((scores.softmax(dim=-1) @ self.v(h)).mean(dim=1))


def _model(fmt):
    m = StreamThenScores().eval()
    return (rm.program(m) if fmt == "pt2" else rm.onnx_model(m)), rm.batches(m)


@pytest.mark.parametrize("fmt", ["pt2", "onnx"])
def test_the_island_is_searched_on_the_rewritten_model(fmt):
    model, xs = _model(fmt)
    rep = bnfold.audit(model, xs)
    d = rep.to_dict()
    assert rep.deploy is False and d["cause"]["kind"] == "overflow"
    pres = d["prescription"]
    tried = {t["name"]: t["holds"] for t in pres["tried"]}
    assert tried["fp16_range"] is False  # the rewrite alone leaves the scores past 65504
    assert pres["rewrite"] == ["fp16_range"] and pres["base"] == "rewritten" and pres["holds"]
    # the island holds the scores' ops only: no op of the stream, which the rewrite brought into range
    assert 0 < len(pres["fp32_nodes"]) <= 3, pres["fp32_nodes"]
    softmax = "softmax" if fmt == "pt2" else "/Softmax"
    assert softmax in pres["fp32_nodes"]
    assert not any(("norm" in n or "embed" in n or "pow" in n) for n in pres["fp32_nodes"] + pres["labels"])
    assert rep.prescription.end_to_end is not None and not rep.prescription.end_to_end.output.nonfinite
    line = rep.advice()[1]
    assert line.startswith(f"prescription: keep {len(pres['fp32_nodes'])} of {pres['nodes']} nodes of the model ")
    assert "`bnfold fold --fp16-range INPUTS.npz` writes in float32" in line


def test_rewrite_then_block_list_through_onnxconverter_common_and_onnx_runtime():
    """The prescription carried out as a user would: ``bnfold.fold(model, fp16_range=batches)``, then
    ``convert_float_to_float16(node_block_list=...)`` with the block list's nodes (names of the rewritten model),
    then ONNX Runtime: finite, within the floor against the float model."""
    ort = pytest.importorskip("onnxruntime")
    f16 = pytest.importorskip("onnxconverter_common.float16")
    model, xs = _model("onnx")
    rep = bnfold.audit(model, xs)
    listed = json.loads(block_list.render(rep.prescription, "onnxconverter-common", onnx=True))
    assert listed["base"] == "rewritten" and listed["rewrite"] == ["fp16_range"]
    rewritten = bnfold.fold(model, fp16_range=xs).model
    names = {n.name for n in rewritten.graph.node}
    assert set(listed["node_block_list"]) <= names  # every name is the rewritten model's own
    blocked = f16.convert_float_to_float16(rewritten, keep_io_types=True, node_block_list=listed["node_block_list"])

    def run(m):
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        return np.concatenate([sess.run(None, {"x0": x.numpy()})[0] for (x,) in xs])

    ref, out = run(model), run(blocked)
    assert np.isfinite(out).all()
    sqnr = 10 * math.log10(float((ref**2).sum()) / float(((out - ref) ** 2).sum()))
    assert sqnr >= rep.floor.min_sqnr_db
    assert (out.argmax(1) == ref.argmax(1)).mean() >= rep.floor.min_agreement


def test_the_fallback_island_has_runs_of_its_own():
    """``max_runs=1``: the range rewrite's verification run no longer spends the island's runs (before: no island
    run at all, and the line said "the verdict still fails after 1 runs" of a set never tried); the one island run
    goes to the fallback, the model as shipped, whose island then holds."""
    model, xs = _model("pt2")
    pres = bnfold.audit(model, xs, max_runs=1).prescription
    assert pres.base == "folded" and pres.rewrite == [] and pres.holds and pres.fp32_nodes
    assert pres.end_to_end is not None and not pres.end_to_end.output.nonfinite
    assert pres.runs == 2  # the rewrite's verification, the fallback's island


def test_max_runs_0_runs_no_island():
    """``max_runs=0``: no island emulation (the rewrite is still verified: one run); the island's starting set (the
    ops past the limit and the cause) is listed as not verified.  Before, the fallback's share of at least one run
    made one anyway; a negative ``max_runs`` is refused in one line."""
    model, xs = _model("pt2")
    pres = bnfold.audit(model, xs, max_runs=0).prescription
    assert pres.runs == 1 and pres.fp32_nodes and not pres.holds and pres.end_to_end is None
    assert "not verified: max_runs left no run" in pres.line() and "still fails" not in pres.line()
    with pytest.raises(ValueError, match="max_runs must be a whole number of runs, 0 or more, got -1"):
        bnfold.audit(model, xs, max_runs=-1)


def test_an_island_on_a_rewritten_model_cannot_starve_the_fallback(monkeypatch):
    """An island search on the rewritten model that never holds spends only its share of ``max_runs`` (half); the
    fallback's search on the model as shipped then runs in its own (before, it got what was left: nothing)."""
    from bnfold.numerics import diagnose, prescribe

    real, spent = prescribe.island, []

    def never_holds(search, program, records, cause, runs=None):
        if spent:  # the second search, on the model as shipped: the real one
            return real(search, program, records, cause, runs)
        for _ in range(runs):
            search.run(program)
        spent.append(runs)
        return [program.steps[0].name], False, None

    monkeypatch.setattr(diagnose, "island", never_holds)
    model, xs = _model("pt2")
    pres = bnfold.audit(model, xs, max_runs=8).prescription
    assert spent == [4] and pres.base == "folded" and pres.holds and pres.end_to_end is not None
    assert 1 + 4 < pres.runs <= 1 + 8  # the verification, then at most max_runs island runs


def test_the_report_keeps_no_rewritten_program():
    """Each tried rewrite's program and per-op records are dropped once scored; the report keeps what it prints."""
    model, xs = _model("pt2")
    rep = bnfold.audit(model, xs)
    tried = rep.prescription.tried
    assert tried and all(v.program is None and v.records == [] for v in tried)
    d = rep.to_dict()["prescription"]["tried"]
    assert [t["name"] for t in d] == [v.rewrite.name for v in tried] and all("output_sqnr_db" in t for t in d)


@pytest.mark.parametrize(
    ("max_runs", "partial", "shares"),
    [(8, 0, (0, 8)), (8, 1, (4, 4)), (8, 2, (4, 4)), (3, 1, (2, 1)), (1, 1, (0, 1)), (0, 1, (0, 0)), (0, 0, (0, 0))],
)
def test_island_shares(max_runs, partial, shares):
    from bnfold.numerics.prescribe import island_shares

    assert island_shares(max_runs, partial) == shares
