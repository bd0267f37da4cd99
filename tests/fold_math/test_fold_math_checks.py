"""The fold math's range checks decide element by element: a folded weight or bias is refused, or takes the float64
path, exactly where one of its elements (or of the scales) is not finite, underflows or is zero, whichever of its
reductions decides it.  Drawn tensors full of the values that matter (zeros of both signs, subnormals, values at
the edge of the dtype's range, NaN, inf) against the checks written out element by element."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bnfold import fold_math
from bnfold.errors import FoldError

SETTINGS = settings(max_examples=150, deadline=None)
DTYPES = st.sampled_from([torch.float32, torch.float16, torch.bfloat16])
SPECIAL = [0.0, -0.0, 1e-300, 1e-42, 6e-8, 1e-5, 0.25, 0.5, 0.75, 1.0, -3.0, 7e4, 1e39, math.inf, -math.inf, math.nan]
VALUES = st.one_of(st.sampled_from(SPECIAL), st.floats(-4.0, 4.0))


def _outcome(fn, *args):
    try:
        return fn(*args)
    except FoldError as err:
        return f"{err.code}: {err}"


def _same(a, b) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.view(-1).view(torch.int8), b.view(-1).view(torch.int8))
    )


def _cast_reference(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    out = value.to(dtype)
    if not bool(torch.isfinite(out).all()):
        raise fold_math._overflow("w", dtype, value.abs().max().item())
    lost = int(((out == 0) & (value != 0)).sum())
    if lost:
        raise fold_math._underflow("w", dtype, lost)
    return out


def _scale_reference(w: torch.Tensor, slices: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The product in the weight's dtype where every check passes element by element, else the float64 product
    rounded once (its refusal where it has one)."""
    s = slices.to(dtype)
    product = w * s
    small = bool(((s != 0) & (s.abs() <= 0.5)).any())
    lost = (
        small and bool((product == 0).any()) and (bool((s == 0).any()) or bool((product != 0).sum() != (w != 0).sum()))
    )
    takes_float64 = bool(((s == 0) & (slices != 0)).any()) or not bool(torch.isfinite(s).all())
    if takes_float64 or lost or not bool(torch.isfinite(product).all()):
        return _cast_reference(w.to(torch.float64) * slices, dtype)
    return product


@SETTINGS
@given(st.lists(VALUES, min_size=1, max_size=6), DTYPES)
def test_cast_checked_refuses_exactly_what_an_element_by_element_check_refuses(values, dtype):
    value = torch.tensor(values, dtype=torch.float64)
    assert _same(_outcome(fold_math.cast_checked, value, dtype, "w"), _outcome(_cast_reference, value, dtype))


@SETTINGS
@given(st.lists(VALUES, min_size=6, max_size=6), st.lists(VALUES, min_size=3, max_size=3), DTYPES, st.booleans())
def test_scale_weight_takes_the_float64_path_exactly_where_an_element_check_says(weights, scales, dtype, deferred):
    w = torch.tensor(weights, dtype=torch.float64).to(dtype).reshape(3, 2)
    slices = torch.tensor(scales, dtype=torch.float64).reshape(3, 1)
    got = _outcome(fold_math.scale_weight, w, slices, dtype, "w", deferred)
    if isinstance(got, fold_math.Product):
        got = got.materialize()
    assert _same(got, _outcome(_scale_reference, w, slices, dtype))


def _bn_reference(mean, var, eps, gamma, beta):
    for name, t in zip(("running_mean", "running_var", "weight", "bias"), (mean, var, gamma, beta)):
        if not bool(torch.isfinite(t.double()).all()):
            raise FoldError(f"{name} holds NaN or inf", fold_math.Code.NOT_FINITE)
    denom = var.double() + eps
    if not bool((denom > 0).all()):
        raise FoldError(
            f"running_var + eps <= 0 (eps={eps:g}); the normalization is undefined", fold_math.Code.UNDEFINED
        )
    scale = gamma.double() / torch.sqrt(denom)
    return torch.cat((scale, beta.double() - mean.double() * scale))


@SETTINGS
@given(st.lists(VALUES, min_size=8, max_size=8), st.sampled_from([1e-5, 0.0, -1e-3, math.nan]), DTYPES)
def test_batch_norm_affine_checks_every_statistic(values, eps, dtype):
    mean, var, gamma, beta = torch.tensor(values, dtype=torch.float64).to(dtype).reshape(4, 2)

    def affine(*args):
        aff = fold_math.batch_norm_affine(*args)
        return torch.cat((aff.scale, aff.shift))

    assert _same(_outcome(affine, mean, var, eps, gamma, beta), _outcome(_bn_reference, mean, var, eps, gamma, beta))
