"""Fixtures for the security tests: small exported programs, built once per session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import crafted  # noqa: E402


@pytest.fixture(scope="session")
def programs(tmp_path_factory) -> dict[str, Path]:
    """``conv_bn`` (static), ``dynamic`` (symbolic batch and side), ``dict_io`` (dict / keyword inputs)."""
    import torch

    d = tmp_path_factory.mktemp("programs")
    x = torch.randn(2, 3, 8, 8)
    batch, side = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("side", min=8, max=256)
    return {
        "conv_bn": crafted.export(d / "conv_bn.pt2", crafted.ConvBN(), (x,)),
        "dynamic": crafted.export(
            d / "dynamic.pt2", crafted.ConvBN(), (x,), dynamic_shapes=({0: batch, 2: side, 3: side},)
        ),
        "dict_io": crafted.export(d / "dict_io.pt2", crafted.DictIO(), (x,), {"d": {"p": x}, "k": torch.randn(2)}),
    }
