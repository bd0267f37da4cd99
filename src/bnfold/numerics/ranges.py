"""Peak magnitudes and plain runs of a :class:`~.runner.Program`: what the fp16 range rewrite calibrates on and
proves with (``bnfold.rescale``).  The program's own steps run in one float dtype, nothing emulated: the same
executors as the audit's runner, without its profile."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable

import torch

from .. import fold_math
from .lazy import LazyConstant, split
from .runner import Program, Step, is_float

#: bytes of a large weight a float64 run converts at a time (:func:`run_plain`): a block of its output channels of
#: at most :data:`bnfold.fold_math.BLOCK_ELEMENTS` float64 elements (256 KiB, in cache; at least one channel).  Larger
#: blocks left more behind in the allocator's heap: a 256 MB model's proof peaked 2 MB over its start with these,
#: 4-8 MB with 1 MiB blocks, 28 MB with 4 MiB ones, in the same time
BLOCK_BYTES = fold_math.BLOCK_ELEMENTS * 8


def run_plain(
    program: Program,
    batches: Iterable[tuple],
    dtype: torch.dtype,
    peaks: dict | None = None,
    group: int = 1,
    seen: Callable[[LazyConstant, torch.Tensor], None] | None = None,
) -> list:
    """The program's outputs on each batch, computed in ``dtype``; ``peaks`` (a dict) gets the largest finite
    magnitude of every float value by name (inputs, every step's outputs), merged over batches.  A large float
    constant (a lazy one, :class:`.lazy.LazyConstant`, or one held of at least :data:`bnfold.fold_math.LARGE_BYTES`
    that no step writes in place) is read, and converted to ``dtype``, for each step that reads it and dropped after
    that step.  In a float64 run (the range rewrite's proof), a layer whose output channels the format places
    (:attr:`.runner.Step.channels`) converts such a weight a block of output channels at a time (:data:`BLOCK_BYTES`
    of float64), so no float64 copy of the whole weight is made; a held weight and a lazy one run the same blocks,
    so a streamed model's run gives the eager one's outputs bit for bit.

    ``group``: how many batches run together, layer by layer (at least 1; the caller sizes it from the cost plan,
    :meth:`bnfold.io.cost.Plan.batches_at_once`): each step runs on every batch of the group before the next step,
    so a large constant is read, converted (a float64 block of channels included) once per step and group, not once
    per batch, while the group's live values are held at once (a program with no such constant runs one batch at a
    time).  Each batch's values are computed by the same kernels on the same inputs as one batch alone, and its peaks
    merged in the batches' order: the outputs and ``peaks`` are those of ``group=1``, bit for bit.

    ``seen(constant, value)``: called with each lazy constant and its value as stored, each time it is read."""
    held, lazy = split(program.constants)
    # held whole: a constant a step writes in place, and one a step's output replaces (a computed weight the program
    # keeps the steps of, or a file's name for two values): deferred, the constant would shadow it.  One a step may
    # write (through a view of it too: the program's ``writes``) is the run's own copy, and the batches then run one
    # at a time, each after the one before, as the program runs them (a group would share what one batch writes)
    writes = program.writes
    written = writes | {v for step in program.steps for v in (*(step.ins if step.mutates else ()), *step.outs) if v}
    at_use = {
        k
        for k, v in held.items()
        if is_float(v) and v.dtype != dtype and _nbytes(v) >= fold_math.LARGE_BYTES and k not in written
    }
    consts = {
        k: v.to(dtype, copy=k in writes) if is_float(v) else (v.clone() if k in writes else v)
        for k, v in held.items()
        if k not in at_use
    }
    deferred = at_use | set(lazy)
    last_use: dict[str, int] = {}
    reads: dict[int, list[str]] = {}
    blocked: dict[int, int] = {}  # step -> the slot of the weight it reads a block of channels at a time
    for i, step in enumerate(program.steps):
        for v in step.ins:
            if v:
                last_use[v] = i
        reads[i] = list(dict.fromkeys(v for v in step.ins if v in deferred))
        w = step.weight
        if dtype == torch.float64 and step.channels and w in deferred and step.ins.count(w) == 1:
            blocked[i] = step.ins.index(w)
    keep = set(program.outputs) | set(consts) | deferred
    free: dict[int, list[str]] = {}
    for v, i in last_use.items():
        if v not in keep:
            free.setdefault(i, []).append(v)

    def stored(v: str) -> torch.Tensor:
        if v not in lazy:
            return held[v]
        value = lazy[v].value()
        if seen is not None:
            seen(lazy[v], value)
        return value

    outputs: list = []
    batches = list(batches)
    # nothing read at use: a group would save nothing and hold more
    size = max(1, int(group)) if deferred and not writes else 1
    for lo in range(0, len(batches), size):
        envs, tops = [], []  # each batch of the group: its values, its peaks (merged in order at the group's end)
        for batch in batches[lo : lo + size]:
            env, top = dict(consts), {} if peaks is not None else None
            for name, x in zip(program.inputs, program.feed(batch)):
                env[name] = x.detach().to(dtype) if is_float(x) else x
                _peak(top, name, env[name])
            envs.append(env)
            tops.append(top)
        for i, step in enumerate(program.steps):
            k = blocked.get(i)
            weight = stored(step.ins[k]) if k is not None else None  # as stored: converted a block at a time
            now = {v: _as(stored(v), dtype) for v in reads[i] if k is None or v != step.ins[k]}  # this step only
            ins = [
                [(now[v] if v in now else env[v]) if v and j != k else None for j, v in enumerate(step.ins)]
                for env in envs
            ]
            del now
            if weight is not None and weight.dtype != dtype and weight.dim() >= 2:
                outs = _by_channels(step, ins, k, weight, dtype)
            else:
                if weight is not None:
                    w = _as(weight, dtype)
                    for one in ins:
                        one[k] = w
                    del w
                outs = []
                for n in range(len(ins)):
                    outs.append(step.run(ins[n], dtype))
                    ins[n] = None  # this batch's inputs to the step go as in a run of one batch
            del ins, weight
            for env, top, got in zip(envs, tops, outs):
                for name, out in zip(step.outs, got):
                    if name:
                        env[name] = out
                        _peak(top, name, out)
                for dead in free.get(i, ()):
                    env.pop(dead, None)
            del outs
        const_outs: dict = {}  # an output the program holds as a constant: read once for the group
        for env, top in zip(envs, tops):
            for o in program.outputs:
                if o not in env and o not in const_outs:
                    const_outs[o] = _as(stored(o), dtype)
            outputs.append([env[o] if o in env else const_outs[o] for o in program.outputs])
            if peaks is not None:
                for name, value in top.items():
                    peaks[name] = max(peaks.get(name, 0.0), value)
        del envs, const_outs
    return outputs


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.to(dtype) if is_float(t) else t


def _by_channels(step: Step, ins: list[list], k: int, weight: torch.Tensor, dtype: torch.dtype) -> list[list]:
    """``step``'s outputs on each batch of a group (``ins``: each batch's inputs to the step) with ``weight`` (as
    stored) at slot ``k``, computed a block of output channels at a time (:attr:`.runner.Step.channels`): each
    block's weight converted to ``dtype`` once, run on every batch of the group while it is converted, a bias sliced
    along its last axis where that axis holds the channels (else it broadcasts), each batch's blocks written into its
    one output.  Where a block's output does not hold its channels as the step says, that batch's step runs whole.
    The blocks run on the calling thread (``torch.set_num_threads(1)`` while they run, restored after): a block is
    small and in cache, and a hand-off of each to the thread pool costs more than it gains (on a loaded 2-core
    machine, a 2048x2048 layer in blocks of 16 channels: 21 ms on one thread, 130-260 ms on two; whole: 37-68 ms)."""
    with _one_thread():
        return _blocks(step, ins, k, weight, dtype)


_THREADS = threading.Lock()
_within = [0, 0]  # [runs inside _one_thread, the thread count the first of them found]


@contextlib.contextmanager
def _one_thread():
    """torch's intra-op threads set to one while the block runs of any thread are inside, and the count the first
    of them found given back when the last leaves (overlapping runs cannot leave the process on one thread).  What
    it cannot give back: torch gives a thread its count when it first runs an op, from the last one set, so a
    caller's thread that first runs torch while blocks run keeps one thread (torch has no count of one thread's
    own to set instead)."""
    with _THREADS:
        if not _within[0]:
            _within[1] = torch.get_num_threads()
            torch.set_num_threads(1)
        _within[0] += 1
    try:
        yield
    finally:
        with _THREADS:
            _within[0] -= 1
            if not _within[0]:
                torch.set_num_threads(_within[1])


def _blocks(step: Step, group: list[list], k: int, weight: torch.Tensor, dtype: torch.dtype) -> list[list]:
    w_axis, out_axis = step.channels
    n = weight.shape[w_axis]
    per = max(1, BLOCK_BYTES // max(1, weight.numel() // n * torch.empty((), dtype=dtype).element_size()))
    b = 2 if step.bias and len(step.ins) > 2 and step.ins[2] == step.bias else None  # its slot (A may be C's value)
    biases = [
        ins[b] if b is not None and is_float(ins[b]) and ins[b].dim() and ins[b].shape[-1] == n else None
        for ins in group
    ]
    outs: list = [None] * len(group)  # each batch's output, written a block at a time
    whole: dict[int, list] = {}  # a batch whose block did not hold its channels: its step's outputs, run whole
    for lo in range(0, n, per):
        m = min(per, n - lo)
        block = weight.narrow(w_axis, lo, m).to(dtype)
        for g, ins in enumerate(group):
            if g in whole:
                continue
            part = list(ins)
            part[k] = block
            if biases[g] is not None:
                part[b] = biases[g].narrow(-1, lo, m)
            ys = step.run(part, dtype)
            del part
            y = ys[0] if len(ys) == 1 else None
            del ys
            if outs[g] is None:
                if not isinstance(y, torch.Tensor) or not y.dim() or y.shape[out_axis] != m:
                    del y
                    ins = list(ins)
                    ins[k] = weight.to(dtype)
                    whole[g] = step.run(ins, dtype)
                    del ins
                    continue
                shape = list(y.shape)
                shape[out_axis] = n
                outs[g] = y.new_empty(shape)
            outs[g].narrow(out_axis, lo, m).copy_(y)
            del y
        del block
    return [whole[g] if g in whole else [out] for g, out in enumerate(outs)]


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
