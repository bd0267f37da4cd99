"""``fold_math.pow2_exact`` (the range rewrite's test, read from a tensor's span, of whether ``scale_pow2``
keeps every bit) against scaling for real: exact products in float64 of fp16, bf16, fp32 and fp64 tensors drawn
bit by bit (subnormals, infinities, NaN), by powers of two that overflow, underflow or stay inside."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bnfold import fold_math
from bnfold.engine.range_planner import span
from bnfold.errors import FoldError

BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32, torch.float64: torch.int64}


@st.composite
def tensors(draw) -> torch.Tensor:
    dtype = draw(st.sampled_from(list(BITS)))
    ints = BITS[dtype]
    info = torch.iinfo(ints)
    patterns = st.integers(info.min, info.max)
    if draw(st.booleans()):  # most tensors: one binade around a drawn magnitude, as weights are
        top = draw(st.integers(info.min, info.max))
        patterns = st.integers(max(info.min, top - 4096), min(info.max, top + 4096))
    words = draw(st.lists(patterns, min_size=0, max_size=12))
    return torch.tensor(words, dtype=ints).view(dtype)


def _scaled_exactly(t: torch.Tensor, exponent: int) -> bool:
    """Whether ``scale_pow2`` succeeds and its result times ``2 ** -exponent`` is ``t`` again, bit for bit."""
    try:
        out = fold_math.scale_pow2(t, exponent, t.dtype, "t")
    except FoldError:
        return False
    want = t.double() * 2.0**exponent if abs(exponent) <= fold_math.POW2_REACH else torch.zeros_like(t.double())
    return out.dtype == t.dtype and torch.equal(out.double(), want)


def _normal(values: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether every nonzero of ``values`` is a normal ``dtype`` magnitude (no subnormal, none past the largest)."""
    a, info = values.double().abs(), torch.finfo(dtype)
    return bool(((a == 0) | ((a >= info.tiny) & (a <= info.max))).all())


@settings(max_examples=400, deadline=None)
@given(tensors(), st.one_of(st.integers(-300, 300), st.integers(-3000, 3000)))
def test_pow2_exact_says_what_scaling_does(t, exponent):
    says = fold_math.pow2_exact(span(t), t.dtype, t.dtype, exponent)
    does = _scaled_exactly(t, exponent)
    if says:  # never a scale that fails or rounds
        assert does
    inside = abs(exponent) <= fold_math.POW2_REACH
    if inside and does and _normal(t, t.dtype) and _normal(t.double() * 2.0**exponent, t.dtype):
        assert says  # on normal numbers it is exact: no refusal where the scale keeps every bit
    if not bool(torch.isfinite(t).all()):
        assert not says
    other = torch.float32 if t.dtype != torch.float32 else torch.float16
    assert not fold_math.pow2_exact(span(t), t.dtype, other, exponent)  # written in another dtype: not a pure scale


@pytest.mark.parametrize("exponent", [1024, 5000, -5000, 10**30])
def test_scale_pow2_past_its_reach_refuses_in_one_error(exponent):
    with pytest.raises(FoldError, match="leaves"):
        fold_math.scale_pow2(torch.tensor([1.0, 0.0]), exponent, torch.float32, "w")
    zeros = fold_math.scale_pow2(torch.tensor([0.0, -0.0]), exponent, torch.float32, "w")
    assert torch.equal(zeros, torch.zeros(2)) and math.copysign(1.0, float(zeros[1])) == -1.0
    assert not fold_math.pow2_exact((1.0, 1.0), torch.float64, torch.float64, exponent)


@settings(max_examples=300, deadline=None)
@given(
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.integers(-1200, 1200),
    st.sampled_from([torch.float16, torch.bfloat16, torch.float32]),
)
def test_pow2_scalar_and_product_are_scale_pow2_where_exact(x, exponent, dtype):
    """A norm's eps, a multiply's factor (``pow2_scalar``) and a deferred weight product (``pow2_product``) are
    ``scale_pow2``'s value where :func:`pow2_exact` says the scale is exact, else None (past 2 ** 1023 too, where
    ``2.0 ** exponent`` itself raises)."""
    x = float(torch.tensor(x, dtype=dtype))  # a value of the dtype, as an eps or a factor is
    got = fold_math.pow2_scalar(x, exponent, dtype)
    if not fold_math.pow2_exact((abs(x), abs(x)), dtype, dtype, exponent):
        assert got is None
        return
    want = fold_math.scale_pow2(torch.tensor([x], dtype=dtype), exponent, dtype, "x")
    assert torch.equal(torch.tensor([got], dtype=dtype), want)
    weight = torch.tensor([[x, -x], [0.0, x]], dtype=dtype)
    product = fold_math.pow2_product(weight, exponent)
    if product is not None:
        assert torch.equal(product.materialize(), fold_math.scale_pow2(weight, exponent, dtype, "w"))
