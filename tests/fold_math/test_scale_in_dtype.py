"""``fold_math.scale_weight`` in the weight's dtype against the float64 route (hypothesis): a float32, float16,
bfloat16 or float64 weight times per-channel scales (float64: deferred, its product is the float64 product). The
rule: the scales are rounded to the dtype and the product is taken in it, which is the float64 product of the weight
and the rounded scale rounded once (a product of two values of one of these dtypes is exact in float64), so the bits
are those whenever that product is finite and loses no nonzero weight; otherwise (or for scales the dtype cannot
hold, or a zero scale beside scales <= 1/2) the fold is the float64 route's: ``cast_checked`` of the float64
product, its bits or its refusal, word for word. Eager, deferred (``Product``) and spilled (``Spill``, the streamed
fold's scratch file) alike; subnormals, signed zeros, overflow, NaN, transposed weights (MatMul's ``[in, out]``) and
several blocks included."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bnfold import fold_math
from bnfold.errors import FoldError

INTS = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(INTS[t.dtype])


def _layout(t: torch.Tensor) -> list[tuple[int, int]]:
    """The strides that place elements: those of the dims longer than one (a dim of one element has any stride)."""
    return [(dim, stride) for dim, (n, stride) in enumerate(zip(t.shape, t.stride())) if n > 1]


def _span(dtype: torch.dtype) -> int:
    """Exponents drawn for weights and scales: a third of the dtype's range each way (their products mostly fit)."""
    return min(30, int(torch.finfo(dtype).max).bit_length() // 3)


def _weight(seed: int, dtype: torch.dtype, rows: int, cols: int, specials: int) -> torch.Tensor:
    """Random values over the dtype's range, with signed zeros, subnormals, values near the largest and the odd
    NaN at random places."""
    g = torch.Generator().manual_seed(seed)
    fi, e = torch.finfo(dtype), _span(dtype)
    w = torch.randn(rows, cols, generator=g, dtype=torch.float64) * 2.0 ** torch.randint(
        -e, e + 1, (rows, cols), generator=g
    )
    tiny = fi.smallest_normal * fi.eps  # the smallest subnormal
    edge = torch.tensor([0.0, -0.0, tiny, -3 * tiny, fi.smallest_normal / 2, fi.max / 3, -fi.max, float("nan")])
    picks = torch.randint(0, rows * cols, (specials,), generator=g)
    which = torch.randint(0, len(edge) - (seed % 4 != 0), (specials,), generator=g)  # NaN in a quarter of the cases
    w.view(-1)[picks] = edge[which].to(torch.float64)
    return w.to(dtype)


def _scales(seed: int, rows: int, dtype: torch.dtype) -> torch.Tensor:
    """Per-row scales: powers of two (exact in any dtype), values the dtype rounds, small ones (<= 1/2), negative
    ones; in a fifth of the cases also a zero (a pruned channel), in another one below every dtype's subnormals."""
    g = torch.Generator().manual_seed(seed + 1)
    e = _span(dtype)
    exact = 2.0 ** torch.randint(-e, e + 1, (rows,), generator=g).to(torch.float64)
    rough = torch.rand(rows, generator=g, dtype=torch.float64) * 2.5 + 0.1
    small = torch.rand(rows, generator=g, dtype=torch.float64) * 0.5
    values = torch.stack([exact, rough, small, -rough])[torch.randint(0, 4, (rows,), generator=g), torch.arange(rows)]
    if seed % 5 in (0, 1):  # a zero (the float64 route, beside small scales), or one no dtype holds (refused)
        values[int(torch.randint(0, rows, (1,), generator=g))] = 0.0 if seed % 5 == 0 else 1e-47
    return values.reshape(rows, 1)


class _Memory:
    """A ``fold_math.Spill`` into a list (blocks cloned: a block's buffer is reused)."""

    def __init__(self) -> None:
        self.blocks: list[torch.Tensor] = []
        self.ended: bool | None = None

    def write(self, block: torch.Tensor) -> None:
        self.blocks.append(block.clone())

    def done(self, ok: bool) -> object | None:
        self.ended = ok
        return torch.cat(self.blocks) if ok else None


def _outcome(call):
    try:
        return call()
    except FoldError as err:
        return str(err)


#: at most about this many blocks to a weight: a block is a step of Python (a 300 x 240 weight in blocks of one
#: element took 15 s); the blocks' paths (pieces of rows, whole rows, several) are the same on fewer of them
MAX_BLOCKS = 1024


@settings(max_examples=120, deadline=None)
@given(
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64]),
    rows=st.integers(1, 300),
    cols=st.integers(1, 240),
    specials=st.integers(0, 6),
    transposed=st.booleans(),
    seed=st.integers(0, 10_000),
    block=st.sampled_from([None, 1, 2, 7, 100, 1000]),
)
# a [2, 1] weight stored [1, 2]: its strides (1, 2); a float64 product is made eagerly as (1, 1), the same layout
@example(dtype=torch.float64, rows=2, cols=1, specials=0, transposed=True, seed=0, block=None)
def test_the_product_in_the_weights_dtype_is_the_float64_routes(dtype, rows, cols, specials, transposed, seed, block):
    """``block``: ``fold_math.BLOCK_ELEMENTS`` (None: as it is): blocks of pieces of rows, of whole rows, or one."""
    with pytest.MonkeyPatch.context() as mp:
        if block is not None:
            mp.setattr(fold_math, "BLOCK_ELEMENTS", block)
            cols = min(cols, max(1, MAX_BLOCKS * block // rows))
        _check_product(dtype, rows, cols, specials, transposed, seed)


def _check_product(dtype, rows, cols, specials, transposed, seed):
    w = _weight(seed, dtype, rows, cols, specials)
    if transposed:  # stored [in, out], folded as [out, in]
        w = _weight(seed, dtype, cols, rows, specials).T
    s = _scales(seed, rows, dtype)
    w64, sd = w.to(torch.float64), s.to(dtype)
    exact = w64 * sd.to(torch.float64)  # exact: two values of the dtype
    product = exact.to(dtype)  # rounded once
    small = bool(((sd != 0) & (sd.abs() <= 0.5)).any())
    in_dtype = (
        not bool(((sd == 0) & (s != 0)).any())
        and bool(torch.isfinite(sd).all())
        and bool(torch.isfinite(product).all())
        and not bool(((product == 0) & (exact != 0)).any())
        and not (small and bool((sd == 0).any()))
    )
    whole = _outcome(lambda: fold_math.cast_checked(w64 * s, dtype, "linear weight"))
    expected = product if in_dtype else whole

    eager = _outcome(lambda: fold_math.scale_weight(w, s, dtype, "linear weight"))
    deferred = _outcome(lambda: fold_math.scale_weight(w, s, dtype, "linear weight", deferred=True))
    spills: list[_Memory] = []
    spilled = _outcome(
        lambda: fold_math.scale_weight(
            w, s, dtype, "linear weight", deferred=lambda n: spills.append(_Memory()) or spills[-1]
        )
    )
    if isinstance(expected, str):
        assert eager == deferred == spilled == expected
        assert all(sp.ended is False for sp in spills)  # what was spilled is dropped
        return
    assert isinstance(eager, torch.Tensor) and _layout(eager) == _layout(w)
    assert torch.equal(_bits(eager), _bits(expected))  # signed zeros and subnormals bit for bit
    stored = expected.T if transposed else expected  # the weight's memory order: as stored
    for got in (deferred, spilled):  # deferred by either route (the float64 one too: made whole before)
        assert isinstance(got, fold_math.Product) and got.wide == (not in_dtype and dtype != torch.float64)
        assert torch.equal(_bits(got.materialize()), _bits(expected))
        if not got.wide:
            continue  # the in-dtype route's stages: one mul a block, as materialize (the spilled one's below)
        made = torch.cat([p.clone() for p in got.stages()])  # each piece a view of one stage
        assert torch.equal(_bits(made), _bits(expected).reshape(-1))
        kept = got.T if transposed else got  # as the streamed save makes it: over the stored weight read again
        own = fold_math.Product(kept.weight.clone(), kept.s)
        list(own.stages(in_place=True))  # made over its own memory
        assert torch.equal(_bits(own.weight), _bits(stored))
    if spilled.spilled is not None:
        assert spills[-1].ended is True and all(sp.ended is False for sp in spills[:-1])  # the route's own
        assert torch.equal(_bits(spilled.spilled), _bits(stored).reshape(-1))
        assert torch.equal(
            _bits(torch.cat([b.clone() for b in (spilled.T if transposed else spilled).stages()])),
            _bits(stored).reshape(-1),
        )


def _edge_case(dtype: torch.dtype, edge: str, step: int, same_row: bool, seed: int):
    """A weight and scales whose extreme pair sits ``step`` units in the last place from a rounding edge of
    ``dtype``: ``overflow``, a weight of max/4 times a scale of 4(1 + step eps) (fits up to step 0); ``underflow``,
    the smallest subnormal times 1/2 (1 + step eps) beside no zero weight (nonzero from step 1).  ``same_row``:
    the two meet in the product; else they are in different rows (the bound cannot tell, the product is made)."""
    g = torch.Generator().manual_seed(seed)
    fi = torch.finfo(dtype)
    rows, cols = 8, 40
    w = (torch.rand(rows, cols, generator=g, dtype=torch.float64) + 0.5).to(dtype)  # no zero weight
    s = torch.rand(rows, 1, generator=g, dtype=torch.float64) * 0.3 + (0.6 if edge == "overflow" else 0.1)
    tiny = fi.smallest_normal * fi.eps
    top, scale = (fi.max / 4, 4.0) if edge == "overflow" else (tiny, 0.5)
    w[0, 3] = top
    s[0 if same_row else 1, 0] = scale * (1 + step * fi.eps)
    return w, s.to(dtype).to(torch.float64)


@settings(max_examples=80, deadline=None)
@given(
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64]),
    edge=st.sampled_from(["overflow", "underflow"]),
    step=st.integers(-2, 2),
    same_row=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_a_deferred_products_checks_told_from_the_extremes_agree_at_the_rounding_edges(
    dtype, edge, step, same_row, seed
):
    """A deferred product's checks tell a pass from the weight's and the scales' extremes (``fold_math._bounded``),
    making no product; at the edges of the dtype's range that tells exactly what the eager product's checks tell:
    the same bits, or the same refusal word for word."""
    w, s = _edge_case(dtype, edge, step, same_row, seed)
    eager = _outcome(lambda: fold_math.scale_weight(w, s, dtype, "linear weight"))
    deferred = _outcome(lambda: fold_math.scale_weight(w, s, dtype, "linear weight", deferred=True))
    if isinstance(eager, str):
        assert deferred == eager
        return
    made = deferred.materialize() if isinstance(deferred, fold_math.Product) else deferred  # a tensor: made to check
    assert torch.equal(_bits(made), _bits(eager))


@pytest.mark.parametrize("small", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_a_deferred_product_whose_extremes_fit_is_not_made_by_its_checks(monkeypatch, dtype, small):
    """Where the extremes' product fits (the largest weight times the largest scale at the dtype's max; with
    ``small`` scales <= 1/2, whose least times the least weight is nonzero), the checks of a deferred product
    make none of it (a streamed weight is read and reduced once, its product made where it is written): the
    product's block checks are never called, and the product is the eager one's bits."""
    w, s = _edge_case(dtype, "overflow", 0, True, 0)
    if small:
        s = (s / 8).to(dtype).to(torch.float64)  # every scale <= 1/2, weights >= 1/2 (none subnormal)
    eager = fold_math.scale_weight(w, s, dtype, "linear weight")

    def made(*args, **kwargs):
        raise AssertionError("the product was made to check it")

    monkeypatch.setattr(fold_math, "_checked_blocks", made)
    deferred = fold_math.scale_weight(w, s, dtype, "linear weight", deferred=True)
    assert isinstance(deferred, fold_math.Product)
    assert torch.equal(_bits(deferred.materialize()), _bits(eager))
