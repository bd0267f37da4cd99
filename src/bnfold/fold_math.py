"""Fold math: pure tensor functions, no graphs.

Every frontend (torch.export, ExecuTorch edge, nn.Module, ONNX) calls these
functions and none repeats them.  All arithmetic runs in float64; results are
cast back to the parameter's dtype with overflow and underflow checks.

A per-channel affine is ``y = x * scale + shift`` along one channel axis.
A batch normalization in eval mode is such an affine with
``scale = gamma / sqrt(var + eps)`` and ``shift = beta - mean * scale``.

Weight layouts (``kind``):

* ``"conv"``            weight ``[out, in/groups, *k]``
* ``"conv_transpose"``  weight ``[in, out/groups, *k]``; element ``[i, j]``
  belongs to output channel ``(i // (in/groups)) * (out/groups) + j``
* ``"linear"``          weight ``[out, in]``
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Protocol

import torch

from .errors import FoldError
from .kinds import LAYER_KINDS as KINDS
from .report import Code

CHANNELS = Code.CHANNEL_MISMATCH

#: the dtypes whose tensors CPU ``aminmax`` reduces (not the float8 ones)
_MINMAX_DTYPES = frozenset((torch.float16, torch.bfloat16, torch.float32, torch.float64))


@dataclass(frozen=True)
class Affine:
    """A per-channel affine ``x * scale + shift`` in float64 (1-D tensors; :func:`batch_norm_affines`, for
    analysis only, gives several at once: leading dims, channels last)."""

    scale: torch.Tensor
    shift: torch.Tensor

    @property
    def channels(self) -> int:
        return self.scale.numel()

    def then(self, other: Affine) -> Affine:
        """The affine that applies ``self`` first and ``other`` after it."""
        return Affine(self.scale * other.scale, self.shift * other.scale + other.shift)


def _f64(t) -> torch.Tensor:
    return torch.as_tensor(t).detach().to(torch.float64).reshape(-1)


def batch_norm_affine(mean, var, eps: float, weight=None, bias=None) -> Affine:
    """The affine an eval-mode batch norm applies, with validity checks."""
    stats = _stacked_f64(mean, var, weight, bias)
    if stats is None:
        mean, var = _f64(mean), _f64(var)
        if mean.shape != var.shape:
            raise FoldError(f"running_mean has {mean.numel()} channels but running_var has {var.numel()}", CHANNELS)
        c = mean.numel()
        gamma = torch.ones(c, dtype=torch.float64) if weight is None else _f64(weight)
        beta = torch.zeros(c, dtype=torch.float64) if bias is None else _f64(bias)
        if gamma.numel() != c or beta.numel() != c:
            raise FoldError(
                f"affine weight/bias have {gamma.numel()}/{beta.numel()} channels, statistics have {c}", CHANNELS
            )
        stats = torch.stack((mean, var, gamma, beta))
    mean, var, gamma, beta = stats.unbind()
    eps = float(eps)
    if not _all_finite(stats):  # one check for all four; name the culprit only on failure
        for name, t in zip(("running_mean", "running_var", "weight", "bias"), stats):
            if not bool(torch.isfinite(t).all()):
                raise FoldError(f"{name} holds NaN or inf", Code.NOT_FINITE)
    denom = var + eps
    if denom.numel() and not float(denom.amin()) > 0:  # NaN (an eps of NaN) is not > 0 either
        raise FoldError(f"running_var + eps <= 0 (eps={eps:g}); the normalization is undefined", Code.UNDEFINED)
    scale = gamma / torch.sqrt(denom)
    return Affine(scale, beta - mean * scale)


def _stacked_f64(mean, var, weight, bias) -> torch.Tensor | None:
    """``[mean, var, weight, bias]`` as the rows of one float64 tensor, made in one cast (the values exact, as
    :func:`_f64` makes them one by one) where the four are 1-D tensors of one shape and dtype; else None."""
    four = (mean, var, weight, bias)
    if not all(isinstance(t, torch.Tensor) and t.dim() == 1 for t in four):
        return None
    if any(t.shape != mean.shape or t.dtype != mean.dtype for t in four):
        return None
    return torch.stack(four).detach().to(torch.float64)


def _all_finite(t: torch.Tensor) -> bool:
    """Whether every element of ``t`` is finite, in one reduction where it can (NaN propagates through ``amax``)."""
    if t.numel() and t.dtype in _MINMAX_DTYPES:
        return math.isfinite(float(t.abs().amax()))
    return bool(torch.isfinite(t).all())


def batch_norm_affines(mean, var, eps, weight=None, bias=None) -> Affine:
    """:func:`batch_norm_affine` per channel without its checks, for analysis of many normalizations at once (the
    audit's risk model): ``eps`` per channel or one float.  The per-channel arguments broadcast against each
    other (channels last), so leading dims compute several affines in each op (the risk model: a row per eps,
    and a bare row of weight 1 and bias 0); the affine's tensors have their broadcast shape.  Where the
    statistics do not define the affine (values not finite, ``var + eps <= 0``) its values are whatever IEEE
    arithmetic makes of them: the caller tells where (the risk model: per normalization, from the statistics'
    extremes).  Folding uses the checked :func:`batch_norm_affine`, the same arithmetic."""
    f64 = lambda t: torch.as_tensor(t).detach().to(torch.float64)  # noqa: E731 - any shape, unlike _f64
    mean, var = f64(mean), f64(var)
    gamma = torch.ones_like(mean) if weight is None else f64(weight)
    beta = torch.zeros_like(mean) if bias is None else f64(bias)
    scale = gamma / torch.sqrt(var + (f64(eps) if isinstance(eps, torch.Tensor) else float(eps)))
    return Affine(scale, beta - mean * scale)


def affine(scale, shift, channels: int) -> Affine:
    """An affine from scalar or per-channel ``scale``/``shift`` (``None`` = identity)."""
    s = torch.ones(1, dtype=torch.float64) if scale is None else _f64(scale)
    t = torch.zeros(1, dtype=torch.float64) if shift is None else _f64(shift)
    for name, v in (("scale", s), ("shift", t)):
        if v.numel() not in (1, channels):
            raise FoldError(f"{name} has {v.numel()} elements, expected 1 or {channels} channels", CHANNELS)
        if not torch.isfinite(v).all():
            raise FoldError(f"{name} holds NaN or inf", Code.NOT_FINITE)
    return Affine(s.expand(channels).clone(), t.expand(channels).clone())


#: The elementwise binary ops an affine chain is made of, as ``x * scale + shift``
#: of the tensor ``x`` and a constant ``c``: ``(op, x is the first operand) ->
#: (scale, shift)`` given ``c`` and the op's ``alpha`` (the multiplier torch's
#: add/sub/rsub apply to their second operand; 1 elsewhere).  ``c / x`` is absent:
#: it is not affine.  A frontend maps its op spellings to these names.
BINARY_AFFINES = {
    ("mul", True): lambda c, alpha: (c, None),
    ("mul", False): lambda c, alpha: (c, None),
    ("div", True): lambda c, alpha: (1.0 / c, None),
    ("add", True): lambda c, alpha: (None, alpha * c),  # x + alpha * c
    ("add", False): lambda c, alpha: (torch.tensor(alpha, dtype=torch.float64), c),  # c + alpha * x
    ("sub", True): lambda c, alpha: (None, -alpha * c),  # x - alpha * c
    ("sub", False): lambda c, alpha: (torch.tensor(-alpha, dtype=torch.float64), c),  # c - alpha * x
    ("rsub", True): lambda c, alpha: (torch.tensor(-alpha, dtype=torch.float64), c),  # rsub(x, c) = c - alpha * x
    ("rsub", False): lambda c, alpha: (None, -alpha * c),  # rsub(c, x) = x - alpha * c
}


def binary_affine(op: str, const, x_first: bool, channels: int, alpha: float = 1.0) -> Affine:
    """The affine ``op`` applies to ``x`` with the scalar or per-channel constant ``const``."""
    rule = BINARY_AFFINES.get((op, x_first))
    if rule is None:
        raise FoldError(
            f"{op} with the tensor as {'first' if x_first else 'second'} operand is not an affine map", Code.NOT_AFFINE
        )
    scale, shift = rule(_f64(const), float(alpha))
    return affine(scale, shift, channels)


def out_channels(kind: str, shape, groups: int = 1) -> int:
    _check_kind(kind, shape, groups)
    return shape[1] * groups if kind == "conv_transpose" else shape[0]


def in_channels(kind: str, shape, groups: int = 1) -> int:
    _check_kind(kind, shape, groups)
    if kind == "conv":
        return shape[1] * groups
    return shape[0] if kind == "conv_transpose" else shape[1]


def channel_index(kind: str, side: str, shape, groups: int = 1) -> torch.Tensor:
    """For each ``[d0, d1]`` weight slice, the output (``side="out"``) or input
    (``side="in"``) channel it belongs to, as a ``[shape[0], shape[1]]`` tensor."""
    _check_kind(kind, shape, groups)
    d0 = torch.arange(shape[0]).reshape(-1, 1)
    d1 = torch.arange(shape[1]).reshape(1, -1)
    if kind == "linear":
        idx = d0 + 0 * d1 if side == "out" else d1 + 0 * d0
    elif kind == "conv":
        if side == "out":
            idx = d0 + 0 * d1
        else:  # weight [out, in/g]: row o is in group o // (out/g)
            idx = (d0 // (shape[0] // groups)) * shape[1] + d1
    else:  # conv_transpose, weight [in, out/g]
        if side == "out":
            idx = (d0 // (shape[0] // groups)) * shape[1] + d1
        else:
            idx = d0 + 0 * d1
    return idx


def _check_kind(kind: str, shape, groups: int) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown weight kind {kind!r}; expected one of {KINDS}")
    if len(shape) < 2:
        raise FoldError(f"{kind} weight must have rank >= 2, got shape {tuple(shape)}", Code.LAYER_SHAPE)
    if kind == "linear" and (len(shape) != 2 or groups != 1):
        raise FoldError(f"linear weight must be [out, in], got shape {tuple(shape)}", Code.LAYER_SHAPE)
    if groups < 1 or shape[0] % groups:
        raise FoldError(f"weight dim 0 ({shape[0]}) is not divisible by groups={groups}", Code.LAYER_SHAPE)


def per_slice(values: torch.Tensor, kind: str, side: str, shape, groups: int = 1) -> torch.Tensor:
    """Per-channel ``values`` laid out to broadcast against a weight of ``shape``.

    Without groups the channel is one weight dim, so this is a view
    (``[out, 1, ...]``, ``[1, in, ...]``); with groups it is gathered through
    :func:`channel_index` into ``[shape[0], shape[1], 1, ...]``.
    """
    rank = len(shape)
    along = {("conv", "out"): 0, ("linear", "out"): 0, ("linear", "in"): 1, ("conv_transpose", "in"): 0}
    dim = along.get((kind, side))
    if dim is None and groups == 1:
        dim = 1  # conv input channels, transposed-conv output channels: dim 1 when ungrouped
    if dim is not None:
        view = [1] * rank
        view[dim] = -1
        return values.reshape(view)
    idx = channel_index(kind, side, shape, groups)
    return values[idx].reshape(*idx.shape, *([1] * (rank - 2)))


#: torch's grain (``at::internal::GRAIN_SIZE``, ATen/TensorIterator.h: 32768): every block a weight is read in has
#: fewer elements (:func:`index_blocks`), so each op on it runs on the calling thread, in cache, with no hand-off to
#: the intra-op thread pool (on a busy machine each hand-off waits for a descheduled thread: 1-16 ms a block).  An
#: elementwise op or a whole reduction of exactly the grain still runs inline; a reduction over a dim does not.
#: A block's temporaries are then a few copies of under 32768 elements (256 KiB each in float64) whatever the
#: weight's shape: a row longer than that is read in pieces too (benchmarks/block_size.py)
BLOCK_ELEMENTS = 1 << 15
#: bytes of a deferred product handed to its writer at a time (blocks gathered in one buffer)
STAGE_BYTES = 1 << 18
#: a tensor of at least this many bytes is large: a streamed model's stays on disk where a run reads it
#: (``numerics.lazy``), and the range rewrite's planner reads it again where it needs it instead of holding it
LARGE_BYTES = 1 << 20


class Spilled(Protocol):
    """A kept product's bytes (:attr:`Product.spilled`): ``discard()`` gives their room back where nothing will
    refer to them (the fold's try that made them failed later: :func:`discard`)."""

    def discard(self) -> None: ...


class Spill(Protocol):
    """Where :func:`scale_weight` puts a deferred product's blocks as its checks make them (the streamed ONNX
    fold's scratch file), so the product is made once: ``write`` gets them in the weight's memory order,
    ``done(True)`` after the last gives a :class:`Spilled` for :attr:`Product.spilled` (None: not kept),
    ``done(False)`` drops what was written (the checks refused, or the blocks stopped coming)."""

    def write(self, block: torch.Tensor) -> None: ...

    def done(self, ok: bool) -> Spilled | None: ...


def discard(*made: object) -> None:
    """Give back the spilled bytes of the products among ``made`` (last first) that will never be written: a
    retry of the fold drops them when a later check of the same try refused."""
    for x in reversed(made):
        if isinstance(x, Product) and x.spilled is not None:
            x.spilled.discard()


@dataclass(frozen=True)
class Product:
    """``weight * s`` in the weight's dtype (``s``: the per-slice scales already rounded to it, broadcasting
    against it), checked by :func:`scale_weight` and not materialized: :meth:`stages` makes it a few blocks at
    a time, each element rounded as in the whole product (an elementwise product of two values of one dtype).
    ``s`` in float64 beside a weight of a narrower dtype: the float64 route (:attr:`wide`), each element the float64
    product rounded once to the weight's dtype, as :func:`cast_checked` of the whole float64 product rounds it.
    ``spilled``: the token of a :class:`Spill` that holds the product's bytes in the weight's memory order."""

    weight: torch.Tensor
    s: torch.Tensor
    spilled: Spilled | None = field(default=None, compare=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.weight.dtype

    @property
    def shape(self) -> torch.Size:
        return self.weight.shape

    @property
    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()

    @property
    def T(self) -> Product:  # noqa: N802 (as torch names it)
        """The product of a 2-D weight, transposed (a MatMul weight back to its stored ``[in, out]``)."""
        return Product(self.weight.T, self.s.expand(self.weight.shape).T, self.spilled)

    @property
    def wide(self) -> bool:
        """Whether each element is the float64 product rounded once (``s`` float64, the weight narrower)."""
        return self.s.dtype != self.weight.dtype

    def stages(self, in_place: bool = False) -> Iterator[torch.Tensor]:
        """The product in row-major order of :attr:`shape`, as 1-D pieces of about :data:`STAGE_BYTES`: views
        of one buffer, each valid until the next is asked for.  ``in_place``: made over the weight's own memory
        (a contiguous weight its caller owns: a streamed weight read again where its product is saved), the
        pieces views of it, each made as it is asked for."""
        w, s = self.weight, self.s.expand(self.weight.shape)
        if w.dim() < 2:
            yield (_mul_into(w, s, w) if in_place else self.materialize()).reshape(-1)
            return
        per_stage = max(1, STAGE_BYTES // max(1, w[0].numel() * w.element_size()))
        stage = w if in_place else torch.empty((min(per_stage, w.shape[0]), *w.shape[1:]), dtype=w.dtype)
        wide = torch.empty(BLOCK_ELEMENTS, dtype=torch.float64) if self.wide else None  # a block's float64 product
        for i in range(0, w.shape[0], per_stage):
            rows = min(per_stage, w.shape[0] - i)
            ws, ss, out = w[i : i + rows], s[i : i + rows], stage[i : i + rows] if in_place else stage[:rows]
            for idx in index_blocks(tuple(ws.shape)):
                _mul_into(ws[idx], ss[idx], out[idx], wide)
            yield out.reshape(-1)

    def materialize(self) -> torch.Tensor:
        if not self.wide:
            return self.weight * self.s
        out = torch.empty_like(self.weight)  # the weight's layout, made a block at a time
        wide = torch.empty(BLOCK_ELEMENTS, dtype=torch.float64)
        for wb, sb, ob in _blocks(self.weight, self.s, out):
            _mul_into(wb, sb, ob, wide)
        return out


def _mul_into(w: torch.Tensor, s: torch.Tensor, out: torch.Tensor, wide: torch.Tensor | None = None) -> torch.Tensor:
    """``out`` = ``w * s`` in ``out``'s dtype: ``s`` of ``w``'s dtype, the product rounded once as it is made; ``s``
    float64 (a :attr:`Product.wide` product), the float64 product made first (in ``wide``, a 1-D float64 buffer of at
    least ``w``'s elements, else a new one) and rounded once, as :func:`_check_cast_blocks` rounds it."""
    if s.dtype == w.dtype:
        return torch.mul(w, s, out=out)
    if wide is None or wide.numel() < w.numel():
        wide = torch.empty(w.numel(), dtype=torch.float64)
    value = wide[: w.numel()].view(w.shape)
    torch.mul(w, s, out=value)  # in float64: the weight's values are exact there
    return out.copy_(value)


def _memory_order(t: torch.Tensor) -> tuple[int, ...] | None:
    """The dims of a dense tensor from the slowest to the fastest in memory (a transposed weight read row by
    row); None where its memory is not one dense block (an expanded or sliced tensor)."""
    order = tuple(sorted(range(t.dim()), key=t.stride, reverse=True))
    return order if t.permute(order).is_contiguous() else None


def _scale_facts(s: torch.Tensor, slices: torch.Tensor) -> tuple[bool, bool] | None:
    """What :func:`_checked_blocks` needs of the scales ``s`` (``slices`` rounded to the weight's dtype):
    ``(small, zero)``, whether some nonzero scale is at most 1/2 in magnitude (it can underflow a weight to
    zero) and whether some scale is zero too; None where ``s`` cannot be used: a scale not finite, or zero
    where its float64 value is not.  Most often one reduction tells it all (the least and largest magnitude:
    NaN propagates through ``aminmax``); a zero among the scales is looked at element by element."""
    if s.numel() and s.dtype in _MINMAX_DTYPES:
        least, most = (float(v) for v in torch.aminmax(s.abs()))
        if not math.isfinite(most):
            return None
        if least > 0:  # no zero scale: some nonzero one is small iff the least is
            return least <= 0.5, False
    if bool(((s == 0) & (slices != 0)).any()) or not bool(torch.isfinite(s).all()):
        return None
    small = bool(((s != 0) & (s.abs() <= 0.5)).any())
    return small, small and bool((s == 0).any())


def _checked_blocks(
    weight: torch.Tensor,
    s: torch.Tensor,
    out: torch.Tensor | None,
    small: bool,
    zero_scale: bool,
    spill: Spill | None = None,
) -> bool:
    """Whether ``weight * s`` (both in the weight's dtype) is finite and loses no nonzero weight to zero,
    made block by block in memory order (into ``out``'s blocks when given, else into a block of its own;
    each block handed to ``spill`` once checked).  ``small``, ``zero_scale``: :func:`_scale_facts` of ``s``.

    |w| >= the smallest subnormal for every nonzero w, so |w * s| > half of it when |s| > 1/2: only a smaller
    scale can underflow a nonzero weight to zero, and only where the product is zero: there the block's
    nonzero count is compared with the weight's (a product is nonzero only where the weight is)."""
    own = mag = None  # one block's product (when there is no ``out``) and its magnitudes, reused
    for wb, sb, ob in _blocks(weight, s, out):
        if ob is None:
            if own is None:  # a weight in one block: in its layout (a spill takes the weight's memory order)
                own = torch.empty_like(wb) if wb is weight else torch.empty(wb.shape, dtype=wb.dtype)
            ob = _part(own, wb)
        b = torch.mul(wb, sb, out=ob)
        if not b.numel():
            continue
        if small:  # the magnitudes' least and largest: all finite (NaN propagates) and whether one is zero
            mag = torch.empty(b.shape, dtype=b.dtype) if mag is None else mag
            lo, hi = torch.aminmax(torch.abs(b, out=_part(mag, b)))
        else:
            lo, hi = torch.aminmax(b)  # NaN propagates; read at once (no small tensor per block kept to the end)
        lo, hi = lo.item(), hi.item()
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return False
        if small and not lo > 0:
            if zero_scale or int(torch.count_nonzero(b)) != int(torch.count_nonzero(wb)):
                return False
        if spill is not None:
            spill.write(b.view(-1) if b.is_contiguous() else _memory_view(b))  # the weight's memory order
    return True


def _bounded(weight: torch.Tensor, s: torch.Tensor, small: bool, zero_scale: bool) -> bool:
    """Whether :func:`_checked_blocks` of ``weight * s`` passes, told without making the product (True) or not told
    (False: make it).  Rounding is monotone and each product is the exact one rounded once to the dtype, so
    ``|fl(w * s)| <= fl(max|w| * max|s|)``, finite when that is; and where some scale is small (no scale zero),
    ``|fl(w * s)| >= fl(min|w| * min|s|)``, nonzero when that is (no weight zero).  The weight's extremes are read
    a block at a time (one reduction, nothing written; ``|w|`` too where a scale is small)."""
    if zero_scale or weight.dtype not in _MINMAX_DTYPES or not weight.numel():
        return False
    top, least, mag = 0.0, math.inf, None
    for wb, _, _ in _blocks(weight, s, None):
        if small:
            mag = torch.empty(wb.shape, dtype=wb.dtype) if mag is None else mag
            wb = torch.abs(wb, out=_part(mag, wb))
        lo, hi = (v.item() for v in torch.aminmax(wb))
        if not (math.isfinite(lo) and math.isfinite(hi)):  # an infinite or NaN weight (NaN propagates)
            return False
        top, least = max(top, -lo, hi), min(least, lo)
    s_lo, s_hi = (v.item() for v in torch.aminmax(s.abs()))
    fits = math.isfinite(_rounded(top * s_hi, weight.dtype))
    return fits and (not small or _rounded(least * s_lo, weight.dtype) > 0)


def _rounded(value: float, dtype: torch.dtype) -> float:
    """``value``, the float64 product of two values of ``dtype``, rounded to ``dtype``: the exact product rounded once
    (exact in float64 for the narrower dtypes; for float64 itself the multiply rounded it once)."""
    return float(torch.tensor(value, dtype=torch.float64).to(dtype))


def _blocks(weight: torch.Tensor, s: torch.Tensor, out: torch.Tensor | None):
    """``(weight block, its scales, out block or None)`` in memory order, each block fewer than
    :data:`BLOCK_ELEMENTS` elements (:func:`index_blocks`; the first is the largest); a weight that small is one
    block as it is."""
    if weight.numel() < BLOCK_ELEMENTS or weight.dim() == 0:
        yield weight, s, out
        return
    order = _memory_order(weight) or tuple(range(weight.dim()))
    w, s = weight.permute(order), s.expand(weight.shape).permute(order)
    o = out.permute(order) if out is not None else None
    for idx in index_blocks(tuple(w.shape)):
        yield w[idx], s[idx], (o[idx] if o is not None else None)


def _part(buf: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Room for the block ``like`` in ``buf``, made for the first (the largest) block: ``buf`` itself for a block of
    its shape, else its first ``like.numel()`` elements (``buf`` is then contiguous) shaped as ``like``."""
    return buf if buf.shape == like.shape else buf.view(-1)[: like.numel()].view(like.shape)


def scale_weight(
    weight: torch.Tensor,
    slices: torch.Tensor,
    dtype: torch.dtype | None,
    what: str,
    deferred: bool | Callable[[int], Spill | None] = False,
) -> torch.Tensor | Product:
    """``weight * slices`` (float64 per-slice scales), rounded once to ``dtype`` with checks.

    ``dtype`` None: the float64 product.  For a float32/float16/bfloat16
    ``dtype`` equal to the weight's, the scales are rounded to ``dtype`` first
    and the product is taken in ``dtype``: a product of two values of that
    dtype is exact in the next wider format, and the CPU rounds it once, so
    this is the exact product of the weight and the rounded scale, rounded
    once (as a runtime BatchNorm with a ``dtype`` scale would compute it).  It
    reads and writes the weight once, instead of three float64 passes.  A float64 weight takes that route only
    ``deferred`` (its scales are the float64 ones, its product the float64 product: the same bits, not whole).
    Raises FoldError on overflow or underflow to zero.  The checks run block by block over the product in
    memory order (a transposed weight, as MatMul stores it, is read row by row), each block as it is made.
    ``deferred``: that product comes back as a :class:`Product` (checked, made again block by block where it
    is written), so the weight and a block are held, not the weight twice; so does the float64 route's where the
    checks in ``dtype`` fail and it folds (:attr:`Product.wide`); other cases return a tensor.
    ``deferred`` may be a function of the product's bytes giving a :class:`Spill` (or None): the checks' blocks go
    there as they are made (a dense weight's, in its memory order), and the product names them
    (:attr:`Product.spilled`).
    """
    if dtype is None:
        return weight.detach().to(torch.float64) * slices
    if not dtype.is_floating_point:
        raise FoldError(f"{what} has dtype {dtype}; only floating-point parameters fold", Code.DTYPE)
    _screen_overflow(weight, slices, dtype, what)
    if weight.dtype != dtype or (dtype == torch.float64 and not deferred):
        return cast_checked(weight.detach().to(torch.float64) * slices, dtype, what)
    s = slices.to(dtype)
    w = weight.detach()
    out = None if deferred else torch.empty_like(w)  # the weight's layout
    facts = _scale_facts(s, slices)
    spill = _spill(deferred, w) if facts is not None else None
    if deferred and spill is None and facts is not None and _bounded(w, s, *facts):
        return Product(w, s)  # what the checks would pass, told from the extremes: the product is made where written
    ok, spilled = _spilling(spill, lambda into: facts is not None and _checked_blocks(w, s, out, *facts, into))
    if ok:
        return Product(w, s, spilled) if deferred else out
    # the float64 route (e.g. a zero scale beside small ones): the float64 product rounded once, a block at a time
    # (never whole); raises what cast_checked raises, else it folds: into ``out``, or deferred as a Product made
    # again block by block by the same route where it is written (wide: its scales the float64 ones), its checked
    # blocks spilled as the in-dtype route's are
    if not deferred:
        _check_cast_blocks(w, slices, dtype, what, out)
        return out
    spill = _spill(deferred, w)
    _, spilled = _spilling(spill, lambda into: _check_cast_blocks(w, slices, dtype, what, spill=into) or True)
    return Product(w, slices.to(torch.float64), spilled)


def _spill(deferred: bool | Callable[[int], Spill | None], w: torch.Tensor) -> Spill | None:
    """Where ``deferred`` (:func:`scale_weight`) puts the checked blocks of ``w``'s product: a dense weight's only."""
    return deferred(w.numel() * w.element_size()) if callable(deferred) and _memory_order(w) is not None else None


def _spilling(spill: Spill | None, check: Callable[[Spill | None], bool]) -> tuple[bool, Spilled | None]:
    """``check(spill)`` (whether the product passed, its blocks handed to ``spill``) and what ``spill`` kept of them:
    ended with the verdict, or dropped where the check raised."""
    try:
        ok = check(spill)
    except BaseException:
        if spill is not None:
            spill.done(False)
        raise
    return ok, (spill.done(ok) if spill is not None else None)


def fold_output_affine(
    weight,
    bias,
    aff: Affine,
    kind: str,
    groups: int = 1,
    dtype: torch.dtype | None = None,
    deferred: bool | Callable[[int], Spill | None] = False,
):
    """Fold ``y = producer(x) * scale + shift`` into the producer's weight/bias.

    Returns ``(new_weight, new_bias)``: the weight in ``dtype`` (see
    :func:`scale_weight`, also for ``deferred``; float64 when None), the bias in float64.  ``bias`` may be ``None``.
    """
    n_out = out_channels(kind, weight.shape, groups)
    if aff.channels != n_out:
        raise FoldError(
            f"normalization has {aff.channels} channels but the {kind} has {n_out} output channels", CHANNELS
        )
    slices = per_slice(aff.scale, kind, "out", weight.shape, groups)
    new_w = scale_weight(weight, slices, dtype, f"{kind} weight", deferred)
    b = torch.zeros(n_out, dtype=torch.float64) if bias is None else _f64(bias)
    if b.numel() != n_out:
        raise FoldError(f"bias has {b.numel()} elements, expected {n_out}", Code.LAYER_SHAPE)
    return new_w, b * aff.scale + aff.shift


def check_input_affine(aff: Affine, kind: str, shape, groups: int = 1, shift_exact: bool = True) -> bool:
    """The refusals of :func:`fold_input_affine` that the weight's ``shape`` and the consumer's attributes decide
    (no weight value): FoldError, else whether ``aff`` has a nonzero shift."""
    n_in = in_channels(kind, shape, groups)
    if aff.channels != n_in:
        raise FoldError(f"normalization has {aff.channels} channels but the {kind} has {n_in} input channels", CHANNELS)
    has_shift = bool((aff.shift != 0).any())
    if has_shift and kind == "conv_transpose":
        raise FoldError(
            "a nonzero shift before a transposed conv does not fold exactly (border outputs see fewer taps)",
            Code.SHIFT_TRANSPOSED,
        )
    if has_shift and not shift_exact:
        raise FoldError(
            "a nonzero shift before a padded conv does not fold exactly (padding would see the shift)",
            Code.SHIFT_PADDING,
        )
    return has_shift


def fold_input_affine(
    weight,
    bias,
    aff: Affine,
    kind: str,
    groups: int = 1,
    shift_exact: bool = True,
    dtype: torch.dtype | None = None,
    deferred: bool | Callable[[int], Spill | None] = False,
):
    """Fold ``y = consumer(x * scale + shift)`` into the consumer's weight/bias.

    The scale always folds.  The shift folds into the bias as
    ``sum(W * shift)`` over the reduction (in float64), which is exact only
    when every output sees every kernel tap of the shifted input: a consumer
    with zero padding (``shift_exact=True``).  Transposed convs scatter a
    variable number of taps into each output, so their shift must be zero.
    The weight is returned in ``dtype`` as by :func:`scale_weight` (also for ``deferred``), the bias in float64.
    """
    has_shift = check_input_affine(aff, kind, weight.shape, groups, shift_exact)
    new_w = scale_weight(
        weight, per_slice(aff.scale, kind, "in", weight.shape, groups), dtype, f"{kind} weight", deferred
    )
    n_out = out_channels(kind, weight.shape, groups)
    b = torch.zeros(n_out, dtype=torch.float64) if bias is None else _f64(bias)
    if has_shift:
        w = weight.detach().to(torch.float64)
        contrib = (w * per_slice(aff.shift, kind, "in", w.shape, groups)).reshape(w.shape[0], -1).sum(1)
        b = b + contrib  # conv / linear: dim 0 is the output channel
    return new_w, b


def scale_pow2(value: torch.Tensor, exponent: int, dtype: torch.dtype, what: str) -> torch.Tensor:
    """``value * 2 ** exponent`` in ``dtype``: exact (a power of two only moves the exponent), or FoldError when
    the result leaves ``dtype``'s range (overflow, or a value that underflows and would lose bits).  The result has
    ``value``'s layout; a dense tensor is computed in slices of its memory (:data:`_POW2_CHUNK` elements each), so
    its float64 copies are a slice's, not the tensor's; a slice that fails is reported as the whole tensor fails.
    An ``exponent`` past :data:`POW2_REACH` either way keeps only zeros (anything else is refused)."""
    value = value.detach()
    if abs(exponent) > POW2_REACH:
        if bool((value != 0).any()):  # NaN too
            raise FoldError(f"{what} times 2^{exponent} leaves {dtype}'s range", Code.CAST_RANGE)
        return value.to(dtype, copy=True)
    flat = _memory_view(value)
    if flat is None or flat.numel() <= _POW2_CHUNK:
        return _scale_pow2(value, exponent, dtype, what)
    out = torch.empty_like(value, dtype=dtype)  # a dense tensor's layout: its memory view is dense too
    out_flat = _memory_view(out)
    for start in range(0, flat.numel(), _POW2_CHUNK):
        part = flat[start : start + _POW2_CHUNK]
        try:
            out_flat[start : start + _POW2_CHUNK] = _scale_pow2(part, exponent, dtype, what)
        except FoldError:  # the whole tensor's message where it is cast_checked's (its counts), made block by block
            _check_cast_blocks(value, torch.tensor(2.0**exponent, dtype=torch.float64), dtype, what)
            raise
    return out


def _scale_pow2(value: torch.Tensor, exponent: int, dtype: torch.dtype, what: str) -> torch.Tensor:
    out = cast_checked(value.to(torch.float64) * 2.0**exponent, dtype, what)
    if not torch.equal(out.to(torch.float64) * 2.0**-exponent, value.to(torch.float64)):
        raise FoldError(f"{what} times 2^{exponent} is not exact in {dtype} (it underflows)", Code.CAST_RANGE)
    return out


#: the largest power of two :func:`scale_pow2` and :func:`pow2_exact` scale by, either way (``2.0 ** 1000`` is a
#: float64; past it only zeros stay in any float format)
POW2_REACH = 1000


def pow2_exact(span: tuple[float, float], dtype: torch.dtype, stored: torch.dtype, exponent: int) -> bool:
    """Whether :func:`scale_pow2` of a ``dtype`` tensor whose nonzero magnitudes lie in ``span`` (``(smallest
    nonzero, largest)``, 0 for none) by ``2 ** exponent`` into ``stored`` surely succeeds and keeps every bit:
    ``stored`` is ``dtype`` (a floating one), the magnitudes are finite (a NaN or infinity never scales), and the
    results are in ``stored``'s normal range (a power of two then moves only the exponent).  Read from the two
    floats alone; False where a subnormal is involved, even where the scale happens to be exact."""
    if dtype != stored or not stored.is_floating_point or abs(exponent) > POW2_REACH:
        return False
    low, high = span
    if not math.isfinite(high):
        return False
    info = torch.finfo(stored)
    return _ldexp(high, exponent) <= info.max and (low == 0.0 or _ldexp(low, exponent) >= info.tiny)


def pow2_scalar(x: float, exponent: int, dtype: torch.dtype) -> float | None:
    """``x * 2 ** exponent`` where it is a normal ``dtype`` number or zero (:func:`pow2_exact`: then exact), else
    None (a norm's eps, a multiply's factor)."""
    return _ldexp(x, exponent) if pow2_exact((abs(x), abs(x)), dtype, dtype, exponent) else None


def pow2_product(weight: torch.Tensor, exponent: int) -> Product | None:
    """``weight * 2 ** exponent`` as a deferred :class:`Product` (made block by block where it is written) where
    ``2 ** exponent`` is a normal number of the weight's dtype, else None.  Each element is then
    :func:`scale_pow2`'s where the caller showed the weight's span stays normal (:func:`pow2_exact`)."""
    factor = pow2_scalar(1.0, exponent, weight.dtype)
    return None if factor is None else Product(weight, torch.tensor(factor, dtype=weight.dtype))


def _ldexp(x: float, exponent: int) -> float:
    """``x * 2 ** exponent`` in float64, infinity where it overflows (``math.ldexp`` raises there)."""
    try:
        return math.ldexp(x, exponent)
    except OverflowError:
        return math.inf


def _memory_view(t: torch.Tensor) -> torch.Tensor | None:
    """A 1-D view of ``t``'s elements in the order its memory holds them, or None (:func:`_memory_order`)."""
    order = _memory_order(t)
    return None if order is None else t.permute(order).view(-1)


#: elements of a slice :func:`scale_pow2` computes at a time: under a block (its float64 copies 256 KiB each, beside
#: the weight; each op on the calling thread, 13-18x faster than slices of 256K-1M elements on a busy 2-core machine)
_POW2_CHUNK = BLOCK_ELEMENTS - 1


# ------------------------------------------------------------------ refusing a retried weight's overflow cheaply

#: the screens of :func:`screened`: id(weight) -> [weight, times seen, {slices' shape: (least, largest |w|)}]
_SCREENS: ContextVar[dict | None] = ContextVar("bnfold_fold_screens", default=None)


@contextmanager
def screened() -> Iterator[None]:
    """Within it, :func:`scale_weight` of a weight it has already scaled once refuses an overflowing product from
    per-slice summaries of the weight (its least and largest magnitude along each scaled slice, read once)
    instead of making the product: the same :class:`FoldError`, word for word, in time of the scales' size.
    The fold's retry loop (``engine.edit.fold_chain``) drops a chain's steps one at a time until the product
    fits; without this each dropped step cost a few passes over the whole weight."""
    token = _SCREENS.set({})
    try:
        yield
    finally:
        _SCREENS.reset(token)


def _first_product(weight: torch.Tensor) -> bool:
    """Whether ``weight``'s product is made as ever, with no summary: :func:`screened` is off, or this is its first
    product in it (``weight`` noted now; most folds make only one)."""
    screens = _SCREENS.get()
    if screens is None:
        return True
    entry = screens.get(id(weight))
    if entry is None or entry[0] is not weight:
        screens[id(weight)] = [weight, 1, {}]
        return True
    return False


def _slice_extremes(weight: torch.Tensor, shape: tuple) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The least and largest ``|weight|`` over each slice of a scale of ``shape`` (float64), or None
    (:func:`_first_product`)."""
    if _first_product(weight):
        return None
    entry = _SCREENS.get()[id(weight)]
    if shape not in entry[2]:
        entry[2][shape] = _magnitude_extremes(weight.detach(), shape)
    return entry[2][shape]


def _magnitude_extremes(weight: torch.Tensor, shape: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """The least and largest ``|weight|`` over each slice of a scale of ``shape`` (float64, of ``shape``), read a
    block (:func:`index_blocks`) at a time: no temporary the weight's size beside it (a streamed
    weight read again on the retry path).  Bit for bit ``|weight|.amin/amax`` over the scale's broadcast dims
    cast to float64: the cast is exact and monotone, and NaN propagates through ``minimum``/``maximum`` as through
    ``amin``/``amax``."""
    order = _memory_order(weight) or tuple(range(weight.dim()))  # blocks in memory order (a transposed weight)
    w, shape = weight.permute(order), tuple(shape[d] for d in order)
    dims = [d for d in range(w.dim()) if shape[d] == 1 and w.shape[d] != 1]
    out = tuple(1 if d in dims else n for d, n in enumerate(w.shape))
    least = torch.full(out, math.inf, dtype=torch.float64)
    most = torch.full(out, -math.inf, dtype=torch.float64)
    for idx in index_blocks(tuple(w.shape)):
        mag = w[idx].abs()
        at = tuple(slice(None) if d in dims else i for d, i in enumerate(idx))
        lo, hi = (mag.amin(dim=dims, keepdim=True), mag.amax(dim=dims, keepdim=True)) if dims else (mag, mag)
        least[at] = torch.minimum(least[at], lo.to(torch.float64))
        most[at] = torch.maximum(most[at], hi.to(torch.float64))
    back = [order.index(d) for d in range(w.dim())]
    return least.permute(back).contiguous(), most.permute(back).contiguous()


def index_blocks(shape: tuple, prefix: tuple = ()) -> Iterator[tuple]:
    """Index tuples (slices, every dim kept) that cover a tensor of ``shape`` in blocks of fewer than
    :data:`BLOCK_ELEMENTS` elements (or one element): whole rows of the first dim where they fit, else each row
    split the same way.  Fewer: torch hands a reduction over a dim of a block of exactly its grain to its thread
    pool (8 x 4096 float32 rows, amin over a dim: 1-16 ms at load 4, against 0.01 ms for one row fewer)."""
    d = len(prefix)
    if d == len(shape):
        yield prefix
        return
    inner = math.prod(shape[d + 1 :])
    if inner < BLOCK_ELEMENTS:
        step = max(1, (BLOCK_ELEMENTS - 1) // max(1, inner))
        for i in range(0, shape[d], step):
            yield (*prefix, slice(i, i + step))
        return
    for i in range(shape[d]):
        yield from index_blocks(shape, (*prefix, slice(i, i + 1)))


def _screen_overflow(weight: torch.Tensor, slices: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """Raise what the checks of ``weight * slices`` in ``dtype`` raise where summaries prove that it overflows
    (:func:`screened`); else nothing (the product is made and checked as ever).

    Exactness: rounding is monotone, so per slice the largest ``|fl64(w * s)|`` is ``fl64(max|w| * |s|)`` and it
    overflows ``dtype`` iff some element does; ``w * inf`` is NaN only where ``w`` is zero (least ``|w|`` 0).
    That is the float64 route's verdict and its "max |value|" (NaN where a NaN is made).  The in-dtype route
    (weight and scale of one dtype, product exact in float64 before its one rounding) must fail too: its
    scale is not finite in ``dtype``, or ``max|w| * |s|`` rounded to ``dtype`` overflows."""
    if dtype not in _MINMAX_DTYPES or not weight.numel() or weight.dim() != slices.dim() or _first_product(weight):
        return  # a first product is not screened: its scales are not looked at here (NaN or not)
    if slices.isnan().any():
        return
    extremes = _slice_extremes(weight, tuple(slices.shape))
    if extremes is None or not bool(torch.isfinite(extremes[1]).all()):
        return
    least, most = extremes
    scale = slices.abs()
    biggest = most * scale
    made_nan = bool(((least == 0) & torch.isinf(scale)).any())
    if not (made_nan or bool(torch.isinf(biggest.to(dtype)).any())):
        return
    if weight.dtype == dtype and dtype != torch.float64:
        s = slices.to(dtype)
        if bool(torch.isfinite(s).all()) and not bool(torch.isinf((most * s.abs().to(torch.float64)).to(dtype)).any()):
            return  # the in-dtype route may hold where the float64 one overflows: make it
    raise _overflow(what, dtype, math.nan if made_nan else float(biggest.max()))


def cast_checked(value: torch.Tensor, dtype: torch.dtype, what: str) -> torch.Tensor:
    """Cast a float64 result to ``dtype``; raise FoldError on overflow or underflow."""
    if not dtype.is_floating_point:
        raise FoldError(f"{what} has dtype {dtype}; only floating-point parameters fold", Code.DTYPE)
    out = value.to(dtype)
    if out.numel() and out.dtype in _MINMAX_DTYPES:  # most often one reduction shows all finite and none zero
        least, most = (float(v) for v in torch.aminmax(out.abs()))
        if least > 0 and math.isfinite(most):
            return out
    if not torch.isfinite(out).all():
        raise _overflow(what, dtype, value.abs().max().item())
    lost = (out == 0) & (value != 0)
    if lost.any():
        raise _underflow(what, dtype, int(lost.sum()))
    return out


def _overflow(what: str, dtype: torch.dtype, biggest: float) -> FoldError:
    return FoldError(f"folded {what} overflows {dtype} (max |value| {biggest:.3g})", Code.CAST_RANGE)


def _underflow(what: str, dtype: torch.dtype, lost: int) -> FoldError:
    return FoldError(f"folded {what} underflows to zero in {dtype} ({lost} element(s))", Code.CAST_RANGE)


def _check_cast_blocks(
    weight: torch.Tensor,
    slices: torch.Tensor,
    dtype: torch.dtype,
    what: str,
    into: torch.Tensor | None = None,
    spill: Spill | None = None,
) -> None:
    """Raise what ``cast_checked(weight.to(float64) * slices, dtype, what)`` raises, if anything, making the
    float64 product a block at a time in buffers made once (a refused weight costs a few blocks, not the
    weight four times over).  ``into`` (the weight's shape, ``dtype``): where the rounded product goes, that cast's
    values (bit for bit: each element is the float64 product rounded once).  ``spill`` (a dense weight's, no
    ``into``): gets each rounded block as it is made, in the weight's memory order."""
    finite, biggest, lost = True, -math.inf, 0
    bufs: tuple[torch.Tensor, ...] = ()
    for wb, sb, ob in _blocks(weight, slices, into):
        if not wb.numel():
            continue
        if not bufs:  # the first block is the largest
            bufs = tuple(torch.empty(wb.shape, dtype=d) for d in (torch.float64, dtype, torch.float64))
        value, out, mag = (_part(b, wb) for b in bufs)
        out = out if ob is None else ob
        torch.mul(wb, sb, out=value)  # in float64: the weight's values are exact there
        out.copy_(value)
        finite = finite and bool(torch.isfinite(out).all())
        top = float(torch.abs(value, out=mag).max())
        biggest = math.nan if math.isnan(top) or math.isnan(biggest) else max(biggest, top)
        lost += int(((out == 0) & (value != 0)).sum())
        if spill is not None and finite and not lost:  # until it is refused (then dropped); a weight in one
            # block is as it is (its memory order may be another)
            spill.write(out.view(-1) if wb is not weight else out.permute(_memory_order(weight)).reshape(-1))
    if not finite:
        raise _overflow(what, dtype, biggest)
    if lost:
        raise _underflow(what, dtype, lost)


# ---------------------------------------------------------------------------------------------
# Structural re-parameterization (issue 21): parallel branches that read one value and are summed
# become one conv.  Every function here is exact in float64; the engine (``engine/reparam.py``)
# decides which branches go together.  Kernels are conv weights ``[out, in/groups, *k]``; pads are
# ``(begin, end)`` per spatial axis.


def kernel_offsets(k_small, pads_small, k_big, pads_big, dilation) -> tuple[int, ...]:
    """Where a ``k_small`` kernel sits inside a ``k_big`` one so that both convs (same stride and
    ``dilation``) compute the same outputs: per axis the tap offset ``(p_big - p_small) / d``, which
    must be a whole number with the kernel inside ``k_big`` at both ends.  For symmetric pads this is
    ``p_small = p_big - (k_big - k_small) * d / 2``.  Raises FoldError when the paddings do not align."""
    if not (len(k_small) == len(pads_small) == len(k_big) == len(pads_big) == len(dilation)):
        raise FoldError(f"kernels {tuple(k_small)} and {tuple(k_big)} have different ranks", Code.MERGE_GEOMETRY)
    offsets = []
    for axis, (ks, (bs, es), kb, (bb, eb), d) in enumerate(zip(k_small, pads_small, k_big, pads_big, dilation)):
        begin, end = bb - bs, eb - es
        if ks > kb or begin < 0 or end < 0 or begin % d or end % d or begin // d + ks + end // d != kb:
            raise FoldError(
                f"padding does not align on spatial axis {axis}: a {ks}-tap kernel padded ({bs}, {es}) and a "
                f"{kb}-tap kernel padded ({bb}, {eb}) with dilation {d} see different windows",
                Code.MERGE_PADDING,
            )
        offsets.append(begin // d)
    return tuple(offsets)


def embed_kernel(weight, k_big, offsets) -> torch.Tensor:
    """``weight`` (float64) zero-padded to the spatial size ``k_big``, its taps starting at ``offsets``."""
    w = torch.as_tensor(weight).detach().to(torch.float64)
    out = torch.zeros((*w.shape[:2], *k_big), dtype=torch.float64)
    window = (slice(None), slice(None)) + tuple(slice(o, o + k) for o, k in zip(offsets, w.shape[2:]))
    out[window] = w
    return out


def _per_channel_kernel(channels: int, groups: int, kernel, value: float) -> torch.Tensor:
    if groups < 1 or channels % groups:
        raise FoldError(f"{channels} channels are not divisible by groups={groups}", Code.LAYER_SHAPE)
    per_group = channels // groups
    w = torch.zeros((channels, per_group, *kernel), dtype=torch.float64)
    o = torch.arange(channels)
    w[o, o % per_group] = value
    return w


def identity_kernel(channels: int, groups: int, spatial_rank: int) -> torch.Tensor:
    """The identity as a conv of ``groups`` groups: a 1×…×1 kernel ``I[o, o mod (C/g)] = 1``
    (embed it with :func:`kernel_offsets` / :func:`embed_kernel` to put it at a kernel's centre)."""
    return _per_channel_kernel(channels, groups, (1,) * spatial_rank, 1.0)


def avg_pool_kernel(channels: int, groups: int, kernel) -> torch.Tensor:
    """``avg_pool(k, s, p, count_include_pad=True)`` as a conv of ``groups`` groups (same stride and
    pads): every tap of channel ``o`` reading channel ``o`` weighs ``1 / prod(k)``."""
    n = 1
    for k in kernel:
        n *= int(k)
    return _per_channel_kernel(channels, groups, tuple(kernel), 1.0 / n)


def scale_branch(weight, bias, aff: Affine) -> tuple[torch.Tensor, torch.Tensor]:
    """A conv branch followed by the per-output-channel ``aff`` (its BN, its coefficient in the
    sum), in float64: ``(weight * scale, bias * scale + shift)``."""
    w = torch.as_tensor(weight).detach().to(torch.float64)
    if aff.channels != w.shape[0]:
        raise FoldError(
            f"the affine has {aff.channels} channels but the branch has {w.shape[0]} output channels", CHANNELS
        )
    b = torch.zeros(w.shape[0], dtype=torch.float64) if bias is None else _f64(bias)
    return w * aff.scale.reshape(-1, *([1] * (w.dim() - 1))), b * aff.scale + aff.shift


def sum_branches(branches) -> tuple[torch.Tensor, torch.Tensor]:
    """Convs of one geometry reading one value, summed: one conv whose weight and bias are the sums
    (``branches``: ``(weight, bias)`` pairs in float64, kernels already embedded to one size)."""
    branches = list(branches)
    if not branches:
        raise FoldError("no branches to sum", Code.MERGE_GEOMETRY)
    shape = tuple(branches[0][0].shape)
    weight = torch.zeros(shape, dtype=torch.float64)
    bias = torch.zeros(shape[0], dtype=torch.float64)
    for w, b in branches:
        if tuple(w.shape) != shape:
            raise FoldError(f"branch weights have shapes {shape} and {tuple(w.shape)}", Code.MERGE_GEOMETRY)
        weight = weight + torch.as_tensor(w, dtype=torch.float64)
        if b is not None:
            bias = bias + _f64(b)
    return weight, bias
