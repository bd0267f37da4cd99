"""Conv / transposed conv / linear followed by BatchNorm, in every ATen IR."""

import pytest
import torch
import torch.nn as nn

import bnfold
from bnfold.report import Code
from bnfold_testutil import Pair, assert_matches, export, norm_nodes, randomize_bn, reference, run

IRS = ["default", "decomposed"]


def _case(name):
    g = torch.Generator().manual_seed(hash(name) % 1000)
    cases = {
        "conv1d": (nn.Conv1d(3, 6, 5, stride=2, padding=2, dilation=1), nn.BatchNorm1d(6), (2, 3, 17)),
        "conv1d_depthwise_nobias": (nn.Conv1d(8, 8, 7, padding=3, groups=8, bias=False), nn.BatchNorm1d(8), (2, 8, 20)),
        "conv2d": (nn.Conv2d(3, 8, 3, stride=2, padding=1, dilation=2), nn.BatchNorm2d(8), (2, 3, 12, 12)),
        "conv2d_grouped_nobias": (nn.Conv2d(6, 9, 3, groups=3, bias=False), nn.BatchNorm2d(9), (2, 6, 9, 9)),
        "conv2d_depthwise": (nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.BatchNorm2d(16), (2, 16, 8, 8)),
        "conv3d": (nn.Conv3d(2, 4, 3, padding=1, stride=(1, 2, 1)), nn.BatchNorm3d(4), (1, 2, 5, 6, 5)),
        "conv_transpose1d": (nn.ConvTranspose1d(4, 6, 3, stride=2, output_padding=1), nn.BatchNorm1d(6), (2, 4, 9)),
        "conv_transpose2d_grouped": (
            nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2, dilation=1),
            nn.BatchNorm2d(6),
            (2, 4, 7, 7),
        ),
        "conv_transpose2d_nobias_dilated": (
            nn.ConvTranspose2d(6, 6, 3, dilation=2, groups=3, bias=False),
            nn.BatchNorm2d(6),
            (1, 6, 5, 5),
        ),
        "conv_transpose3d_grouped": (
            nn.ConvTranspose3d(4, 8, 2, stride=2, groups=2),
            nn.BatchNorm3d(8),
            (1, 4, 3, 3, 3),
        ),
        "linear": (nn.Linear(10, 7), nn.BatchNorm1d(7), (5, 10)),
        "linear_nobias": (nn.Linear(10, 7, bias=False), nn.BatchNorm1d(7), (5, 10)),
    }
    layer, bn, shape = cases[name]
    model = randomize_bn(Pair(layer, bn), seed=len(name)).eval()
    return model, (torch.randn(*shape, generator=g),)


CASES = [
    "conv1d",
    "conv1d_depthwise_nobias",
    "conv2d",
    "conv2d_grouped_nobias",
    "conv2d_depthwise",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d_grouped",
    "conv_transpose2d_nobias_dilated",
    "conv_transpose3d_grouped",
    "linear",
    "linear_nobias",
]


@pytest.mark.parametrize("ir", IRS)
@pytest.mark.parametrize("name", CASES)
def test_fold_matches_float64_reference(name, ir):
    model, inputs = _case(name)
    ep = export(model, inputs, ir)
    assert len(norm_nodes(ep)) == 1
    result = bnfold.fold(ep)
    assert norm_nodes(result.model) == [], result.model.graph
    assert [f.norm for f in result.report.folded] == ["bn"] and result.report.skipped == []
    ref = reference(model, *inputs)
    assert_matches(run(result.model, *inputs), ref)
    # The input program is untouched: it still has its batch norm and still computes the same.
    assert len(norm_nodes(ep)) == 1
    assert_matches(run(ep, *inputs), ref)


@pytest.mark.parametrize("ir", IRS)
def test_names_kinds_and_dropped_bn_state(ir):
    model, inputs = _case("conv2d_grouped_nobias")
    ep = export(model, inputs, ir)
    folded = bnfold.fold(ep).model
    sig = {s.target: s.kind.name for s in folded.graph_signature.input_specs if s.target}
    assert sig == {"layer.weight": "PARAMETER", "layer.bias": "PARAMETER"}
    assert set(folded.state_dict) == {"layer.weight", "layer.bias"}
    assert isinstance(folded.state_dict["layer.bias"], torch.nn.Parameter)
    assert "layer.bias" not in ep.state_dict  # the input program gained nothing


def test_linear_over_rank3_is_skipped_with_reason():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.bn = nn.Linear(6, 6), nn.BatchNorm1d(4)

        def forward(self, x):  # x: [N, 4, 6]; BN normalizes dim 1 (length 4), the linear's features are dim 2
            return self.bn(self.fc(x))

    model = randomize_bn(M()).eval()
    ep = export(model, (torch.randn(2, 4, 6),))
    result = bnfold.fold(ep)
    assert len(norm_nodes(result.model)) == 1
    (skip,) = result.report.skipped
    assert skip.norm == "bn" and skip.code == Code.AXIS_MISMATCH


def test_bn_without_affine_folds():
    model = randomize_bn(Pair(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, affine=False))).eval()
    inputs = (torch.randn(2, 3, 7, 7),)
    result = bnfold.fold(export(model, inputs))
    assert norm_nodes(result.model) == []
    assert_matches(run(result.model, *inputs), reference(model, *inputs))


def test_eps_is_the_models_own():
    model = randomize_bn(Pair(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, eps=0.5)), var=(1e-3, 1e-2)).eval()
    inputs = (torch.randn(2, 3, 7, 7),)
    result = bnfold.fold(export(model, inputs))
    assert norm_nodes(result.model) == []
    assert_matches(run(result.model, *inputs), reference(model, *inputs))


def test_report_to_dict_is_json():
    import json

    model, inputs = _case("conv2d")
    report = bnfold.fold(export(model, inputs)).report
    data = json.loads(json.dumps(report.to_dict()))
    summary = data["summary"]
    assert (summary["folded"], summary["skipped"], summary["lowered"], summary["extra_bytes"]) == (1, 0, 0, 0)
    assert summary["nodes_removed"] > 0 and summary["params_saved"] > 0  # bnfold.fold measures the change
    assert data["folded"][0]["norm"] == "bn" and data["folded"][0]["pattern"] == "conv2d+batch_norm"
