from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import cli_helpers as h  # noqa: E402


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, Path]:
    """Tiny exported programs, built once: conv+bn (foldable), bn only (skipped), conv only, dynamic shapes."""
    import torch

    d = tmp_path_factory.mktemp("models")
    batch, side = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("side", min=8, max=256)
    return {
        "conv_bn": h.export_to(d / "conv_bn.pt2", h.ConvBN()),
        "bn_only": h.export_to(d / "bn_only.pt2", h.BNOnly()),
        "conv": h.export_to(d / "conv.pt2", h.ConvReLU()),
        "dynamic": h.export_to(
            d / "dynamic.pt2",
            h.Dynamic(),
            torch.randn(4, 3, 16, 16),
            dynamic_shapes=({0: batch, 2: side, 3: side},),
        ),
        "str_input": h.export_str_input(d / "str_input.pt2"),
    }


@pytest.fixture(scope="session")
def long_names(tmp_path_factory) -> dict[str, Path]:
    """:class:`cli_helpers.LongNames` with batch 1 as ``.pt2`` and as ONNX from both exporters (``onnx_ts``,
    ``onnx_dynamo``)."""
    import torch

    d = tmp_path_factory.mktemp("long_names")
    x = torch.randn(1, 3, 8, 8)
    return {
        "pt2": h.export_to(d / "m.pt2", h.LongNames(), x),
        "onnx_ts": h.export_onnx_to(d / "ts.onnx", h.LongNames(), x, dynamo=False),
        "onnx_dynamo": h.export_onnx_to(d / "dynamo.onnx", h.LongNames(), x, dynamo=True),
    }


@pytest.fixture
def run(capsys):
    """``run(*argv) -> (exit code, stdout, stderr)`` through ``bnfold.cli.main`` in this process."""
    from bnfold.cli import main

    def _run(*argv):
        code = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err

    return _run
