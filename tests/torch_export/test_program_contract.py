"""The folded program is a well-formed ExportedProgram: names, kinds, sharing, save/load, idempotence."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import bnfold
from bnfold import fold_math
from bnfold_testutil import TwoPaths, assert_matches, export, norm_nodes, randomize_bn, reference, run
from zoo import ConvBn

X = (torch.randn(2, 3, 8, 8),)


@pytest.mark.parametrize("ir", ["default", "decomposed"])
def test_shared_weight_gets_private_copies(ir):
    model = randomize_bn(TwoPaths()).eval()
    ep = export(model, X, ir)
    before = {k: v.clone() for k, v in ep.state_dict.items()}
    result = bnfold.fold(ep)
    assert norm_nodes(result.model) == []
    for out, ref in zip(run(result.model, *X), reference(model, *X)):
        assert_matches(out, ref)
    keys = set(result.model.state_dict)
    # The first consumer gets a private copy; the last one keeps the original state_dict key.
    assert keys == {"conv.weight_folded_bn1", "conv.bias_folded_bn1", "conv.weight", "conv.bias"}
    # The input program is untouched.
    assert all(torch.equal(before[k], ep.state_dict[k]) for k in before)
    # One private copy (weight and its new bias) is the net bytes added.
    assert result.report.extra_bytes == 4 * 3 * 3 * 3 * 4 + 4 * 4


def test_shared_weight_with_one_unfoldable_user_keeps_original():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)

        def forward(self, x):
            return self.bn(self.conv(x)), self.conv(x * x)

    model = randomize_bn(M()).eval()
    result = bnfold.fold(export(model, X))
    assert torch.equal(result.model.state_dict["conv.weight"], model.conv.weight)
    assert "conv.weight_folded_bn" in result.model.state_dict
    for out, ref in zip(run(result.model, *X), reference(model, *X)):
        assert_matches(out, ref)


def test_kinds_are_kept_for_buffers_and_constants():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("wb", torch.randn(4, 3, 3, 3))
            self.wc = torch.randn(4, 4, 1, 1)  # a plain tensor attribute: a lifted constant
            self.bn1, self.bn2 = nn.BatchNorm2d(4), nn.BatchNorm2d(4)

        def forward(self, x):
            return self.bn2(F.conv2d(self.bn1(F.conv2d(x, self.wb)), self.wc))

    model = randomize_bn(M()).eval()
    ep = export(model, X)
    result = bnfold.fold(ep)
    assert norm_nodes(result.model) == []
    kinds = {s.target: s.kind.name for s in result.model.graph_signature.input_specs if s.target}
    assert kinds["wb"] == "BUFFER" and kinds["wb_bias"] == "BUFFER"
    constants = [t for t, k in kinds.items() if k == "CONSTANT_TENSOR"]
    assert len(constants) == 2  # the constant weight and its new bias
    model64 = copy.deepcopy(model).double()
    model64.wc = model64.wc.double()  # .double() converts parameters and buffers, not plain attributes
    assert_matches(run(result.model, *X), model64(X[0].double()))


@pytest.mark.parametrize("ir", ["default", "decomposed"])
def test_save_load_decompose_module_and_idempotence(ir, tmp_path):
    model = randomize_bn(TwoPaths()).eval()
    folded = bnfold.fold(export(model, X, ir)).model
    refs = reference(model, *X)
    path = tmp_path / "folded.pt2"
    torch.export.save(folded, path)
    loaded = torch.export.load(path)
    for program in (loaded, folded.run_decompositions()):
        assert norm_nodes(program) == []
        for out, ref in zip(run(program, *X), refs):
            assert_matches(out, ref)
    again = bnfold.fold(folded)
    assert again.report.folded == [] and again.report.skipped == []
    assert again.model.graph_module.code == folded.graph_module.code
    assert again.model.state_dict.keys() == folded.state_dict.keys()
    assert all(torch.equal(again.model.state_dict[k], folded.state_dict[k]) for k in folded.state_dict)


def test_conv_without_bias_gains_one_under_its_module_name():
    model = randomize_bn(ConvBn(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4))).eval()
    folded = bnfold.fold(export(model, X)).model
    assert set(folded.state_dict) == {"conv.weight", "conv.bias"}
    module = folded.module()
    assert module.conv.bias.shape == (4,)


def test_grouped_transposed_conv_index_labelled():
    """Weight [in, out/g, k]: element [i, j] belongs to output channel (i // (in/g)) * (out/g) + j."""
    in_ch, out_ch, groups = 6, 9, 3  # in/g = 2, out/g = 3
    w = torch.ones(in_ch, out_ch // groups, 2, 2)
    aff = fold_math.Affine(torch.arange(1, out_ch + 1, dtype=torch.float64), torch.zeros(out_ch, dtype=torch.float64))
    new_w, _ = fold_math.fold_output_affine(w, None, aff, "conv_transpose", groups)
    for i in range(in_ch):
        for j in range(out_ch // groups):
            assert torch.all(new_w[i, j] == (i // 2) * 3 + j + 1)
    # Scaling dim 0 would give row i the factor i + 1; a [1, out, 1, 1] scale does not even broadcast.
    assert not torch.equal(new_w, w * aff.scale[:in_ch].reshape(-1, 1, 1, 1))
    with pytest.raises(RuntimeError):
        w * aff.scale.reshape(1, -1, 1, 1)


@pytest.mark.parametrize("ir", ["default", "decomposed"])
def test_grouped_transposed_conv_program_with_channel_labelled_stats(ir):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.bn = nn.ConvTranspose2d(6, 6, 3, groups=2, bias=False), nn.BatchNorm2d(6)

        def forward(self, x):
            return self.bn(self.up(x))

    model = M().eval()
    with torch.no_grad():  # distinct per-channel statistics: channel c has gamma c+1 and mean 10c
        model.bn.weight.copy_(torch.arange(1.0, 7.0))
        model.bn.running_mean.copy_(torch.arange(6.0) * 10)
        model.bn.running_var.copy_(torch.arange(1.0, 7.0) / 4)
    x = (torch.randn(2, 6, 5, 5),)
    result = bnfold.fold(export(model, x, ir))
    assert norm_nodes(result.model) == []
    assert_matches(run(result.model, *x), reference(model, *x))


def test_mm_without_bias_becomes_addmm_in_decomposed_ir():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.bn = nn.Linear(5, 3, bias=False), nn.BatchNorm1d(3)

        def forward(self, x):
            return self.bn(self.fc(x))

    model = randomize_bn(M()).eval()
    x = (torch.randn(4, 5),)
    ep = export(model, x, "decomposed")
    assert any("aten.mm" in str(n.target) for n in ep.graph.nodes)
    folded = bnfold.fold(ep).model
    assert any("aten.addmm" in str(n.target) for n in folded.graph.nodes)
    assert set(folded.state_dict) == {"fc.weight", "fc.bias"}
    assert_matches(run(folded, *x), reference(model, *x))
