"""Per-channel values of several normalizations laid end to end, reduced per normalization.

The risk model (:mod:`bnfold.numerics.risk`) computes a handful of per-channel quantities for every
batch norm of a model; a model has tens to hundreds of them with 16 to 2048 channels each, so one
tensor op over all channels at once replaces hundreds of tiny ones.  :class:`Segments` knows where each
normalization's channels lie and reduces a concatenated tensor to one value per normalization.
"""

from __future__ import annotations

import torch

F64 = torch.float64


class Segments:
    """``lengths[i]`` channels per normalization ``i``, laid end to end."""

    def __init__(self, lengths: list[int]):
        self.n = len(lengths)
        self.sizes, self.total = [int(n) for n in lengths], int(sum(lengths))
        self.lengths = torch.tensor(lengths, dtype=torch.long)
        self.index = torch.repeat_interleave(torch.arange(self.n), self.lengths)  # channel -> its normalization
        starts = torch.cumsum(self.lengths, 0) - self.lengths
        self.local = torch.arange(self.total) - starts[self.index]  # channel -> index within it

    def cat(self, parts: list[torch.Tensor | None], fill: float) -> torch.Tensor:
        """One float64 tensor of ``parts`` (one per normalization, in any float dtype; None: ``fill`` on each of
        its channels), converted once as a whole."""
        if all(p is None for p in parts):
            return torch.full((self.total,), fill, dtype=F64)
        pieces = [
            torch.full((n,), fill, dtype=F64) if p is None else p if p.dim() == 1 else p.reshape(-1)
            for p, n in zip(parts, self.sizes)
        ]
        return torch.cat(pieces).to(F64)

    def spread(self, per_norm) -> torch.Tensor:
        """A value per normalization on each of its channels."""
        return torch.as_tensor(per_norm, dtype=F64)[self.index]

    def sum(self, v: torch.Tensor) -> torch.Tensor:
        return torch.zeros(self.n, dtype=v.dtype).index_add_(0, self.index, v)

    def max(self, v: torch.Tensor, floor: float = -torch.inf) -> torch.Tensor:
        """The largest value per normalization (NaN when it holds one; ``floor`` when it has no channel)."""
        return torch.full((self.n,), floor, dtype=v.dtype).scatter_reduce_(0, self.index, v, "amax")

    def min(self, v: torch.Tensor) -> torch.Tensor:
        return torch.full((self.n,), torch.inf, dtype=v.dtype).scatter_reduce_(0, self.index, v, "amin")

    def all(self, mask: torch.Tensor) -> torch.Tensor:
        return self.sum(mask.to(F64)) == self.lengths.to(F64)

    def argmax(self, v: torch.Tensor) -> torch.Tensor:
        """The channel (within its normalization) of the first largest value per normalization."""
        top = self.max(v)[self.index]
        first = torch.where(v == top, self.local, self.local.numel())
        return torch.full((self.n,), self.local.numel(), dtype=torch.long).scatter_reduce_(0, self.index, first, "amin")
