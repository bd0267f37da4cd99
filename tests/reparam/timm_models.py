"""timm's own model classes for the tests (timm is pinned and installed ``--no-deps``): no download,
``pretrained=False``, BatchNorm statistics calibrated by a few train-mode passes.

timm imports torchvision, whose meta registrations look for the ``torchvision::nms`` / ``qnms``
schemas; the registry's torchvision is a CUDA build whose C++ ops do not load next to the CPU torch,
so the two schemas are defined here first (the model code needs neither op)."""

from __future__ import annotations

import pytest
import torch

_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_LIBRARIES = []  # a Library drops its definitions when it is collected


def _define_torchvision_schemas() -> None:
    for name, schema in _SCHEMAS.items():
        try:
            getattr(torch.ops.torchvision, name)
        except (AttributeError, RuntimeError):
            lib = torch.library.Library("torchvision", "FRAGMENT")  # another helper may define the others
            lib.define(schema)
            _LIBRARIES.append(lib)


def timm():
    """The timm package, or a skip when it is not installed."""
    _define_torchvision_schemas()
    return pytest.importorskip("timm", reason="timm is not installed")


def calibrated(model: torch.nn.Module, shape, seed: int = 0, passes: int = 2) -> torch.nn.Module:
    """``model`` with BatchNorm running statistics from ``passes`` train-mode batches of ``shape``, in eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.train()
        for _ in range(passes):
            model(torch.randn(shape, generator=g))
    return model.eval()
