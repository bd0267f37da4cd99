"""bnfold.fold(nn.Module, example_inputs): export, fold, hand back a module."""

import copy
import json

import pytest
import torch
import torch.nn as nn

import bnfold
from bnfold.module import EVAL_COPY_NOTE
from bnfold_testutil import assert_matches, randomize_bn, reference


class SharedConv(nn.Module):
    """One conv module on two paths with different BNs: torch.fx's fuse() folds the first BN
    into the shared conv module in place, and the second path then sees a corrupted conv."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn_a, self.bn_b = nn.BatchNorm2d(4), nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.cat([self.bn_a(self.conv(x)), self.bn_b(self.conv(x))], 1)  # a sum would merge (reparam)


def test_module_is_folded_and_input_untouched():
    model = randomize_bn(SharedConv()).eval()
    before = copy.deepcopy(model.state_dict())
    x = torch.randn(2, 3, 8, 8)
    result = bnfold.fold(model, (x,))
    assert isinstance(result.model, nn.Module)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in result.model.modules())
    assert "batch_norm" not in result.model.code
    assert len(result.report.folded) == 2 and result.report.skipped == []
    assert_matches(result.model(x), reference(model, x))
    # Other inputs of the same shape: the module computes the same function.
    x2 = torch.randn(2, 3, 8, 8) * 10
    assert_matches(result.model(x2), reference(model, x2))
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert model.training is False and isinstance(model.bn_a, nn.BatchNorm2d)


def test_shared_conv_regression_against_fx_fuse_bug():
    model = randomize_bn(SharedConv(), seed=7).eval()
    x = torch.randn(1, 3, 6, 6)
    folded = bnfold.fold(model, (x,)).model
    assert_matches(folded(x), reference(model, x))
    names = set(folded.state_dict())
    assert {"conv.weight_folded_bn_a", "conv.weight"} <= names  # the last consumer keeps the original key


def test_module_in_training_mode_is_folded_as_an_eval_copy_and_the_report_says_so():
    model = randomize_bn(SharedConv()).train()
    x = torch.randn(2, 3, 8, 8)
    result = bnfold.fold(model, (x,))
    assert len(result.report.folded) == 2 and result.report.skipped == []
    assert result.report.notes == [EVAL_COPY_NOTE]
    assert json.loads(json.dumps(result.report.to_dict()))["notes"] == [EVAL_COPY_NOTE]
    assert model.training and all(m.training for m in model.modules())  # the caller's module is left alone
    assert_matches(result.model(x), reference(model.eval(), x))
    assert bnfold.fold(model.eval(), (x,)).report.notes == []  # no note for a module already in eval mode


def test_example_inputs_must_be_a_tuple():
    model = randomize_bn(SharedConv()).eval()
    x = torch.randn(1, 3, 5, 5)
    assert_matches(bnfold.fold(model, (x,)).model(x), reference(model, x))
    for bad in (x, [x]):
        with pytest.raises(TypeError, match=r"example_inputs must be a tuple .* pass \(x,\)"):
            bnfold.fold(model, bad)
    with pytest.raises(TypeError, match="example inputs"):
        bnfold.fold(model)
    with pytest.raises(TypeError, match="cannot fold"):
        bnfold.fold(42)


def test_module_report_carries_sizes_and_time():
    model = randomize_bn(SharedConv()).eval()
    report = bnfold.fold(model, (torch.randn(1, 3, 6, 6),)).report
    stats = report.stats
    assert stats.nodes_removed > 0 and stats.seconds >= 0
    # bn_a and bn_b go (2 x 4 float32 tensors of 4, and 2 int64 counters); a private copy of conv's weight
    # and bias comes in (the report's extra_bytes)
    assert stats.params_saved == 2 * (4 * 4 + 1) - (4 * 3 * 3 * 3 + 4)
    assert stats.bytes_saved == 2 * (4 * 4 * 4 + 8) - report.extra_bytes and report.extra_bytes == (108 + 4) * 4
