"""timm's own model classes for the re-parameterization tests: imported through the one helper that makes
torchvision's model code importable next to the CPU torch (:mod:`library_models`), a skip where timm is not
installed; BatchNorm statistics calibrated by a few train-mode passes."""

from __future__ import annotations

import pytest
import torch

from library_models import import_timm


def timm():
    """The timm package, or a skip when it is not installed."""
    module = import_timm()
    if module is None:
        pytest.skip("timm is not installed")
    return module


def calibrated(model: torch.nn.Module, shape, seed: int = 0, passes: int = 2) -> torch.nn.Module:
    """``model`` with BatchNorm running statistics from ``passes`` train-mode batches of ``shape``, in eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.train()
        for _ in range(passes):
            model(torch.randn(shape, generator=g))
    return model.eval()
