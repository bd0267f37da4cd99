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
