"""Rounding and overflow semantics of the precision profiles on hand-made values."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bnfold.numerics import FP16_MAX, get_profile, round_fp16

KNOWN = [
    (65504.0, 65504.0),  # largest fp16 stays
    (65519.0, 65504.0),  # just below the rounding boundary
    (65520.0, math.inf),  # the boundary ties away to inf (as hardware does)
    (-65520.0, -math.inf),
    (1e6, math.inf),
    (1 + 2**-11, 1.0),  # halfway between 1 and 1+2^-10: ties to even (1)
    (1 + 3 * 2**-11, 1 + 2**-9),  # halfway between 1+2^-10 and 1+2^-9: ties to even (1+2^-9)
    (2049.0, 2048.0),  # spacing 2 above 2048: tie to even
    (2051.0, 2052.0),
    (2**-24, 2**-24),  # smallest subnormal stays
    (2**-25, 0.0),  # half of it ties to even (zero)
    (3 * 2**-25, 2**-23),  # 1.5 subnormal steps ties to 2
    (-0.0, -0.0),
]


@pytest.mark.parametrize("value,expected", KNOWN)
def test_round_fp16_known_values(value, expected):
    got = round_fp16(torch.tensor([value], dtype=torch.float32))
    assert got.dtype == torch.float32
    assert got.item() == expected
    assert math.copysign(1, got.item()) == math.copysign(1, expected)


def test_round_fp16_keeps_nan_and_inf():
    got = round_fp16(torch.tensor([math.nan, math.inf, -math.inf]))
    assert math.isnan(got[0]) and got[1] == math.inf and got[2] == -math.inf


@settings(max_examples=200, deadline=None)
@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_round_fp16_matches_numpy(x):
    # numpy's float32 -> float16 cast is an independent IEEE round-to-nearest-even implementation
    with np.errstate(over="ignore"):
        expected = float(np.float32(x).astype(np.float16))
    assert round_fp16(torch.tensor([x], dtype=torch.float32)).item() == expected


def test_fp16_max_is_the_largest_finite_half():
    assert FP16_MAX == float(torch.finfo(torch.float16).max)


def test_profiles_round_as_named():
    x = torch.tensor([1 + 2**-11, 2049.0, 65520.0, 1 + 2**-20])
    assert torch.equal(get_profile("fp32").round(x), x)
    for name in ("fp16", "htp", "fp16-acc"):
        assert get_profile(name).round(x).tolist() == [1.0, 2048.0, math.inf, 1.0]


def test_unknown_profile_is_refused():
    with pytest.raises(ValueError, match="unknown precision profile"):
        get_profile("bf16")


@pytest.mark.parametrize("name", ["fp32", "fp16", "ort-cpu"])
def test_constants_rounded_together_equal_one_by_one_and_stay_aligned(name):
    """The runner rounds a model's small constants in one call over their concatenation: each comes out as the
    profile rounds it alone, in its shape and strides, and starts on a 64-byte boundary as an allocation of its own
    does (a 1x1 conv computes other float32 bits from a weight 4 bytes off)."""
    from bnfold.numerics.rounded_constants import ROUNDED_TOGETHER, round_constants

    g = torch.Generator().manual_seed(0)
    shapes = [(96, 6, 1, 1), (96,), (), (7,), (1, 3), (ROUNDED_TOGETHER + 1,), (5, 5)]
    f32 = {f"c{i}": torch.randn(s, generator=g) * 3e4 for i, s in enumerate(shapes)}
    f32["strided"] = torch.randn(6, 4, generator=g).t()
    f32["tiny"] = torch.tensor([1e-9, -3e-8, 0.0])  # under ort-cpu's clamp
    f32["odd"] = torch.randn(3, generator=g).as_strided((3, 1), (1, 7))  # contiguous, a size-1 dim's stride is free
    prof = get_profile(name)
    out = round_constants(prof, f32)
    assert out.keys() == f32.keys()
    for k, v in f32.items():
        alone = prof.round_const(v)
        assert out[k].shape == v.shape and torch.equal(out[k], alone), k
        assert out[k].stride() == v.stride() and out[k].data_ptr() % 64 == 0, k
    w, b = torch.randn(96, 6, 1, 1, generator=g), torch.randn(96, generator=g)
    together = round_constants(prof, {"s": torch.randn(3, generator=g), "w": w, "b": b})  # w after 3 floats
    x = torch.randn(1, 6, 1, 1, generator=g)
    alone = torch.conv2d(x, prof.round_const(w), prof.round_const(b))
    assert torch.equal(torch.conv2d(x, together["w"], together["b"]), alone)


def test_a_large_constant_rounded_chunk_by_chunk_holds_the_bits_of_one_rounding(monkeypatch):
    """A float32 constant past ``ROUND_IN_CHUNKS`` is rounded through a small fp16 buffer: the bits of rounding it
    whole (ties to even, fp16's subnormals, overflow to inf, -0.0; a NaN stays NaN, its payload the conversion's),
    its shape and strides; a strided or float64 one is rounded whole."""
    import bnfold.numerics.profiles as profiles

    monkeypatch.setattr(profiles, "ROUND_IN_CHUNKS", 64)
    monkeypatch.setattr(profiles, "_CHUNK", 64)  # chunks that end inside the tensor's rows
    g = torch.Generator().manual_seed(0)
    t = torch.randn(19, 13, generator=g) * 3e4
    t.view(-1)[:8] = torch.tensor([65520.0, 65519.0, -0.0, 3e-8, 2.98e-8, float("nan"), float("inf"), 1 + 2**-11])
    calls = []
    real = profiles.round_fp16_chunked
    monkeypatch.setattr(profiles, "round_fp16_chunked", lambda x: calls.append(1) or real(x))
    for name in ("fp16", "htp"):
        out = get_profile(name).round_const(t)
        whole = profiles.round_fp16(t)
        assert out.shape == t.shape and out.stride() == t.stride()
        assert torch.equal(out.isnan(), whole.isnan()) and out.isnan().sum() == 1
        assert torch.equal(out.nan_to_num().view(torch.int32), whole.nan_to_num().view(torch.int32))
    assert len(calls) == 2
    get_profile("fp16").round_const(t.t())  # strided: whole
    get_profile("fp16").round_const(t.double())
    assert len(calls) == 2
