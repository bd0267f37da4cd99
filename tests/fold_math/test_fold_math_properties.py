"""The fold math's own properties (hypothesis, float64): folding a per-channel affine into a conv,
a grouped transposed conv or a linear layer, on its output or its input side, computes what applying
the affine explicitly computes.  No graph, no export: hundreds of examples in a few seconds."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from bnfold import fold_math
from bnfold.errors import FoldError
from bnfold.report import Code

SETTINGS = settings(max_examples=80, deadline=None)


def _t(seed: int, *shape, lo=-1.0, hi=1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, generator=g, dtype=torch.float64) * (hi - lo) + lo


def _affine(seed: int, c: int, shift: bool = True) -> fold_math.Affine:
    scale = _t(seed, c, lo=0.2, hi=2.0) * torch.where(_t(seed + 1, c) > 0, 1.0, -1.0).to(torch.float64)
    return fold_math.Affine(scale, _t(seed + 2, c) if shift else torch.zeros(c, dtype=torch.float64))


def _apply(x: torch.Tensor, aff: fold_math.Affine, axis: int = 1) -> torch.Tensor:
    shape = [1] * x.dim()
    shape[axis] = -1
    return x * aff.scale.reshape(shape) + aff.shift.reshape(shape)


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    scale = 1.0 + b.abs().max().item()
    assert (a - b).abs().max().item() <= 1e-10 * scale, (a - b).abs().max()


# (layer kind, forward, weight shape, channels on each side) for random sizes
def _layer(kind: str, groups: int, cin_g: int, cout_g: int, k: int):
    cin, cout = cin_g * groups, cout_g * groups
    if kind == "conv":
        return (cout, cin_g, k, k), cin, cout, lambda x, w, b: F.conv2d(x, w, b, groups=groups)
    if kind == "conv_transpose":
        return (cin, cout_g, k, k), cin, cout, lambda x, w, b: F.conv_transpose2d(x, w, b, groups=groups)
    return (cout, cin), cin, cout, lambda x, w, b: F.linear(x, w, b)


LAYERS = st.tuples(
    st.sampled_from(["conv", "conv_transpose", "linear"]),
    st.integers(1, 3),  # groups
    st.integers(1, 4),  # input channels per group
    st.integers(1, 4),  # output channels per group
    st.integers(1, 3),  # kernel
    st.integers(0, 10_000),  # seed
    st.booleans(),  # bias
)


def _drawn(params):
    """A drawn layer: its kind, groups, seed, weight shape, channels, forward, weight, bias and an input."""
    kind, groups, cin_g, cout_g, k, seed, has_bias = params
    if kind == "linear":
        groups = 1
    shape, cin, cout, forward = _layer(kind, groups, cin_g, cout_g, k)
    w, b = _t(seed, *shape), _t(seed + 3, cout) if has_bias else None
    x = _t(seed + 4, 2, cin, 5, 5) if kind != "linear" else _t(seed + 4, 3, cin)
    return kind, groups, seed, shape, cin, cout, forward, w, b, x


@SETTINGS
@given(LAYERS)
def test_output_side_fold_equals_the_explicit_affine(params):
    kind, groups, seed, shape, cin, cout, forward, w, b, x = _drawn(params)
    aff = _affine(seed + 5, cout)
    assert fold_math.out_channels(kind, shape, groups) == cout
    new_w, new_b = fold_math.fold_output_affine(w, b, aff, kind, groups)
    _close(forward(x, new_w, new_b), _apply(forward(x, w, b), aff))


@SETTINGS
@given(LAYERS)
def test_input_side_fold_equals_the_explicit_affine(params):
    kind, groups, seed, shape, cin, cout, forward, w, b, x = _drawn(params)
    shift = kind != "conv_transpose"  # a shift before a transposed conv never folds (tested below)
    aff = _affine(seed + 5, cin, shift=shift)
    assert fold_math.in_channels(kind, shape, groups) == cin
    new_w, new_b = fold_math.fold_input_affine(w, b, aff, kind, groups, shift_exact=True)
    _close(forward(x, new_w, new_b), forward(_apply(x, aff), w, b))


@SETTINGS
@given(st.integers(0, 10_000), st.floats(1e-6, 1e-1))
def test_batch_norm_affine_is_the_eval_formula(seed, eps):
    c = 5
    mean, var = _t(seed, c), _t(seed + 1, c, lo=0.0, hi=3.0)
    gamma, beta = _t(seed + 2, c), _t(seed + 3, c)
    x = _t(seed + 4, 2, c, 3)
    ref = F.batch_norm(x, mean, var, gamma, beta, training=False, eps=eps)
    _close(_apply(x, fold_math.batch_norm_affine(mean, var, eps, gamma, beta)), ref)


def test_a_shift_before_a_transposed_or_padded_conv_is_refused_with_its_code():
    aff = _affine(0, 4)
    with pytest.raises(FoldError) as err:
        fold_math.fold_input_affine(_t(1, 4, 2, 3, 3), None, aff, "conv_transpose")
    assert err.value.code == Code.SHIFT_TRANSPOSED
    with pytest.raises(FoldError) as err:
        fold_math.fold_input_affine(_t(1, 2, 4, 3, 3), None, aff, "conv", shift_exact=False)
    assert err.value.code == Code.SHIFT_PADDING


@pytest.mark.parametrize("count", [fold_math.out_channels, fold_math.in_channels])
def test_groups_that_do_not_divide_the_weight_are_a_fold_error_with_a_code(count):
    with pytest.raises(FoldError) as err:
        count("conv", (8, 8, 1, 1), 3)  # a layer reporting groups=3 on 8 channels
    assert err.value.code == Code.LAYER_SHAPE


def test_a_cast_out_of_range_is_a_fold_error_with_a_code():
    with pytest.raises(FoldError) as err:
        fold_math.cast_checked(torch.tensor([1e39], dtype=torch.float64), torch.float32, "w")
    assert err.value.code == Code.CAST_RANGE
    with pytest.raises(FoldError) as err:
        fold_math.cast_checked(torch.tensor([1e-50], dtype=torch.float64), torch.float32, "w")
    assert err.value.code == Code.CAST_RANGE


@pytest.mark.parametrize("size", [(48, 32), (300, 256)])  # one block; several blocks of a [in, out] weight
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", ["plain", "underflow", "overflow", "nan"])
def test_a_transposed_weight_scales_to_the_same_bits_and_errors(dtype, case, size):
    """``scale_weight`` reads a transposed weight (MatMul's ``[in, out]`` seen as ``[out, in]``) in memory
    order for its checks: the product, its layout, and each refusal are those of the contiguous weight; a
    deferred product (``fold_math.Product``, made block by block where it is written) has the same bytes, in
    the stored layout too, and the same refusals (before anything is made)."""
    stored = _t(3, *size).to(dtype)  # [in, out] as stored
    scale = _t(4, size[1], lo=0.5, hi=2.0)
    if case == "underflow":
        tiny = torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps  # the smallest subnormal
        stored[-5, 7] = 4 * tiny  # that a scale of 2^-8 takes to zero
        stored[-5, 8] = 0.0
        scale[7] = 2.0**-8
    if case == "overflow":
        stored[-2, 3] = torch.finfo(dtype).max / 2
        scale[3] = 4.0
    if case == "nan":
        stored[-9, 1] = float("nan")
    w = stored.T  # [out, in], not contiguous
    slices = fold_math.per_slice(scale, "linear", "out", tuple(w.shape))
    outcomes = []
    for weight, deferred in ((w, False), (w.contiguous(), False), (w, True)):
        try:
            outcomes.append(fold_math.scale_weight(weight, slices, dtype, "linear weight", deferred))
        except FoldError as err:
            outcomes.append(str(err))
    if case == "plain":
        eager, product = outcomes[0], outcomes[2]
        assert torch.equal(eager, outcomes[1]) and eager.stride() == w.stride()
        assert isinstance(product, fold_math.Product) and product.shape == w.shape and product.dtype == dtype
        # each stage is a view of one buffer, valid until the next is made: cloned as it comes
        assert torch.equal(torch.cat([b.clone() for b in product.stages()]), eager.contiguous().reshape(-1))
        assert torch.equal(
            torch.cat([b.clone() for b in product.T.stages()]), eager.T.contiguous().reshape(-1)
        )  # as stored
        assert torch.equal(product.materialize(), eager)
    else:  # the refusal made block by block is cast_checked's on the whole float64 product
        with pytest.raises(FoldError) as whole:
            fold_math.cast_checked(w.to(torch.float64) * slices, dtype, "linear weight")
        assert outcomes[0] == outcomes[1] == outcomes[2] == str(whole.value), outcomes


@pytest.mark.parametrize("deferred", [False, True])
def test_a_zero_scale_beside_small_ones_folds_to_the_float64_products_bits(deferred):
    """A pruned channel (scale 0) beside scales <= 1/2: the checked product in the weight's dtype cannot tell a lost
    weight from a zeroed one, so the fold takes the float64 product, rounded once.  It is made a block at a time
    (the streamed fold held it whole in float64); the bits are cast_checked's of the whole product.  Deferred, it
    is a Product made again by that route where it is written (before, made whole beside the weight): its stages,
    made over a copy of the weight in place or in a stage of their own, and the whole are those bits."""
    from bnfold.fold_math import Product, cast_checked, scale_weight

    gen = torch.Generator().manual_seed(0)
    w = torch.randn(300, 256, generator=gen)  # several blocks
    s = torch.rand(300, 1, generator=gen, dtype=torch.float64) + 0.1
    s[3] = 0.0
    whole = cast_checked(w.to(torch.float64) * s, torch.float32, "linear weight")
    got = scale_weight(w, s, torch.float32, "linear weight", deferred=deferred)
    if deferred:
        assert isinstance(got, Product) and got.wide
        assert torch.equal(torch.cat([p.clone() for p in got.stages()]), whole.reshape(-1))  # views of one stage
        own = Product(w.clone(), got.s)
        assert torch.equal(torch.cat([p.clone() for p in own.stages(in_place=True)]), whole.reshape(-1))
        assert torch.equal(own.weight, whole)  # made over the weight's own memory
        got = got.materialize()
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    assert torch.equal(got, whole)
    assert not got[3].any()
