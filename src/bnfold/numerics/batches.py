"""The audit's inputs as batches: shared by the torch.export and the ONNX audit."""

from __future__ import annotations

import torch

#: random batches drawn when no inputs are given (``bnfold audit`` without --inputs, ``bnfold.audit(model)``)
RANDOM_BATCHES = 8


def as_batches(inputs) -> list[tuple]:
    """The audit's inputs as a list of batches, each a tuple of tensors (one tensor or tuple: one batch)."""
    if isinstance(inputs, torch.Tensor):
        return [(inputs,)]
    if isinstance(inputs, tuple):
        return [inputs]
    batches = list(inputs)
    if not batches:
        raise ValueError("audit needs at least one batch of inputs")
    return [b if isinstance(b, tuple) else tuple(b) if isinstance(b, list) else (b,) for b in batches]
