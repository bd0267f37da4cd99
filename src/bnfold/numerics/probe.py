"""Per-channel ranges of each batch norm's input, in the reference and in the emulated run.

The risk model (:mod:`bnfold.numerics.risk`) reads the overflow headroom of the
intermediates a runtime computes (``x*scale``, ``bias'``, their sum) from these
ranges: for a per-channel affine ``a*x + b`` the largest ``|a*x + b|`` over
``x`` in ``[lo, hi]`` is at ``lo`` or ``hi``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def _extrema(x: torch.Tensor, axis: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel ``(min, max)`` along ``axis`` in ``x``'s dtype (NaN propagated; extrema are exact in any
    dtype).  Two reductions: ``aminmax`` along a dim is many times slower than both (torch 2.13, x86)."""
    others = tuple(d for d in range(x.dim()) if d != axis % x.dim())
    return (x.amin(dim=others), x.amax(dim=others)) if others else (x, x)


def _channel_range(x: torch.Tensor, axis: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Per-channel ``(min, max)`` along ``axis`` as float64 (inf kept, NaN ignored), and the NaN count
    (the slow path of :meth:`NormProbe.of`, for a tensor holding NaN)."""
    x = x.detach()
    channels = x.shape[axis]
    if x.numel() == 0:
        lo = torch.full((channels,), torch.inf, dtype=torch.float64)
        return lo, -lo, 0
    nan = torch.isnan(x)
    lo = _extrema(x.masked_fill(nan, torch.inf), axis)[0]
    hi = _extrema(x.masked_fill(nan, -torch.inf), axis)[1]
    return lo.to(torch.float64).reshape(channels), hi.to(torch.float64).reshape(channels), int(nan.sum())


@dataclass
class NormProbe:
    """The input range of one batch norm (graph node ``node``), per channel, merged over batches."""

    node: str
    lo_ref: torch.Tensor
    hi_ref: torch.Tensor
    lo_emu: torch.Tensor
    hi_emu: torch.Tensor
    nan_emu: int = 0

    @classmethod
    def of(cls, node: str, emulated: torch.Tensor, ref: torch.Tensor, axis: int) -> NormProbe:
        """The ranges of one batch: the four per-channel extrema in one float64 table (reduced in the
        tensors' own dtype, where extrema are exact); NaN, which the reductions propagate, is looked for
        only where the table holds one."""
        if emulated.dim() and emulated.numel() and ref.numel():
            table = torch.stack((*_extrema(ref, axis), *_extrema(emulated, axis)))  # the runner's: no grad
            if not bool(table.isnan().any()):
                return cls(node, *table.to(torch.float64).unbind(), 0)  # lo_ref, hi_ref, lo_emu, hi_emu
        lo_r, hi_r, _ = _channel_range(ref, axis)
        lo_e, hi_e, nan = _channel_range(emulated, axis)
        return cls(node, lo_r, hi_r, lo_e, hi_e, nan)

    def merge(self, other: NormProbe) -> None:
        self.lo_ref = torch.minimum(self.lo_ref, other.lo_ref)
        self.hi_ref = torch.maximum(self.hi_ref, other.hi_ref)
        self.lo_emu = torch.minimum(self.lo_emu, other.lo_emu)
        self.hi_emu = torch.maximum(self.hi_emu, other.hi_emu)
        self.nan_emu += other.nan_emu
