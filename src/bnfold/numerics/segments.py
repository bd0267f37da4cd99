"""Per-channel values of several normalizations laid end to end, reduced per normalization.

The risk model (:mod:`bnfold.numerics.risk`) computes a handful of per-channel quantities for every
batch norm of a model; a model has tens to hundreds of them with 16 to 2048 channels each, so one
tensor op over all channels at once replaces hundreds of tiny ones.  :class:`Segments` knows where each
normalization's channels lie and reduces a concatenated tensor to one value per normalization.  The
channels are a tensor's last dim: leading dims (several quantities, or one row per eps) are reduced
in the same op, each row on its own.

The bookkeeping and the largest/smallest values use numpy (its ``reduceat`` over contiguous segments: the
extremes are exact in any order, and a numpy op costs a fraction of a dispatched torch op at these
sizes); sums stay in torch (:meth:`Segments.sum` adds in channel order).
"""

from __future__ import annotations

import functools

import numpy as np
import torch

F64 = torch.float64


class Segments:
    """``lengths[i]`` channels per normalization ``i``, laid end to end."""

    def __init__(self, lengths: list[int]):
        self.n = len(lengths)
        self.sizes, self.total = [int(n) for n in lengths], int(sum(lengths))
        sizes = np.array(self.sizes, dtype=np.int64)
        starts = np.cumsum(sizes) - sizes
        self.lengths = torch.from_numpy(sizes)
        self._filled = sizes > 0  # the normalizations with channels: reduceat reads only their starts
        self._starts = starts[self._filled]
        self._local = np.arange(self.total) - np.repeat(starts, sizes)  # channel -> its index in its normalization

    def stack(self, rows: list[list[torch.Tensor | None]], fills: list[float]) -> torch.Tensor:
        """``[len(rows), total]`` float64 of per-channel parts: ``rows[r]`` holds one 1-D tensor per normalization
        (in any float dtype; None: ``fills[r]`` on each of its channels); all rows in one concatenation,
        converted once (float32 and float16 convert exactly); a constant, even where a part requires grad."""
        # the fills in the parts' dtype (0, 1 and NaN are exact in any): torch.cat of mixed dtypes is ~10x slower
        dtype = next((p.dtype for parts in rows for p in parts if p is not None), F64)
        dtype = dtype if dtype.is_floating_point else F64
        full = functools.cache(lambda n, fill: torch.full((n,), fill, dtype=dtype))  # one per (channels, value)
        pieces = []
        for parts, fill in zip(rows, fills):
            if all(p is None for p in parts):  # one fill for the row (no normalization: empty)
                pieces.append(full(self.total, fill))
            else:
                pieces += [full(n, fill) if p is None else p for p, n in zip(parts, self.sizes)]
        return torch.cat(pieces).detach().to(F64).view(len(rows), self.total)

    def spread(self, per_norm) -> torch.Tensor:
        """A float64 value per normalization on each of its channels (``per_norm`` may have leading dims)."""
        return torch.from_numpy(np.repeat(np.asarray(per_norm, dtype=np.float64), self.sizes, axis=-1))

    def _reduce(self, ufunc: np.ufunc, v: np.ndarray, empty) -> np.ndarray:
        """``ufunc`` over each normalization's channels (the last dim of ``v``); ``empty`` without channels."""
        if self._starts.size == self.n:
            return ufunc.reduceat(v, self._starts, axis=-1)
        out = np.full((*v.shape[:-1], self.n), empty, dtype=v.dtype)
        out[..., self._filled] = ufunc.reduceat(v, self._starts, axis=-1)
        return out

    def sum(self, v: torch.Tensor) -> torch.Tensor:
        """The sum per normalization, added in channel order (0 when it has no channel)."""
        # unsafe: no check that the lengths add up to the channels (they do by construction)
        lengths = self.lengths.expand(*v.shape[:-1], self.n)
        return torch.segment_reduce(v, "sum", lengths=lengths, axis=v.dim() - 1, unsafe=True)

    def max(self, v: torch.Tensor, floor: float = -np.inf) -> torch.Tensor:
        """The largest value per normalization, at least ``floor`` (NaN when it holds one; ``floor`` when it has
        no channel)."""
        top = self._reduce(np.maximum, v.numpy(), floor)
        return torch.from_numpy(top if floor == -np.inf else np.maximum(top, floor))

    def argmax(self, v: torch.Tensor, top: torch.Tensor | None = None) -> torch.Tensor:
        """The channel (within its normalization) of the first largest value per normalization (``top``: its
        :meth:`max`, when known; ``total`` where none equals it: NaN, or no channel)."""
        top = self.max(v) if top is None else top
        first = np.where(v.numpy() == np.repeat(top.numpy(), self.sizes, axis=-1), self._local, self.total)
        return torch.from_numpy(self._reduce(np.minimum, first, self.total))
