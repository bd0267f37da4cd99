"""Every skip reason: the normalization stays, the report says why, the model is still right."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import bnfold
from bnfold.report import Code
from bnfold_testutil import assert_matches, export, norm_nodes, randomize_bn, reference, run


def _conv_bn(**bn_kwargs):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, **bn_kwargs)

        def forward(self, x):
            return self.bn(self.conv(x))

    return randomize_bn(M())


def _only_skip(ep):
    result = bnfold.fold(ep)
    assert result.report.folded == []
    assert len(result.report.skipped) == 1
    assert len(norm_nodes(result.model)) == len(norm_nodes(ep))
    return result, result.report.skipped[0]


X = (torch.randn(2, 3, 8, 8),)


@pytest.mark.parametrize("ir", ["default", "decomposed"])
def test_training_mode(ir):
    model = _conv_bn().train()
    _, skip = _only_skip(export(model, X, ir))
    assert skip.code == Code.TRAINING_MODE and skip.norm == "bn"


def test_batch_statistics():
    model = _conv_bn(track_running_stats=False).eval()
    result, skip = _only_skip(export(model, X))
    assert skip.code == Code.BATCH_STATISTICS
    assert_matches(run(result.model, *X), reference(model, *X))


@pytest.mark.parametrize("ir", ["default", "decomposed"])
def test_producer_output_has_other_users(ir):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)

        def forward(self, x):
            y = self.conv(x)
            return self.bn(y) + torch.relu(y)

    model = randomize_bn(M()).eval()
    result, skip = _only_skip(export(model, X, ir))
    assert skip.code == Code.SHARED_VALUE
    assert_matches(run(result.model, *X), reference(model, *X))


def test_weight_is_a_user_input():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm2d(4)

        def forward(self, x, w):
            return self.bn(F.conv2d(x, w))

    model = randomize_bn(M()).eval()
    w = torch.randn(4, 3, 3, 3)
    _, skip = _only_skip(export(model, (X[0], w)))
    assert skip.code == Code.LAYER_WEIGHTS


def test_weight_is_computed():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 3, 3, 3))
            self.bn = nn.BatchNorm2d(4)

        def forward(self, x):  # a weight computed from constants folds; one computed from the input cannot
            return self.bn(F.conv2d(x, self.w * x.mean()))

    model = randomize_bn(M()).eval()
    _, skip = _only_skip(export(model, X))
    assert skip.code == Code.LAYER_WEIGHTS


@pytest.mark.parametrize(
    "stat,value,words",
    [
        ("running_mean", float("nan"), Code.NOT_FINITE),
        ("running_var", float("inf"), Code.NOT_FINITE),
        ("running_var", -1.0, Code.UNDEFINED),
    ],
)
def test_bad_running_statistics(stat, value, words):
    model = _conv_bn().eval()
    getattr(model.bn, stat)[1] = value
    _, skip = _only_skip(export(model, X))
    assert skip.code == words


def test_fp16_overflow_and_underflow_are_skipped():
    for weight, gamma in ((2.0, 6e4), (0.01, 1e-6)):  # overflows, underflows
        model = _conv_bn().eval()
        with torch.no_grad():
            model.conv.weight.fill_(weight)
            model.bn.weight.fill_(gamma)
            model.bn.running_var.fill_(1.0)
        model = model.half()
        _, skip = _only_skip(export(model, (X[0].half(),)))
        assert skip.code == Code.CAST_RANGE


def test_fp16_model_folds_in_its_dtype():
    model = _conv_bn().eval().half()
    result = bnfold.fold(export(model, (X[0].half(),)))
    assert norm_nodes(result.model) == []
    assert {t.dtype for t in result.model.state_dict.values()} == {torch.float16}


def test_no_neighbour():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm2d(3)

        def forward(self, x):
            return torch.relu(self.bn(torch.relu(x)))

    _, skip = _only_skip(export(randomize_bn(M()).eval(), X))
    assert skip.code == Code.NO_LAYER


def test_only_filter():
    model = _conv_bn().eval()
    result = bnfold.fold(export(model, X), only={"linear"})
    assert result.report.folded == [] and result.report.skipped[0].code == Code.NOT_REQUESTED
    with pytest.raises(ValueError, match="unknown kind"):
        bnfold.fold(export(model, X), only={"convolution"})
