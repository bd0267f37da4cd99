"""NaN/inf is reported as such (count and share), never as an SQNR: not "exact", not a finite number.

The outputs come from a real emulated failure: a batch norm whose dead channel (running variance 0,
constant input 5) overflows fp16 under ``htp`` at a runtime eps of 1e-9 (see ``test_risk``), so that
channel turns to NaN (``inf - inf``).  Summed over channels, every output is NaN; per channel, half.
"""

import json
import math

import pytest
import torch
from test_risk import DeadChannel
from torch import nn

import bnfold
from bnfold.numerics.probe import NormProbe
from bnfold.numerics.table import sqnr
from bnfold.numerics.tensor_error import SMALL, ErrorMeter, TensorError, measure, reference_stats


class Summed(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = DeadChannel()

    def forward(self, x):
        return self.body(x).sum((1, 2, 3)).unsqueeze(1)


def _audit(model):
    torch.manual_seed(0)
    return bnfold.audit(model, [(torch.randn(4, 3, 6, 6) * 0.5,)], profile="htp", bn_eps=1e-9)


def test_measure_all_and_partly_nan():
    ref = torch.arange(1.0, 9.0, dtype=torch.float64)
    all_nan = measure("y", "op", torch.full((8,), math.nan), ref, exact_diff=True)
    assert (all_nan.nan, all_nan.nonfinite_share) == (8, 1.0)
    assert math.isnan(all_nan.sqnr_db) and math.isnan(all_nan.finite_sqnr_db)  # not +inf ("exact")
    half = torch.tensor([1.0, 2, 3, 4, math.nan, math.inf, math.nan, -math.inf])
    part = measure("y", "op", half, ref, exact_diff=False)
    assert (part.nan, part.inf, part.nonfinite_share) == (2, 2, 0.5)
    assert math.isnan(part.sqnr_db) and part.finite_sqnr_db == math.inf  # the finite half is exact
    assert sqnr(all_nan) == "NaN 100%" and sqnr(part) == "NaN 50%"
    d = part.to_dict()
    assert d["sqnr_db"] is None and (d["nan"], d["inf"], d["elements"]) == (2, 2, 8)
    clean = TensorError("y", "op", (8,), 8, signal=1.0, noise=0.0)
    clean.merge(all_nan)  # one bad batch spoils the merged figure
    assert math.isnan(clean.sqnr_db) and clean.nonfinite_share == pytest.approx(0.5)


@pytest.mark.parametrize("exact", [True, False])
def test_meter_measures_small_tensors_together_as_measure_does(exact):
    g = torch.Generator().manual_seed(0)
    ref_dtype = torch.float64 if exact else torch.float32
    shapes = [(1, 8, 1, 1), (3,), (SMALL,), (SMALL + 1,), (1, 4, 2, 2), (), (0,), (5,)]
    pairs = []
    for shape in shapes:
        r = torch.randn(shape, generator=g, dtype=ref_dtype) * 3
        pairs.append((r.to(torch.float32) + 1e-3 * torch.randn(shape, generator=g), r))
    pairs[-1][0][2] = math.inf  # a small tensor with inf: measured on its own (counts), not in the batch
    into, meter = {}, ErrorMeter(exact)
    for i, (e, r) in enumerate(pairs):
        meter.add(into, f"v{i}", "op", e, r)
    assert list(into) == [f"v{i}" for i in range(len(pairs))]  # the order of the calls, before the flush too
    meter.flush()
    for i, (e, r) in enumerate(pairs):
        got, want = into[f"v{i}"], measure(f"v{i}", "op", e, r, exact)
        assert (got.node, got.shape, got.count, got.nan, got.inf) == (want.node, want.shape, want.count, 0, want.inf)
        assert (got.max_abs_ref, got.max_abs_err) == (want.max_abs_ref, want.max_abs_err)  # exact either way
        assert got.signal == pytest.approx(want.signal, rel=1e-6) and got.noise == pytest.approx(want.noise, rel=1e-5)
    assert into["v7"].inf == 1 and math.isnan(into["v7"].sqnr_db)


@pytest.mark.parametrize("exact", [True, False])
def test_a_reference_measured_before_is_not_measured_again(exact):
    """The folded program is measured against the unfolded one's reference values: what the unfolded
    measurement found of a reference (its signal, largest magnitude) serves again, with the same result;
    not after a measurement that met a non-finite value (its signal covered only the finite elements)."""
    g = torch.Generator().manual_seed(1)
    r = (torch.randn(4, 300, generator=g) * 5).to(torch.float64 if exact else torch.float32)
    e1, e2 = (r.to(torch.float32) + s * torch.randn(r.shape, generator=g) for s in (1e-3, 1e-2))
    first = measure("a", "op", e1, r, exact)
    again = measure("b", "op", e2, r, exact, ref_stats=reference_stats(first))
    assert again == measure("b", "op", e2, r, exact)
    assert again.signal == first.signal and again.max_abs_ref == first.max_abs_ref and again.noise > first.noise
    told = measure("b", "op", e2, r, exact, ref_stats=(1.0, 2.0))  # what it is told is what it reports
    assert (told.signal, told.max_abs_ref, told.noise) == (1.0, 2.0, again.noise)
    e1[0, 0] = math.nan
    assert reference_stats(measure("a", "op", e1, r, exact)) is None
    assert reference_stats(measure("a", "op", e2[:1, :8], r[:1, :8], exact)) is None  # small: measured together


def test_a_probe_counts_nan_and_leaves_it_out_of_the_ranges():
    """A batch norm's probe: per-channel ranges of its input in the reference and the emulated run; NaN in the
    emulated input is counted and left out of its ranges (inf kept), the reference's ranges unchanged."""
    ref = torch.arange(24.0).reshape(2, 3, 4) - 10  # channels on axis 1
    emulated = ref.clone()
    emulated[0, 1, 2], emulated[1, 1, 0], emulated[1, 2, 3] = math.nan, math.nan, math.inf
    p = NormProbe.of("bn", emulated, ref, 1)
    want_lo, want_hi = ref.amin(dim=(0, 2)).double(), ref.amax(dim=(0, 2)).double()
    assert torch.equal(p.lo_ref, want_lo) and torch.equal(p.hi_ref, want_hi)
    assert p.nan_emu == 2 and torch.equal(p.lo_emu, want_lo)
    assert p.hi_emu.tolist() == [want_hi[0].item(), want_hi[1].item(), math.inf]
    clean = NormProbe.of("bn", ref, ref, 1)  # no NaN: the one-table path, the same ranges
    assert clean.nan_emu == 0 and torch.equal(clean.lo_emu, want_lo) and torch.equal(clean.hi_ref, want_hi)


def test_all_nan_output_is_not_exact():
    rep = _audit(Summed())
    out = rep.unfolded.output
    assert out.nonfinite == out.count == 4 and out.nonfinite_share == 1.0
    assert math.isnan(out.sqnr_db)
    (line,) = [ln for ln in rep.table().splitlines() if ln.strip().startswith("output SQNR")]
    assert "NaN 100%" in line and "exact" not in line
    doc = json.loads(json.dumps(rep.to_dict(), allow_nan=False))
    e2e = doc["end_to_end"]["unfolded"]
    assert e2e["output_sqnr_db"] is None and e2e["nonfinite_share"] == 1.0 and e2e["nan"] == 4
    assert doc["end_to_end"]["folded"]["output_sqnr_db"] is not None  # folded, nothing overflows
    assert any("100% NaN/inf" in line for line in rep.advice())


def test_partly_nan_output_counts_its_share():
    rep = _audit(DeadChannel())
    out = rep.unfolded.output
    assert out.nonfinite_share == pytest.approx(0.5)  # channel 0 of 2
    assert math.isnan(out.sqnr_db) and math.isfinite(out.finite_sqnr_db)
    (row,) = rep.layers
    assert row.unfolded.nonfinite_share == pytest.approx(0.5) and math.isnan(row.unfolded.sqnr_db)
    assert row.local_unfolded.nonfinite_share == pytest.approx(0.5)
    assert rep.worst_layers(1)[0] is row
    doc = json.loads(json.dumps(rep.to_dict(), allow_nan=False))
    assert doc["layers"][0]["cumulative"]["unfolded"]["sqnr_db"] is None


def test_plot_marks_nan_layers(tmp_path):
    pytest.importorskip("matplotlib")
    rep = _audit(DeadChannel())
    png = tmp_path / "nan.png"
    rep.plot(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_sqnr_whose_ratio_underflows_is_minus_inf():
    """signal / noise rounding to 0 (or an infinite noise) is no signal left: -inf dB, not a math domain error."""
    from bnfold.numerics.risk import _db

    assert TensorError("x", "op", (2,), count=2, signal=1e-300, noise=1e300).sqnr_db == -math.inf
    assert _db(1e-300, 1e300) == -math.inf and _db(1.0, math.inf) == -math.inf
    assert math.isnan(_db(math.inf, math.inf)) and _db(100.0, 1.0) == 20.0
