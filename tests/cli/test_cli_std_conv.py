"""Weight standardization (timm's ``ScaledStdConv2d``) saved to ``.pt2`` and folded through the CLI.

A loaded program names every output of a batch norm, read or not (``getitem`` nodes with no reader); the
standardization must still fold, leave no norm and remove the weight it was computed from."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cli_helpers as h


class StdConv(nn.Module):
    """A conv whose weight is standardized per output channel like timm's ``ScaledStdConv2d``."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cout, cin, 3, 3))
        self.gain = nn.Parameter(torch.rand(cout, 1, 1, 1) + 0.5)
        self.bias = nn.Parameter(torch.randn(cout))

    def forward(self, x):
        cout = self.weight.shape[0]
        w = F.batch_norm(
            self.weight.reshape(1, cout, -1), None, None, weight=(self.gain * 0.3).reshape(-1), training=True, eps=1e-5
        ).reshape_as(self.weight)
        return F.conv2d(x, w, self.bias, padding=1)


class TwoStdConvs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = StdConv(3, 8), StdConv(8, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@pytest.mark.parametrize("decomposed", [False, True], ids=["default", "decomposed"])
def test_standardized_weights_fold_through_the_cli(run, tmp_path, decomposed):
    torch.manual_seed(0)
    model, x = TwoStdConvs().eval(), torch.randn(2, 3, 8, 8)
    ep = torch.export.export(model, (x,))
    if decomposed:
        ep = ep.run_decompositions()
    src, dst, rep = tmp_path / "m.pt2", tmp_path / "f.pt2", tmp_path / "r.json"
    torch.export.save(ep, str(src))
    code, _, err = run("fold", src, "-o", dst, "--report", rep)
    assert code == 0, err
    report = json.loads(rep.read_text())
    assert [f["rule"] for f in report["folded"]] == ["constant", "constant"]
    assert report["skipped"] == []
    assert report["summary"]["params_saved"] >= 0
    folded = torch.export.load(str(dst))
    assert h.norm_count(folded) == 0
    with torch.no_grad():
        ref = model.double()(x.double())
        got = folded.module()(x).double()
    assert (got - ref).abs().max() <= 1e-5 * ref.abs().max() + 1e-6


class StatsReadStdConv(StdConv):
    """The standardization's mean is an output too: the normalization cannot go, so it must not fold."""

    def forward(self, x):
        cout = self.weight.shape[0]
        out, mean, _ = torch.ops.aten._native_batch_norm_legit.no_stats(
            self.weight.reshape(1, cout, -1), None, None, True, 0.0, 1e-5
        )
        return F.conv2d(x, out.reshape_as(self.weight), self.bias, padding=1), mean


def test_standardization_whose_statistics_are_read_does_not_fold(run, tmp_path):
    torch.manual_seed(0)
    model, x = StatsReadStdConv(3, 8).eval(), torch.randn(2, 3, 8, 8)
    src, dst, rep = tmp_path / "m.pt2", tmp_path / "f.pt2", tmp_path / "r.json"
    torch.export.save(torch.export.export(model, (x,)), str(src))
    code, _, err = run("fold", src, "-o", dst, "--report", rep)
    assert code == 0, err
    report = json.loads(rep.read_text())
    assert [f["rule"] for f in report["folded"] if f["rule"] == "constant"] == []
    assert [s["code"] for s in report["skipped"]] == ["constant_norm"]
    assert report["summary"]["params_saved"] >= 0
