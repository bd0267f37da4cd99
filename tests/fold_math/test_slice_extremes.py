"""The retry path's per-slice summaries of a weight (``fold_math._slice_extremes``): the least and largest ``|w|``
over each slice of a scale, read a block at a time.  Bit for bit the whole-weight formula (``|w|.amin/amax`` over
the scale's broadcast dims, cast to float64) on any shape, scale shape, dtype and memory layout, NaN, inf and signed
zeros included; and no temporary of the weight's size is made beside the weight."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bnfold import fold_math

SPECIAL = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-45, 65504.0, 3e38]


def _old(weight: torch.Tensor, shape: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    dims = [d for d in range(weight.dim()) if shape[d] == 1 and weight.shape[d] != 1]
    mag = weight.detach().abs()
    least = mag.amin(dim=dims, keepdim=True) if dims else mag
    most = mag.amax(dim=dims, keepdim=True) if dims else mag
    return least.to(torch.float64), most.to(torch.float64)


def _extremes(weight: torch.Tensor, shape: tuple):
    with fold_math.screened():
        assert fold_math._slice_extremes(weight, shape) is None  # the first product of a weight: no summary
        return fold_math._slice_extremes(weight, shape)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


@settings(max_examples=150, deadline=None)
@given(
    dims=st.lists(st.integers(1, 7), min_size=0, max_size=4),
    keep=st.lists(st.booleans(), min_size=4, max_size=4),
    dtype=st.sampled_from([torch.float64, torch.float32, torch.float16, torch.bfloat16]),
    block=st.sampled_from([1, 3, 8, 64, 1 << 15]),
    transpose=st.booleans(),
    specials=st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(SPECIAL)), max_size=6),
    seed=st.integers(0, 2**16),
)
def test_blocked_summaries_equal_the_whole_weight_formula(dims, keep, dtype, block, transpose, specials, seed):
    g = torch.Generator().manual_seed(seed)
    w = (
        torch.randn(tuple(dims), generator=g, dtype=torch.float64)
        * 10.0 ** torch.randint(-8, 8, tuple(dims), generator=g)
    ).to(dtype)
    flat = w.view(-1)
    for i, v in specials:
        if flat.numel():
            flat[i % flat.numel()] = v
    if transpose and w.dim() >= 2:
        w = w.transpose(0, -1)  # a transposed weight, as MatMul stores it
    shape = tuple(n if k else 1 for n, k in zip(w.shape, keep))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fold_math, "BLOCK_ELEMENTS", block)
        least, most = _extremes(w, shape)
    old = _old(w, shape)
    assert _same(least, old[0]) and _same(most, old[1])


def test_no_whole_weight_temporary():
    """A 16 MiB float32 weight's per-row summaries: torch's profiler sees no allocation of a tenth of it (the whole
    ``abs`` copy before: 16 MiB), and the values are the old formula's."""
    from torch.profiler import ProfilerActivity, profile

    w = torch.randn(1024, 4096)
    with fold_math.screened():
        fold_math._slice_extremes(w, (1024, 1))
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            least, most = fold_math._slice_extremes(w, (1024, 1))
    largest = max(e.cpu_memory_usage for e in prof.events())
    assert largest < w.nbytes // 10, largest
    old = _old(w, (1024, 1))
    assert torch.equal(least, old[0]) and torch.equal(most, old[1])
