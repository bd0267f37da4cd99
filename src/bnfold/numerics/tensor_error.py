"""Error statistics of one tensor (summed over batches) against its reference (float64; float32 under the
profiles that store fp16)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class TensorError:
    """How far an emulated tensor is from its reference.

    ``signal`` and ``noise`` are sums of ``ref**2`` and ``(emulated - ref)**2``
    over the elements where both values are finite; non-finite emulated elements
    are counted in ``nan`` / ``inf`` instead (``ref_nonfinite``: non-finite
    reference elements).  ``max_abs_ref`` is the largest finite ``|ref|``.

    A tensor holding any NaN/inf has no SQNR: ``sqnr_db`` is NaN, and reports
    show the NaN/inf counts and ``nonfinite_share`` instead.  ``finite_sqnr_db``
    is the SQNR of the finite elements only, for diagnosis.
    """

    node: str
    op: str
    shape: tuple
    count: int = 0
    signal: float = 0.0
    noise: float = 0.0
    max_abs_ref: float = 0.0
    max_abs_err: float = 0.0
    nan: int = 0
    inf: int = 0
    ref_nonfinite: int = 0

    @property
    def sqnr_db(self) -> float:
        """``10 log10(signal / noise)``; +inf when there is no error at all; NaN when the
        tensor holds any NaN/inf (emulated or reference) or no element at all."""
        if self.nonfinite or self.ref_nonfinite:
            return math.nan
        return self.finite_sqnr_db

    @property
    def finite_sqnr_db(self) -> float:
        """The SQNR over the finite elements only (NaN when none is finite)."""
        finite = self.count - self.nonfinite - self.ref_nonfinite
        if finite <= 0:
            return math.nan
        if self.noise == 0.0:
            return math.inf
        if self.signal == 0.0:
            return -math.inf
        ratio = self.signal / self.noise  # 0 when it underflows: no signal left
        return -math.inf if ratio == 0 else 10.0 * math.log10(ratio)

    @property
    def nonfinite(self) -> int:
        return self.nan + self.inf

    @property
    def nonfinite_share(self) -> float:
        """The fraction of elements whose emulated value is NaN or inf."""
        return self.nonfinite / self.count if self.count else 0.0

    def merge(self, other: TensorError) -> None:
        self.count += other.count
        self.signal += other.signal
        self.noise += other.noise
        self.max_abs_ref = max(self.max_abs_ref, other.max_abs_ref)
        self.max_abs_err = max(self.max_abs_err, other.max_abs_err)
        self.nan += other.nan
        self.inf += other.inf
        self.ref_nonfinite += other.ref_nonfinite

    def to_dict(self) -> dict:
        return {
            "node": self.node,
            "op": self.op,
            "shape": list(self.shape),
            "sqnr_db": json_float(self.sqnr_db),  # null: NaN/inf in the tensor; "inf": no error at all
            "finite_sqnr_db": json_float(self.finite_sqnr_db),
            "max_abs_err": json_float(self.max_abs_err),
            "max_abs_ref": json_float(self.max_abs_ref),
            "elements": self.count,
            "nan": self.nan,
            "inf": self.inf,
            "nonfinite_share": self.nonfinite_share,
            "ref_nonfinite": self.ref_nonfinite,
        }


def json_float(x: float):
    """A float for JSON: finite floats as they are, NaN as null, infinities as the strings "inf", "-inf"."""
    x = float(x)
    if math.isnan(x):
        return None
    return x if math.isfinite(x) else str(x)


def _abs_max(t: torch.Tensor) -> float:
    if t.numel() == 0:
        return 0.0
    lo, hi = torch.aminmax(t)
    return max(-float(lo), float(hi))


#: from this many elements, ``amin`` and ``amax`` take less time than one ``aminmax`` (torch 2.13, x86)
SEPARATE_EXTREMA = 1 << 15


def _extrema(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if t.numel() < SEPARATE_EXTREMA:
        return torch.aminmax(t)
    return t.amin(), t.amax()  # two plain reductions beat one aminmax on larger tensors (~30% here)


def measure(
    node: str,
    op: str,
    emulated: torch.Tensor,
    ref: torch.Tensor,
    exact_diff: bool,
    ref_stats: tuple[float, float] | None = None,
) -> TensorError:
    """Compare ``emulated`` with the reference ``ref`` (float64, or float32 under the profiles that store fp16).

    With ``exact_diff=False`` the difference is taken in float32, which is
    accurate to ~1e-7 of ``|ref|``: enough when the emulated error is fp16's
    (~5e-4), not when it is float32's.  ``ref_stats``: ``(signal, max_abs_ref)`` of this same reference
    from an earlier measurement whose values were all finite (:func:`reference_stats`), not computed again.
    """
    err = TensorError(node, op, tuple(ref.shape), ref.numel())
    if ref.numel() == 0:
        return err
    dtype = torch.float64 if exact_diff else torch.float32  # a float32 reference too: signal and noise alike
    if ref.dtype != dtype:
        ref = ref.to(dtype)
    diff = (emulated if emulated.dtype == dtype else emulated.to(dtype)) - ref
    found = [torch.linalg.vector_norm(diff), *_extrema(diff)]
    if ref_stats is None:
        found += [torch.linalg.vector_norm(ref), *_extrema(ref)]
    noise, d_lo, d_hi, *rest = torch.stack(found).tolist()  # one conversion to Python numbers
    signal, max_ref = ref_stats or (rest[0] * rest[0], max(-rest[1], rest[2]))
    noise *= noise
    err.max_abs_ref = max_ref
    if math.isfinite(noise):
        err.noise = noise
        err.signal = signal
        err.max_abs_err = max(-d_lo, d_hi)
        return err
    finite = torch.isfinite(emulated) & torch.isfinite(ref)
    err.nan = int(torch.isnan(emulated).sum())
    err.inf = int(torch.isinf(emulated).sum())
    err.ref_nonfinite = int((~torch.isfinite(ref)).sum())
    err.max_abs_ref = _abs_max(ref[torch.isfinite(ref)])
    err.signal = float(torch.linalg.vector_norm(ref[finite])) ** 2
    d = diff[finite]
    err.noise = float(torch.linalg.vector_norm(d)) ** 2
    err.max_abs_err = _abs_max(d)
    return err


def reference_stats(err: TensorError | None) -> tuple[float, float] | None:
    """``(signal, max_abs_ref)`` of the reference ``err`` was measured against, for :func:`measure`'s ``ref_stats``
    of a later comparison with the same reference tensor: None when ``err`` saw a non-finite value (its signal
    then covers only the elements where both tensors were finite) or was measured with others (:func:`measure_many`:
    a small tensor, whose statistics cost nothing more to compute again)."""
    if err is None or err.count <= SMALL or err.nonfinite or err.ref_nonfinite:
        return None
    return err.signal, err.max_abs_ref


#: tensors of at most this many elements are measured together (:class:`ErrorMeter`): one set of ops for a batch of
#: them costs ~3x less per tensor than a measurement each up to ~500 elements, more above (torch 2.13, x86);
#: squeeze-excitation blocks and pooled features make a tenth to a third of a vision model's values this small
SMALL = 256
#: a batch of small tensors is measured once it holds this many elements
BATCH_ELEMENTS = 1 << 14


class ErrorMeter:
    """Measures emulated tensors against their references (:func:`measure`) into dicts of :class:`TensorError`.

    A tensor of more than :data:`SMALL` elements is measured at once; smaller ones wait (references to the
    tensors, at most :data:`BATCH_ELEMENTS` elements) and are measured together by :func:`measure_many`.  Each
    result takes its place in its dict at :meth:`add` (None until measured, so the dict keeps the order of
    the calls) and is there after :meth:`flush` at the latest.  The tensors must not change meanwhile: the
    runner flushes before an op that writes an input in place (``Step.mutates``)."""

    def __init__(self, exact_diff: bool):
        self.exact_diff = exact_diff
        self._waiting: list[tuple[dict, str, str, torch.Tensor, torch.Tensor]] = []
        self._elements = 0

    def add(self, into: dict, node: str, op: str, emulated: torch.Tensor, ref: torch.Tensor, ref_stats=None) -> None:
        """Measure ``emulated`` against ``ref`` into ``into[node]`` (``ref_stats``: see :func:`measure`)."""
        n = ref.numel()
        if n == 0 or n > SMALL:
            into[node] = measure(node, op, emulated, ref, self.exact_diff, ref_stats)
            return
        into[node] = None
        self._waiting.append((into, node, op, emulated, ref))
        self._elements += n
        if self._elements >= BATCH_ELEMENTS:
            self.flush()

    def flush(self) -> None:
        """Measure every waiting tensor."""
        if not self._waiting:
            return
        waiting, self._waiting, self._elements = self._waiting, [], 0
        found = measure_many([(node, op, e, r) for _, node, op, e, r in waiting], self.exact_diff)
        for (into, node, *_), err in zip(waiting, found):
            into[node] = err


def measure_many(items: list[tuple[str, str, torch.Tensor, torch.Tensor]], exact_diff: bool) -> list[TensorError]:
    """:func:`measure` of each ``(node, op, emulated, ref)`` (non-empty tensors), in one set of ops over their
    concatenation: the sums of squares in float64 (as accurate as :func:`measure`'s float32 norms or more), the
    largest magnitudes exact.  An item whose error is not finite is measured on its own (NaN/inf counts)."""
    dtype = torch.float64 if exact_diff else torch.float32
    emulated = torch.cat([e.reshape(-1) for _, _, e, _ in items]).to(dtype)
    ref = torch.cat([r.reshape(-1) for _, _, _, r in items]).to(dtype)
    counts = [r.numel() for _, _, _, r in items]
    n = len(items)
    owner = torch.repeat_interleave(torch.arange(n), torch.tensor(counts))
    both = torch.stack((emulated - ref, ref))
    squares = torch.zeros(2, n, dtype=torch.float64).index_add_(1, owner, both.to(torch.float64).square())
    largest = torch.zeros(2, n, dtype=dtype).scatter_reduce_(1, owner.expand(2, -1), both.abs_(), "amax")
    noise, signal, max_err, max_ref = torch.cat((squares, largest.to(torch.float64))).tolist()
    out = []
    for i, (node, op, e, r) in enumerate(items):
        if not math.isfinite(noise[i]):
            out.append(measure(node, op, e, r, exact_diff))
            continue
        err = TensorError(node, op, tuple(r.shape), counts[i], signal[i], noise[i], max_ref[i], max_err[i])
        out.append(err)
    return out
