"""``report.skipped`` holds normalizations only (issue 18): a residual add or another elementwise op
that stays is never a skipped normalization and never fails ``check --strict``."""

from __future__ import annotations

import os
import subprocess
import sys

import torch
import torch.nn as nn

import bnfold
from bnfold_testutil import assert_matches, export, norm_nodes, randomize_bn, reference, run


class ResidualNoNorm(nn.Module):
    """Residual blocks without any normalization (conv -> relu -> conv, added back, twice), then a
    hardswish (spelled out: its ``/ 6`` has no layer to go to)."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1)) for _ in range(2)
        )

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return (x * torch.clamp(x + 3, 0, 6) / 6).mean((2, 3))  # hardswish, spelled out


def _conv_bn(cin, cout, k=3, stride=1, groups=1):
    """torchvision's Conv2dNormActivation as MobileNetV2 writes it."""
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU6(inplace=True),
    )


class InvertedResidual(nn.Module):
    """torchvision's MobileNetV2 block: expand (1x1), depthwise (3x3), project (1x1 + BN), residual."""

    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = cin * expand
        self.use_res_connect = stride == 1 and cin == cout
        layers = [_conv_bn(cin, hidden, k=1)] if expand != 1 else []
        layers += [_conv_bn(hidden, hidden, stride=stride, groups=hidden), nn.Conv2d(hidden, cout, 1, bias=False)]
        layers.append(nn.BatchNorm2d(cout))
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        if self.use_res_connect:
            return x + self.conv(x)
        return self.conv(x)


class MobileNetV2ish(nn.Module):
    def __init__(self):
        super().__init__()
        blocks = [InvertedResidual(8, 8, 1, 1), InvertedResidual(8, 12, 2, 6), InvertedResidual(12, 12, 1, 6)]
        blocks.append(InvertedResidual(12, 12, 1, 6))
        self.features = nn.Sequential(_conv_bn(3, 8, stride=2), *blocks, _conv_bn(12, 16, k=1))
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(16, 5))

    def forward(self, x):
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


def _calibrated(model: nn.Module, x: torch.Tensor) -> nn.Module:
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.momentum = None  # running statistics: the plain average of the passes
    model.train()
    with torch.no_grad():
        for i in range(3):
            model(x + 0.1 * i)
    return model.eval()


def test_residual_model_without_normalization_skips_nothing_and_passes_strict(tmp_path):
    model, x = ResidualNoNorm().eval(), torch.randn(2, 4, 8, 8)
    ep = export(model, (x,))
    result = bnfold.fold(ep)
    report = result.report
    assert not report.skipped, report  # no normalization: nothing can be a skipped one
    assert not report.folded and not report.kept_ops, report
    assert_matches(run(result.model, x), reference(model, x))
    check = bnfold.check(ep)
    assert check.ok and check.strict_ok
    path = tmp_path / "residual.pt2"
    torch.export.save(ep, str(path))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "-m", "bnfold", "check", "--strict", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_foldable_elementwise_op_without_a_normalization_never_fails_check(tmp_path, capsys):
    class M(nn.Module):  # a hardswish's "/ 6" folds into the next conv: no normalization anywhere
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 2, 1)

        def forward(self, x):
            x = self.conv1(x)
            return self.conv2(x * torch.clamp(x + 3, 0, 6) / 6)

    ep = export(M().eval(), (torch.randn(2, 3, 6, 6),))
    report = bnfold.fold(ep).report
    assert [(f.kind, f.removed) for f in report.folded] == [("", ["div"])] and not report.skipped, report
    check = bnfold.check(ep)
    assert check.ok and check.strict_ok and [f.removed for f in check.foldable_ops] == [["div"]]
    path = tmp_path / "hardswish.pt2"  # the command line agrees with bnfold.check
    torch.export.save(ep, str(path))
    from bnfold.cli import main

    assert main(["check", "--strict", str(path)]) == 0, capsys.readouterr()
    assert "ok, no normalization left" in capsys.readouterr().out


def test_mobilenet_v2_style_blocks_fold_every_batch_norm_and_skip_nothing():
    x = torch.randn(2, 3, 32, 32)
    model = _calibrated(randomize_bn(MobileNetV2ish()), x)
    n_bn = sum(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    ep = export(model, (x,))
    result = bnfold.fold(ep)
    assert len(result.report.folded) == n_bn and result.report.skipped == [], result.report
    assert {f.kind for f in result.report.folded} == {"batch_norm"}
    assert norm_nodes(result.model) == [] and bnfold.check(result.model).strict_ok
    assert_matches(run(result.model, x), reference(model, x))
