"""Peak magnitudes and plain runs of a :class:`~.runner.Program`: what the fp16 range rewrite calibrates on and
proves with (``bnfold.rescale``).  The program's own steps run in one float dtype, nothing emulated: the same
executors as the audit's runner, without its profile."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .lazy import split
from .runner import Program, is_float


def run_plain(program: Program, batches: Iterable[tuple], dtype: torch.dtype, peaks: dict | None = None) -> list:
    """The program's outputs on each batch, computed in ``dtype``; ``peaks`` (a dict) gets the largest finite
    magnitude of every float value by name (inputs, every step's outputs), merged over batches.  A lazy constant
    (:class:`.lazy.LazyConstant`) is read for each step that reads it and dropped after that step."""
    held, lazy = split(program.constants)
    consts = {k: v.to(dtype) if is_float(v) else v for k, v in held.items()}
    last_use: dict[str, int] = {}
    reads: dict[int, list[str]] = {}
    for i, step in enumerate(program.steps):
        for v in step.ins:
            if v:
                last_use[v] = i
        reads[i] = list(dict.fromkeys(v for v in step.ins if v in lazy))
    keep = set(program.outputs) | set(consts) | set(lazy)
    free: dict[int, list[str]] = {}
    for v, i in last_use.items():
        if v not in keep:
            free.setdefault(i, []).append(v)
    outputs = []
    for batch in batches:
        env = dict(consts)
        for name, x in zip(program.inputs, program.feed(batch)):
            env[name] = x.detach().to(dtype) if is_float(x) else x
            _peak(peaks, name, env[name])
        for i, step in enumerate(program.steps):
            now = {v: lazy[v].load(dtype) for v in reads[i]}  # held for this step only
            ins = [(now[v] if v in now else env[v]) if v else None for v in step.ins]
            del now
            outs = step.run(ins, dtype)
            del ins
            for name, out in zip(step.outs, outs):
                if name:
                    env[name] = out
                    _peak(peaks, name, out)
            del outs
            for dead in free.get(i, ()):
                env.pop(dead, None)
        outputs.append([env[o] if o in env else lazy[o].load(dtype) for o in program.outputs])
    return outputs


def _peak(peaks: dict | None, name: str, value) -> None:
    if peaks is None or not is_float(value) or value.numel() == 0:
        return
    a = value.detach().abs().reshape(-1)  # flat: a mask indexes tensors of at most 64 dims, a file's may have more
    finite = a[torch.isfinite(a)]
    top = float(finite.max()) if finite.numel() else float("inf")
    if not torch.isfinite(a).all():
        top = float("inf")
    peaks[name] = max(peaks.get(name, 0.0), top)


def relative_error(reference: list, other: list) -> float:
    """The largest ``max |a - b| / max |a|`` over the outputs of every batch (float64); inf where shapes differ or a
    value is not finite in one run alone."""
    worst = 0.0
    for ref_batch, got_batch in zip(reference, other, strict=True):
        for a, b in zip(ref_batch, got_batch, strict=True):
            if not is_float(a):
                if not torch.equal(a, b):
                    return float("inf")
                continue
            if a.shape != b.shape:
                return float("inf")
            a, b = a.double(), b.double()
            both = torch.isfinite(a) & torch.isfinite(b)
            if not torch.equal(torch.isfinite(a), torch.isfinite(b)):
                return float("inf")
            scale = float(a[both].abs().max()) if both.any() else 0.0
            diff = float((a[both] - b[both]).abs().max()) if both.any() else 0.0
            worst = max(worst, diff / scale if scale > 0 else diff)
    return worst


def fresh_batches(batches: list[tuple], seed: int = 0) -> list[tuple]:
    """New batches shaped like ``batches``: float inputs drawn from a normal distribution with each input's mean and
    spread, integer inputs uniform in each input's range, others as they are."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for batch in batches:
        fresh = []
        for x in batch:
            if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel():
                d = x.detach().double()
                y = torch.randn(x.shape, generator=gen, dtype=torch.float64) * d.std(unbiased=False) + d.mean()
                fresh.append(y.to(x.dtype))
            elif isinstance(x, torch.Tensor) and x.dtype not in (torch.bool,) and not x.is_complex() and x.numel():
                lo, hi = int(x.min()), int(x.max())
                fresh.append(torch.randint(lo, hi + 1, x.shape, generator=gen, dtype=x.dtype))
            else:
                fresh.append(x)
        out.append(tuple(fresh))
    return out
