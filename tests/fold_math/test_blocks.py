"""The blocks fold_math reads a weight in (``fold_math.index_blocks``): each has fewer elements than torch's grain
(``fold_math.BLOCK_ELEMENTS``), so no op on one goes to torch's intra-op thread pool, whatever the weight's shape
(rows longer than a block are read in pieces); and the results are bit for bit those of the whole tensor."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_scale_in_dtype import _outcome
from torch.overrides import TorchFunctionMode

from bnfold import fold_math
from bnfold.engine import range_planner

#: ops that compute nothing over their tensors' elements (shapes, views, allocation): they may see a whole weight
_NO_WORK = {
    "__get__",
    "__getitem__",
    "detach",
    "dim",
    "element_size",
    "empty",
    "empty_like",
    "expand",
    "is_contiguous",
    "numel",
    "permute",
    "reshape",
    "size",
    "stride",
    "view",
}


def test_the_block_is_torchs_grain():
    """``BLOCK_ELEMENTS`` is ``at::internal::GRAIN_SIZE`` of the torch installed (its C++ header, where the wheel
    ships it): ATen splits an op over more elements than that across threads, a reduction over a dim from it up."""
    header = Path(torch.__file__).parent / "include" / "ATen" / "TensorIterator.h"
    if not header.is_file():
        pytest.skip("torch's headers are not installed")
    found = re.search(r"GRAIN_SIZE\s*=\s*(\d+)", header.read_text())
    assert found and int(found.group(1)) == fold_math.BLOCK_ELEMENTS


class _Work(TorchFunctionMode):
    """The most elements an op that computes on them sees (an assignment: the elements it copies)."""

    def __init__(self):
        super().__init__()
        self.most: dict[str, int] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", str(func))
        if name not in _NO_WORK:
            seen = args[2:] if name == "__setitem__" else (*args, *kwargs.values(), out)
            n = max([t.numel() for t in seen if isinstance(t, torch.Tensor)], default=0)
            self.most[name] = max(self.most.get(name, 0), n)
        return out


@pytest.mark.parametrize("shape", [(64, 4096), (4, 70000), (1, 70000), (3, 2, 40000)])
@pytest.mark.parametrize("transposed", [False, True])
def test_no_op_on_a_weight_computes_on_a_grain_of_it(shape, transposed):
    """Every op the fold's product and checks, the float64 route, a product's stages, ``scale_pow2``, ``span`` and
    the retry screen run on a weight computes on fewer than ``BLOCK_ELEMENTS`` elements (before: whole rows, one
    row of 70000 at a time, and exactly 32768; a 64 x 131072 float32 weight's product and checks 378 ms against
    49 ms for 2048 x 4096 at load 4.6)."""
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    if transposed:
        w = w.T.contiguous().T if w.dim() == 2 else w.transpose(0, -1).contiguous().transpose(0, -1)
    per_row = (w.shape[0],) + (1,) * (w.dim() - 1)
    exact, inexact = torch.full(per_row, 0.75, dtype=torch.float64), torch.full(per_row, 0.1, dtype=torch.float64)
    with _Work() as work:
        fold_math.scale_weight(w, exact, torch.float32, "w")
        for _ in fold_math.scale_weight(w, exact, torch.float32, "w", True).stages():
            pass
        fold_math._check_cast_blocks(w, inexact, torch.float32, "w")
        fold_math.scale_pow2(w, 3, torch.float32, "w")
        range_planner.span(w)
        fold_math._magnitude_extremes(w, per_row)
    assert work.most and max(work.most.values()) < fold_math.BLOCK_ELEMENTS, work.most


@settings(max_examples=80, deadline=None)
@given(
    dims=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    block=st.integers(1, 300),
    transposed=st.booleans(),
    scale=st.sampled_from([0.1, 3.0, 1e5, 2.0**-20]),
    seed=st.integers(0, 1000),
)
def test_blocked_reads_are_the_whole_tensors(dims, dtype, block, transposed, scale, seed):
    """With blocks of ``block`` elements: the float64 route's checks and its rounded product, ``scale_pow2`` and
    ``span`` give what the whole tensor gives (values bit for bit, the same error word for word)."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(*dims, generator=g) * 10.0 ** torch.randint(-6, 6, dims, generator=g)).to(dtype)
    w.view(-1)[:: max(1, w.numel() // 3)] = 0.0
    if transposed and w.dim() > 1:
        w = w.transpose(0, -1).contiguous().transpose(0, -1)
    slices = torch.full((dims[0],) + (1,) * (len(dims) - 1), scale, dtype=torch.float64)
    whole_cast = _outcome(lambda: fold_math.cast_checked(w.to(torch.float64) * slices, dtype, "w"))
    whole_pow2 = _outcome(lambda: fold_math._scale_pow2(w, 7, dtype, "w"))
    whole_span = range_planner._span(w)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fold_math, "BLOCK_ELEMENTS", block)
        mp.setattr(range_planner, "BLOCK_ELEMENTS", block)
        mp.setattr(fold_math, "_POW2_CHUNK", max(1, block - 1))
        into = torch.empty_like(w)
        cast = _outcome(lambda: fold_math._check_cast_blocks(w, slices, dtype, "w", into) or into)
        pow2 = _outcome(lambda: fold_math.scale_pow2(w, 7, dtype, "w"))
        span = range_planner.span(w)
    for got, want in ((cast, whole_cast), (pow2, whole_pow2)):
        assert type(got) is type(want)
        assert got == want if isinstance(want, str) else torch.equal(_bits(got), _bits(want))
    assert span == whole_span


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bit patterns in row-major order (signed zeros apart)."""
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


@settings(max_examples=60, deadline=None)
@given(
    dims=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    stage=st.integers(1, 600),
    seed=st.integers(0, 1000),
)
def test_a_product_made_in_place_is_the_product(dims, dtype, stage, seed):
    """``Product.stages(in_place=True)`` (a streamed product made again over its weight read again) yields the
    bytes ``stages()`` yields, in order, each a view of the weight, which holds the whole product at the end."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(*dims, generator=g) * 10.0 ** torch.randint(-6, 6, dims, generator=g)).to(dtype)
    s = (torch.rand((dims[0],) + (1,) * (len(dims) - 1), generator=g) * 4).to(dtype)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fold_math, "STAGE_BYTES", stage)
        want = [_bits(p).clone() for p in fold_math.Product(w, s).stages()]
        again = w.clone()
        pieces = list(fold_math.Product(again, s).stages(in_place=True))
    assert [p.numel() for p in pieces] == [q.numel() for q in want]
    assert torch.equal(torch.cat([_bits(p) for p in pieces]), torch.cat(want))
    assert all(p.untyped_storage().data_ptr() == again.untyped_storage().data_ptr() for p in pieces)
    assert torch.equal(_bits(again), _bits(w * s))
