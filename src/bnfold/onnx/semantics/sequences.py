"""ONNX sequence ops: the torch dynamo exporter writes ``torch.split`` / ``chunk`` as ``SplitToSequence``
then one ``SequenceAt`` per part (ShuffleNetV2's channel split, LeViT's q / k / v).  A sequence value is a
Python list of tensors; an op that makes one returns it as its one output (``[parts]``)."""

from __future__ import annotations

import numpy as np
import torch

from .values import Ctx, OpImpl, axis, given, ints, scalar


def _rank(v) -> int:
    return v.dim() if isinstance(v, torch.Tensor) else np.asarray(v).ndim


def _sequence(v) -> list:
    if not isinstance(v, (list, tuple)):
        raise ValueError("the input is not a sequence")
    return list(v)


def split_to_sequence(ins, a, c: Ctx):
    """Parts of ``split`` sizes (a 1-D input), of ``split`` elements each, the last one smaller (a scalar),
    or of one element each without ``split`` (its axis dropped unless ``keepdims``)."""
    x = ins[0]
    ax = axis(a.get("axis", 0), x.dim())
    n = x.shape[ax]
    if not given(ins, 1):
        parts = list(torch.split(x, 1, dim=ax))
        return [parts if a.get("keepdims", 1) else [p.squeeze(ax) for p in parts]]
    sizes = ints(ins[1])
    if _rank(ins[1]) == 0:
        if sizes[0] <= 0:
            raise ValueError(f"split size {sizes[0]} is not positive")
        return [list(torch.split(x, sizes[0], dim=ax))]
    if sum(sizes) != n or any(k < 0 for k in sizes):
        raise ValueError(f"split sizes {sizes} do not add up to {n}")
    return [list(torch.split(x, sizes, dim=ax))]


def sequence_at(ins, a, c: Ctx):
    seq, i = _sequence(ins[0]), int(scalar(ins[1]))
    if not -len(seq) <= i < len(seq):
        raise ValueError(f"position {i} is out of range for a sequence of {len(seq)}")
    return seq[i]


def concat_from_sequence(ins, a, c: Ctx):
    """``torch.cat`` of the sequence along ``axis``, or ``torch.stack`` on a new ``axis`` (``new_axis``)."""
    seq = _sequence(ins[0])
    if not seq:
        raise ValueError("the sequence is empty")
    if a.get("new_axis", 0):
        return torch.stack(seq, dim=axis(a["axis"], seq[0].dim() + 1))
    return torch.cat(seq, dim=axis(a["axis"], seq[0].dim()))


SEQUENCES = {
    "SplitToSequence": OpImpl(split_to_sequence, static=(1,)),
    "SequenceAt": OpImpl(sequence_at, static=(1,)),
    "ConcatFromSequence": OpImpl(concat_from_sequence),
    "SequenceConstruct": OpImpl(lambda ins, a, c: [list(ins)]),
    "SequenceLength": OpImpl(lambda ins, a, c: torch.tensor(len(_sequence(ins[0])), dtype=torch.int64)),
}
