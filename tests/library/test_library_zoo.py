"""The library zoo's quick subset (``library_models.QUICK``): torchvision's and timm's own classes folded in the
default, decomposed and edge IR and in ONNX, each equal to its own deploy form (``library_zoo`` says what passes);
``make zoo`` runs the whole set and prints the table.  Also the helpers the zoo stands on."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bnfold_testutil import has_executorch, one_torch_thread
from library_models import QUICK, available, hand_foldable, import_torchvision
from library_zoo import Row, check_model, judge

WHY = available()
needs_libraries = pytest.mark.skipif(WHY is not None, reason=WHY or "")


@pytest.fixture(autouse=True)
def _one_torch_thread():
    with one_torch_thread():
        yield


@needs_libraries
@pytest.mark.parametrize("name", QUICK)
def test_library_model_folds_to_its_deploy_form(name, tmp_path):
    irs = [ir for ir in QUICK[name] if ir != "edge" or has_executorch()]  # the edge IR needs ExecuTorch
    rows = check_model(name, tmp_path, irs)
    assert [r.ir for r in rows] == irs
    for r in rows:
        assert r.ok, f"{name} {r.ir}: {r.failures}"
        assert r.folded > 0 and r.err is not None
    assert {r.check for r in rows if r.ir != "edge"} == {"0 strict"}
    assert {r.audit for r in rows if r.ir != "edge"} == {"0"}


@needs_libraries
def test_torchvision_imports_next_to_the_cpu_torch():
    tv = import_torchvision()
    assert tv is not None and hasattr(tv.models, "resnet18")
    torch._C._dispatch_find_schema_or_throw("torchvision::nms", "")  # the schema its meta registrations need
    torch._C._dispatch_find_schema_or_throw("torchvision::qnms", "")


class _ConvBnThenReluBn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn1, self.bn2 = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn2(torch.relu(self.bn1(self.conv(x))))


def test_hand_made_fusion_removes_the_batchnorms_right_after_a_layer():
    assert hand_foldable(_ConvBnThenReluBn().eval(), torch.randn(1, 3, 8, 8)) == (2, 1)


@pytest.mark.parametrize(
    "change, words",
    [
        (dict(left_bn=2), "2 BatchNorms left, the hand-made deploy form keeps 1"),
        (dict(left_other=3), "3 other normalizations left, the hand-made deploy form keeps 2"),
        (dict(left_other=2, left_std=1), "1 weight standardizations left"),
        (dict(own={"conv": 5, "add": 0, "bn": 0}), "not its own merge: add 2 (own 0)"),
        (dict(err=1e-3), "over the tolerance"),
    ],
)
def test_the_zoo_fails_a_row_for_each_miss(change, words):
    fields = dict(model="m", ir="default", left_bn=1, keeps=1, left_other=2, keeps_other=2, err=1e-6)
    fields["counts"] = {"conv": 5, "add": 2, "bn": 1}
    fields["tol"] = 1e-4
    assert judge(Row(**fields)) == []
    fields.update(change)
    assert any(words in f for f in judge(Row(**fields))), judge(Row(**fields))
