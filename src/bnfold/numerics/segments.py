"""Per-channel values of several normalizations laid end to end, reduced per normalization.

The risk model (:mod:`bnfold.numerics.risk`) computes a handful of per-channel quantities for every
batch norm of a model; a model has tens to hundreds of them with 16 to 2048 channels each, so one
tensor op over all channels at once replaces hundreds of tiny ones.  :class:`Segments` knows where each
normalization's channels lie and reduces a concatenated tensor to one value per normalization.  The
channels are a tensor's last dim: leading dims (several quantities, or one row per eps) are reduced
in the same op, each row on its own.
"""

from __future__ import annotations

import numpy as np
import torch

F64 = torch.float64


class Segments:
    """``lengths[i]`` channels per normalization ``i``, laid end to end."""

    def __init__(self, lengths: list[int]):
        self.n = len(lengths)
        self.sizes, self.total = [int(n) for n in lengths], int(sum(lengths))
        # built with numpy: its few small ops cost a fraction of torch's dispatch of each
        sizes = np.array(self.sizes, dtype=np.int64)
        self.lengths = torch.from_numpy(sizes)
        self.index = torch.from_numpy(np.repeat(np.arange(self.n), sizes))  # channel -> its normalization
        self.local = torch.from_numpy(np.arange(self.total) - np.repeat(np.cumsum(sizes) - sizes, sizes))  # in it

    def stack(self, rows: list[list[torch.Tensor | None]], fills: list[float]) -> torch.Tensor:
        """``[len(rows), total]`` float64 of per-channel parts: ``rows[r]`` holds one 1-D tensor per normalization
        (in any float dtype; None: ``fills[r]`` on each of its channels); all rows in one concatenation,
        converted once (float32 and float16 convert exactly)."""
        # the fills in the parts' dtype (0, 1 and NaN are exact in any): torch.cat of mixed dtypes is ~10x slower
        dtype = next((p.dtype for parts in rows for p in parts if p is not None), F64)
        dtype = dtype if dtype.is_floating_point else F64
        filled: dict[tuple, torch.Tensor] = {}  # one fill tensor per (channel count, value)
        pieces = []
        for parts, fill in zip(rows, fills):
            missing = [p is None for p in parts]
            if all(missing):  # one fill for the row (no normalization: empty)
                pieces.append(torch.full((self.total,), fill, dtype=dtype))
            elif not any(missing):
                pieces += parts
            else:
                for p, n in zip(parts, self.sizes):
                    if p is None:
                        p = filled.get((n, fill))
                        if p is None:
                            p = filled[(n, fill)] = torch.full((n,), fill, dtype=dtype)
                    pieces.append(p)
        return torch.cat(pieces).to(F64).view(len(rows), self.total)

    def spread(self, per_norm) -> torch.Tensor:
        """A float64 value per normalization on each of its channels (``per_norm`` may have leading dims)."""
        return torch.from_numpy(np.repeat(np.asarray(per_norm, dtype=np.float64), self.sizes, axis=-1))

    def _index_like(self, v: torch.Tensor) -> torch.Tensor:
        return self.index if v.dim() == 1 else self.index.expand(v.shape)

    def _out(self, v: torch.Tensor, fill: float, dtype=None) -> torch.Tensor:
        return torch.full((*v.shape[:-1], self.n), fill, dtype=dtype or v.dtype)

    def sum(self, v: torch.Tensor) -> torch.Tensor:
        return torch.zeros((*v.shape[:-1], self.n), dtype=v.dtype).index_add_(-1, self.index, v)

    def max(self, v: torch.Tensor, floor: float = -torch.inf) -> torch.Tensor:
        """The largest value per normalization (NaN when it holds one; ``floor`` when it has no channel)."""
        return self._out(v, floor).scatter_reduce_(-1, self._index_like(v), v, "amax")

    def min(self, v: torch.Tensor) -> torch.Tensor:
        return self._out(v, torch.inf).scatter_reduce_(-1, self._index_like(v), v, "amin")

    def all(self, mask: torch.Tensor) -> torch.Tensor:
        return self.sum(mask.to(F64)) == self.lengths.to(F64)

    def argmax(self, v: torch.Tensor, top: torch.Tensor | None = None) -> torch.Tensor:
        """The channel (within its normalization) of the first largest value per normalization (``top``: its
        :meth:`max`, when known)."""
        top = self.max(v) if top is None else top
        first = torch.where(v == top.index_select(-1, self.index), self.local, self.total)
        return self._out(v, self.total, torch.long).scatter_reduce_(-1, self._index_like(v), first, "amin")
