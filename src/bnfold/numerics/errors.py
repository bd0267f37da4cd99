"""Error statistics of one tensor (summed over batches) against its float64 reference."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class TensorError:
    """How far an emulated tensor is from its float64 reference.

    ``signal`` and ``noise`` are sums of ``ref**2`` and ``(emulated - ref)**2``
    over the elements whose emulated value is finite; non-finite elements are
    counted in ``nan`` / ``inf`` instead.  ``max_abs_ref`` is the largest
    ``|ref|`` (all elements), the number the fp16 overflow headroom is read from.
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

    @property
    def sqnr_db(self) -> float:
        """``10 log10(signal / noise)``; +inf when there is no error at all."""
        if self.noise == 0.0:
            return math.inf if self.signal > 0 or self.count else math.nan
        if self.signal == 0.0:
            return -math.inf
        return 10.0 * math.log10(self.signal / self.noise)

    @property
    def nonfinite(self) -> int:
        return self.nan + self.inf

    def merge(self, other: "TensorError") -> None:
        self.count += other.count
        self.signal += other.signal
        self.noise += other.noise
        self.max_abs_ref = max(self.max_abs_ref, other.max_abs_ref)
        self.max_abs_err = max(self.max_abs_err, other.max_abs_err)
        self.nan += other.nan
        self.inf += other.inf

    def to_dict(self) -> dict:
        return {
            "node": self.node,
            "op": self.op,
            "shape": list(self.shape),
            "sqnr_db": json_float(self.sqnr_db),
            "max_abs_err": json_float(self.max_abs_err),
            "max_abs_ref": json_float(self.max_abs_ref),
            "nan": self.nan,
            "inf": self.inf,
        }


def json_float(x: float):
    """A float for JSON: finite floats as they are, the rest as the strings "inf", "-inf", "nan"."""
    x = float(x)
    return x if math.isfinite(x) else str(x)


def _abs_max(t: torch.Tensor) -> float:
    if t.numel() == 0:
        return 0.0
    lo, hi = torch.aminmax(t)
    return max(-float(lo), float(hi))


def measure(node: str, op: str, emulated: torch.Tensor, ref: torch.Tensor, exact_diff: bool) -> TensorError:
    """Compare ``emulated`` with the float64 ``ref``.

    With ``exact_diff=False`` the difference is taken in float32, which is
    accurate to ~1e-7 of ``|ref|``: enough when the emulated error is fp16's
    (~5e-4), not when it is float32's.
    """
    err = TensorError(node, op, tuple(ref.shape), ref.numel())
    if ref.numel() == 0:
        return err
    if exact_diff:
        err.max_abs_ref = _abs_max(ref)
        diff = emulated.to(torch.float64) - ref
        noise = float(torch.linalg.vector_norm(diff)) ** 2
        signal_ref = ref
    else:
        ref32 = ref.to(torch.float32)
        err.max_abs_ref = _abs_max(ref32)
        diff = emulated - ref32
        noise = float(torch.linalg.vector_norm(diff)) ** 2
        signal_ref = ref32
    if math.isfinite(noise):
        err.noise = noise
        err.signal = float(torch.linalg.vector_norm(signal_ref)) ** 2
        err.max_abs_err = _abs_max(diff)
        return err
    finite = torch.isfinite(emulated) & torch.isfinite(ref)
    err.nan = int(torch.isnan(emulated).sum())
    err.inf = int(torch.isinf(emulated).sum())
    err.signal = float(torch.linalg.vector_norm(ref[finite])) ** 2
    d = diff[finite]
    err.noise = float(torch.linalg.vector_norm(d)) ** 2
    err.max_abs_err = _abs_max(d)
    return err
