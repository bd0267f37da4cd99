"""A program's constants rounded to a profile, as :class:`~.runner.Runner` holds them for its emulated run.

The audit makes two runners under one profile (the unfolded program and the folded one) and gives them one
``shared`` dict: a large constant both hold is rounded once.  Two ways to hold "the same" constant:

* the same tensor (the folded program reuses the unfolded one's tensor for an initializer the fold did not change:
  :func:`~.onnx_program.onnx_program`'s ``like``): found by its memory, layout and version;
* the same bytes in another tensor (a weight the unfolded program computes, a standardized weight, that the fold
  wrote as an initializer of its own): found by content, never by name (a hostile file may give two different
  constants one name, or one name to a constant the fold changed).  A constant is compared bit for bit (so ``-0.0``
  and ``0.0``, or two NaN payloads, differ) with the first constant of its layout whose sampled elements equal its
  own, at most once: a file of many constants that share their samples costs one comparison per constant, not one
  per pair.

A float16 constant under a profile that stores fp16 is its own rounding (its float32 copy holds fp16 values): no
rounding pass over it.  Nor over a constant that a step of the program computes again before anything reads it
(:func:`written_first`: the transposed weight of a MatMul, a standardized weight): the emulated run reads that step's
output, never the constant's rounding.
"""

from __future__ import annotations

import torch

from .profiles import Profile

#: float constants of at most this many elements are rounded together (:func:`round_constants`)
ROUNDED_TOGETHER = 1 << 12
#: elements per 64 bytes of float32: where each constant starts in the concatenation (torch aligns an allocation to
#: 64 bytes, and a kernel may compute otherwise from a weight that is not aligned: measured, a 1x1 conv's float32
#: results differ in the last bit for a weight 4 bytes off)
_ALIGN = 16
#: elements read of a large constant to find a constant of the same bytes (:func:`_content_key`)
_SAMPLES = 64


def written_first(program, fused: bool = False) -> frozenset[str]:
    """The constants of ``program`` (a :class:`~.runner.Program`) whose emulated value no run reads: each is the first
    output of exactly one step, and every step that reads it comes after that step (so the run reads the step's
    output: an op returns at least its first one).  ``fused``: the profile fuses Conv+BatchNormalization on fp16
    weights, which reads a conv's weight and bias and its norm's parameters from the constants: those stay."""
    first, read, twice, kept = {}, {}, set(), set()
    for i, step in enumerate(program.steps):
        for v in step.ins:
            if v:
                read.setdefault(v, i)
        for k, v in enumerate(step.outs):
            if v and (v in first or k > 0):
                twice.add(v)
            elif v:
                first[v] = i
        if fused and step.layer == "conv":
            kept.update((step.weight, step.bias))
        if fused and step.norm is not None:
            kept.update(step.norm.params)
    return frozenset(
        v
        for v, i in first.items()
        if v in program.constants and v not in twice and v not in kept and read.get(v, i + 1) > i
    )


def stored_exactly(prof: Profile, dtype: torch.dtype) -> bool:
    """Whether ``prof.round_const`` of a constant stored as ``dtype`` (cast to float32) gives its values back: a
    float16 constant under a profile that stores constants in fp16 and clamps none."""
    return dtype == torch.float16 and prof.const_clamp is None and (prof.fp16_storage or prof.fp16_constants)


def round_constants(
    prof: Profile,
    f32: dict[str, torch.Tensor],
    shared: dict | None = None,
    exact: frozenset = frozenset(),
    by_content: bool = True,
) -> dict[str, torch.Tensor]:
    """``prof.round_const`` of each float32 constant of ``f32``; those named in ``exact`` (:func:`stored_exactly`,
    :func:`written_first`) as they are.  The rounding is elementwise, so the small contiguous ones (most of a model's
    constants by count: biases, statistics, scalars) are rounded in one call over their concatenation, each then a
    view of its part (its own strides) starting at a 64-byte boundary as an allocation of its own would: a model's
    hundreds of them cost a few ops, not two or more each.  A larger or strided one (whose layout a kernel may read)
    is rounded alone, once per tensor, or per content where ``by_content`` (see the module docstring), over the
    runners that share ``shared``."""
    out = {k: f32[k] for k in exact}
    together = [k for k, v in f32.items() if k not in exact and v.numel() <= ROUNDED_TOGETHER and v.is_contiguous()]
    shared = {} if shared is None else shared
    for k in f32.keys() - set(together) - exact:
        out[k] = _rounded(prof, f32[k], shared, by_content)
    if not together:
        return out
    zeros = torch.zeros(_ALIGN - 1)
    fills = [zeros[:n] for n in range(_ALIGN)]  # the padding after a part, by its length
    pieces, starts = [], [0]
    for k in together:
        t = f32[k]
        pad = -t.numel() % _ALIGN
        pieces += [t if t.dim() == 1 else t.reshape(-1), fills[pad]]
        starts.append(starts[-1] + t.numel() + pad)
    flat = prof.round_const(torch.cat(pieces))
    for k, at in zip(together, starts):
        out[k] = flat.as_strided(f32[k].shape, f32[k].stride(), at)  # one op (a split part, then a view: two)
    return out


def _rounded(prof: Profile, t: torch.Tensor, shared: dict, by_content: bool) -> torch.Tensor:
    """The rounding of the large constant ``t``: the one ``shared`` holds of this tensor (keyed by its memory, layout
    and version, holding the tensor: its memory is not reused) or of a tensor of the same bytes, else made now."""
    key = (prof, t.data_ptr(), t.shape, t.stride(), t.dtype, t._version)  # a profile is hashed by its settings
    if key in shared:
        return shared[key][1]
    ckey = _content_key(prof, t) if by_content else None
    first = shared.get(ckey) if ckey is not None else None
    if first is not None and first[0]._version == first[2] and _same_bytes(first[0], t):
        rounded = first[1]
    else:
        rounded = prof.round_const(t)
        if ckey is not None and first is None:  # the first of its samples: the one the others are compared with
            shared[ckey] = (t, rounded, t._version)
    shared[key] = (t, rounded)
    return rounded


def _content_key(prof: Profile, t: torch.Tensor) -> tuple | None:
    """Where ``shared`` files a contiguous float32 constant by content: its profile, shape and :data:`_SAMPLES`
    evenly spaced elements' bits (None for another layout: found by its memory only)."""
    if t.dtype != torch.float32 or not t.is_contiguous() or t.numel() == 0:
        return None
    flat = t.detach().view(-1)
    sample = flat[:: max(1, flat.numel() // _SAMPLES)][:_SAMPLES].view(torch.int32)
    return ("content", prof, tuple(t.shape), tuple(sample.tolist()))


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` and ``b`` (contiguous float32 constants of one shape) hold the same bits."""
    return torch.equal(a.detach().view(torch.int32), b.detach().view(torch.int32))
