"""Re-parameterization math (``bnfold.fold_math``, issue 21), against running the branches in float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from bnfold import fold_math
from bnfold.errors import FoldError

FAST = settings(max_examples=25, deadline=None)


def _bn(c: int, g: torch.Generator) -> fold_math.Affine:
    mean, var = torch.randn(c, generator=g), torch.rand(c, generator=g) + 0.5
    gamma, beta = torch.randn(c, generator=g), torch.randn(c, generator=g)
    return fold_math.batch_norm_affine(mean, var, 1e-5, gamma, beta)


def _apply(x, aff):
    return x * aff.scale.reshape(1, -1, 1, 1) + aff.shift.reshape(1, -1, 1, 1)


def _close(a, b):
    assert (a - b).abs().max().item() <= 1e-12 * max(1.0, b.abs().max().item())


@FAST
@given(per_group=st.integers(1, 3), groups=st.integers(1, 3), k=st.sampled_from([1, 3, 5]), seed=st.integers(0, 99))
def test_identity_bn_is_a_grouped_conv(per_group, groups, k, seed):
    g = torch.Generator().manual_seed(seed)
    c = per_group * groups
    x = torch.randn(2, c, 6, 5, generator=g, dtype=torch.float64)
    aff = _bn(c, g)
    p = k // 2
    ident = fold_math.embed_kernel(
        fold_math.identity_kernel(c, groups, 2),
        (k, k),
        fold_math.kernel_offsets((1, 1), ((0, 0), (0, 0)), (k, k), ((p, p), (p, p)), (1, 1)),
    )
    w, b = fold_math.scale_branch(ident, None, aff)
    _close(F.conv2d(x, w, b, padding=p, groups=groups), _apply(x, aff))


@FAST
@given(
    small=st.sampled_from([(1, 1), (1, 3), (3, 1), (3, 3)]),
    stride=st.integers(1, 2),
    dilation=st.integers(1, 2),
    groups=st.sampled_from([1, 2]),
    seed=st.integers(0, 99),
)
def test_small_kernels_pad_to_the_big_one_when_paddings_align(small, stride, dilation, groups, seed):
    g = torch.Generator().manual_seed(seed)
    cin, cout, big = 4, 6, (3, 3)
    x = torch.randn(1, cin, 9, 8, generator=g, dtype=torch.float64)
    w_big = torch.randn(cout, cin // groups, *big, generator=g, dtype=torch.float64)
    w_small = torch.randn(cout, cin // groups, *small, generator=g, dtype=torch.float64)
    b1, b2 = torch.randn(cout, generator=g, dtype=torch.float64), torch.randn(cout, generator=g, dtype=torch.float64)
    p_big = (dilation, dilation)
    p_small = tuple(pb - (kb - ks) * dilation // 2 for pb, kb, ks in zip(p_big, big, small))
    a1, a2 = _bn(cout, g), _bn(cout, g)
    kw = dict(stride=stride, dilation=dilation, groups=groups)
    ref = _apply(F.conv2d(x, w_big, b1, padding=p_big, **kw), a1) + _apply(
        F.conv2d(x, w_small, b2, padding=p_small, **kw), a2
    )
    offsets = fold_math.kernel_offsets(
        small, tuple((p, p) for p in p_small), big, tuple((p, p) for p in p_big), (dilation,) * 2
    )
    w, b = fold_math.sum_branches(
        [
            fold_math.scale_branch(w_big, b1, a1),
            fold_math.scale_branch(fold_math.embed_kernel(w_small, big, offsets), b2, a2),
        ]
    )
    _close(F.conv2d(x, w, b, padding=p_big, **kw), ref)


@pytest.mark.parametrize(
    "small, pads_small, dilation",
    [((1, 1), ((1, 1), (1, 1)), (1, 1)), ((1, 3), ((0, 0), (0, 0)), (1, 1)), ((1, 1), ((0, 0), (0, 0)), (2, 2))],
)
def test_misaligned_padding_is_refused(small, pads_small, dilation):
    with pytest.raises(FoldError, match="padding does not align"):
        fold_math.kernel_offsets(small, pads_small, (3, 3), ((1, 1), (1, 1)), dilation)


@FAST
@given(k=st.integers(1, 3), stride=st.integers(1, 3), groups=st.sampled_from([1, 2, 4]), seed=st.integers(0, 99))
def test_avg_pool_then_bn_is_a_conv(k, stride, groups, seed):
    g = torch.Generator().manual_seed(seed)
    c = 4
    p = k // 2
    x = torch.randn(2, c, 7, 6, generator=g, dtype=torch.float64)
    aff = _bn(c, g)
    ref = _apply(F.avg_pool2d(x, k, stride, p, count_include_pad=True), aff)
    w, b = fold_math.scale_branch(fold_math.avg_pool_kernel(c, groups, (k, k)), None, aff)
    _close(F.conv2d(x, w, b, stride=stride, padding=p, groups=groups), ref)


def test_sum_branches_rejects_mismatched_shapes():
    with pytest.raises(FoldError, match="shapes"):
        fold_math.sum_branches([(torch.zeros(2, 2, 3, 3), None), (torch.zeros(2, 2, 1, 1), None)])
