"""The hand-made baseline for normalization affines: how many of a model's affine normalizations (LayerNorm,
GroupNorm, RMSNorm, InstanceNorm with ``affine``, and the library classes built on them: timm's ``LayerNorm2d``,
``GroupNorm1``, ``LayerNorm2dNoBias``, ``RmsNorm``; torchvision's ``LayerNorm2d``...) a hand can fold into the layers
that read their output, measured with hooks on one eval pass, independent of bnfold's code (the counterpart of
``library_models.hand_foldable`` for BatchNorms).

Such a normalization's statistics stay; only its elementwise affine ``y = n * w + b`` can go, and only forward:
nothing before it can take it, since the statistics would see the change.  One call of a normalization module counts
as hand-foldable when

1. its output is an affine of its parameters at all: the module run in float64 with ``w`` (or, lacking a weight,
   ``b``) set to ``c`` and to ``-c`` moves the output by opposite amounts (an activation fused after the affine, as
   in timm's ``GroupNormAct``, fails this; such a call is kept);
2. at least one layer module reads it (Linear, conv, transposed conv, or ``nn.MultiheadAttention``, whose query,
   key and value go through linear input projections), and every one that reads it (forward pre-hooks: an input of
   the layer shares the output's storage) reads it as is: the output tensor or a view of its storage (``flatten``,
   ``permute``, indexing, eval-mode dropout), not written in place since (same version counter);
3. each such layer sees one affine element per input channel (the last axis of a Linear's or an attention's input,
   the channel axis of a conv's): the index of each output element's affine element, read through the layer input's
   view of the storage, is constant along every other axis;
4. each such layer takes the shift ``b`` exactly: a Linear or an attention always; a conv when it has no padding
   (``padding`` all 0, ``"valid"``, or ``"same"`` with a 1-wide kernel) or pads by repeating its input
   (``padding_mode`` not ``"zeros"``); a transposed conv when its kernel and stride are 1.  A normalization with no
   shift (no bias, or an all-zero one) passes this for any layer: a scale commutes with zero padding.

Every other call is kept.  The rule demands more than a hand can always do where it cannot see (a value read both
by a layer and by a functional op, such as a residual ``+``, counts as read by the layer only), and less where the
output reaches a layer only through a copy (``reshape`` of a permuted tensor, pooling, ``F.fold``): a fold there is
not required.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.func import functional_call

#: the layers a hand folds an input affine into: their input projection is linear per input channel
LAYERS = (nn.modules.conv._ConvNd, nn.Linear, nn.MultiheadAttention)
NORM_CLASSES = (nn.LayerNorm, nn.GroupNorm, nn.modules.instancenorm._InstanceNorm) + (
    (nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()
)


def is_affine_norm(m: nn.Module) -> bool:
    """A normalization module other than a BatchNorm that has its own ``weight`` or ``bias`` parameter (a torch norm
    class, or a class named ``...Norm...`` as timm's ``RmsNorm``)."""
    if isinstance(m, nn.modules.batchnorm._BatchNorm):
        return False
    named = isinstance(m, NORM_CLASSES) or any("Norm" in c.__name__ for c in type(m).__mro__[:-1])
    own = dict(m.named_parameters(recurse=False))
    return named and (own.get("weight") is not None or own.get("bias") is not None)


@dataclass
class _Call:
    """One call of a normalization module: its input, its output (kept alive so that no later tensor reuses the
    storage) and the output's version, and the layers that read it."""

    module: nn.Module
    args: tuple
    out: torch.Tensor
    version: int
    readers: list = field(default_factory=list)  #: (layer, its input tensor, whether it reads the output as is)


def run_hooked(model: nn.Module, x: torch.Tensor, hooks: list) -> None:
    """One eval pass of ``model`` on ``x`` with the forward ``hooks`` registered on it, removed after."""
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hooks:
            h.remove()


def hand_foldable_affines(model: nn.Module, x: torch.Tensor) -> tuple[int, int]:
    """(calls of affine normalization modules, those whose affine a hand can fold): see the module docstring."""
    calls: list[_Call] = []
    hooks = []

    def on_norm(m, args, out):
        if isinstance(out, torch.Tensor):
            calls.append(_Call(m, args, out, out._version))

    def on_layer(m, args):
        for t in {id(a): a for a in args if isinstance(a, torch.Tensor)}.values():
            ptr = t.untyped_storage().data_ptr()
            for c in calls:
                if c.out.untyped_storage().data_ptr() == ptr:
                    c.readers.append((m, t, t._version == c.version and t.dtype == c.out.dtype))

    for m in model.modules():
        if is_affine_norm(m):
            hooks.append(m.register_forward_hook(on_norm))
        elif isinstance(m, LAYERS):
            hooks.append(m.register_forward_pre_hook(on_layer))
    run_hooked(model, x, hooks)
    with torch.no_grad():
        return len(calls), sum(_foldable(c) for c in calls)


def _foldable(call: _Call) -> bool:
    if not call.readers or not all(as_is for _, _, as_is in call.readers):
        return False
    index = affine_index(call.module, call.args)
    if index is None:
        return False
    shift = _has_shift(call.module)
    storage = _index_storage(call.out, index)
    return all(_per_channel(layer, storage, t) and (not shift or takes_shift(layer)) for layer, t, _ in call.readers)


def _has_shift(norm: nn.Module) -> bool:
    bias = dict(norm.named_parameters(recurse=False)).get("bias")
    return bias is not None and bool(bias.detach().ne(0).any())


def affine_index(norm: nn.Module, args: tuple) -> torch.Tensor | None:
    """For each element of the module's output, 1 + the flat index of the affine element it uses (0 where the
    normalized value is 0, so the index cannot be read); ``None`` when the output is not an affine of ``w`` (or
    ``b``).  Measured in float64 with the parameters replaced (``functional_call``)."""
    twin = copy.deepcopy(norm).double()
    own = dict(twin.named_parameters(recurse=False))
    args = tuple(a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
    name = "weight" if own.get("weight") is not None else "bias"
    neutral = {k: (torch.ones_like(p) if k == "weight" else torch.zeros_like(p)) for k, p in own.items()}
    codes = torch.arange(1, own[name].numel() + 1, dtype=torch.float64).view(own[name].shape)

    def run(value):
        return functional_call(twin, {**neutral, name: value}, args)

    zero = run(torch.zeros_like(codes))
    unit, up, down = run(torch.ones_like(codes)) - zero, run(codes) - zero, run(-codes) - zero
    scale = up.abs().max().clamp_min(1.0)
    if not torch.allclose(down, -up, rtol=1e-9, atol=1e-9 * float(scale)):
        return None
    readable = unit.abs() > 1e-6 * unit.abs().max().clamp_min(1e-30)
    ratio = torch.where(readable, up / torch.where(readable, unit, torch.ones_like(unit)), torch.zeros_like(up))
    return ratio.round().long()


def _index_storage(out: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """A flat tensor laid out as ``out``'s storage, holding ``index`` where ``out`` lies (0 elsewhere)."""
    flat = torch.zeros(out.untyped_storage().nbytes() // out.element_size(), dtype=torch.long)
    flat.as_strided(out.shape, out.stride(), out.storage_offset()).copy_(index)
    return flat


def _per_channel(layer: nn.Module, storage: torch.Tensor, t: torch.Tensor) -> bool:
    """The layer input ``t`` (a view of the storage) has one affine element per input channel."""
    seen = storage.as_strided(t.shape, t.stride(), t.storage_offset())
    if isinstance(layer, (nn.Linear, nn.MultiheadAttention)):
        axis = -1
    else:
        axis = 1 if seen.dim() == len(layer.kernel_size) + 2 else 0
    rows = seen.movedim(axis, 0).reshape(seen.shape[axis], -1)
    known = rows > 0
    first = torch.where(known, rows, torch.full_like(rows, -1)).max(dim=1, keepdim=True).values
    return bool(((rows == first) | ~known).all())


def takes_shift(layer: nn.Module) -> bool:
    """Whether the layer takes a per-input-channel shift of its input exactly (rule 4 of the module docstring)."""
    if isinstance(layer, (nn.Linear, nn.MultiheadAttention)):
        return True
    if isinstance(layer, nn.modules.conv._ConvTransposeNd):
        return all(k == 1 for k in layer.kernel_size) and all(s == 1 for s in layer.stride)
    if layer.padding_mode != "zeros":
        return True
    if layer.padding == "valid":
        return True
    if layer.padding == "same":
        return all(k == 1 for k in layer.kernel_size)
    return all(p == 0 for p in layer.padding)
