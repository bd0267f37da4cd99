"""Exact lowering of what cannot fold: an eval BatchNorm becomes ``x * scale + shift``.

A batch norm that no rule could fold (e.g. a pre-activation BN before a ReLU)
stays in the model, and a backend that rebuilds it with its own epsilon
(ExecuTorch's QNN batch-norm builder uses 1e-9) breaks on near-zero-variance
channels.  Lowered, its scale and shift are computed here in float64 with the
model's own eps and cast once (checked) to the input's dtype: no backend can
recompute them differently.  Opt-in (``lower_unfoldable=True``).
"""

from __future__ import annotations

import numpy as np
import torch

from .. import fold_math
from ..fold_math import FoldError
from ..report import Lowered
from .edit import broadcast_shape
from .graph import GraphAdapter, Norm


def lower_unfoldable(graph: GraphAdapter, why, keep=None) -> tuple[list[Lowered], dict]:
    """Lower every surviving eval batch norm whose statistics are constants (and, if given, ``keep(norm)``).

    ``why(norm)`` says why it did not fold: ``(reason, code)``.  Returns the lowered entries and,
    for the norms that could not be lowered either, why not.
    """
    lowered, refused = [], {}
    for norm in list(graph.norms()):
        if norm.affine_only or norm.problem or (keep is not None and not keep(norm)):
            continue
        reason, code = why(norm)
        entry = Lowered(graph.norm_label(norm), reason, graph.node_name(norm.node), code)  # named before it goes
        why_not = _lower(graph, norm)
        if why_not:
            refused[norm.node] = why_not
            continue
        lowered.append(entry)
    return lowered, refused


def _lower(graph: GraphAdapter, norm: Norm) -> str:
    if norm.statistics_used or norm.output is None:
        return "not lowered: its statistics outputs are used" if norm.statistics_used else ""
    info = graph.shape_info(norm.input)
    if info.rank is None or info.dtype is None:
        return "not lowered: the rank or dtype of its input is unknown"
    tensors = {}
    for role in ("weight", "bias", "mean", "var"):
        value = getattr(norm, role)
        tensors[role] = None if value is None else graph.constant(value)
        if value is not None and tensors[role] is None:
            return f"not lowered: its {role} is not a constant"
    try:
        aff = fold_math.batch_norm_affine(tensors["mean"], tensors["var"], norm.eps, tensors["weight"], tensors["bias"])
        dtype = _torch_dtype(info.dtype)
        scale = fold_math.cast_checked(aff.scale, dtype, "lowered scale")
        shift = fold_math.cast_checked(aff.shift, dtype, "lowered shift")
    except FoldError as err:
        return f"not lowered: {err}"
    shape = broadcast_shape(scale.numel(), norm.axis, info.rank, graph.full_rank_constants)
    graph.lower_norm(norm, scale.reshape(shape), shift.reshape(shape))
    return ""


def _torch_dtype(dtype) -> torch.dtype:
    """A torch dtype from a torch or numpy dtype (the ONNX adapter reports numpy ones)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    return torch.from_numpy(np.zeros(0, dtype=dtype)).dtype
