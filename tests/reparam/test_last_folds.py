"""The last folds in reach (issue 21): a per-channel affine through a select / slice along other
axes (ViT's class token), in every IR and in ONNX; CastLike's type input; weight standardization."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from reparam_models import calibrate
from reparam_onnx import onnx_export, run_onnx

import bnfold
from bnfold_testutil import assert_matches, export, reference


class ClassToken(nn.Module):
    """ViT's end: ``head(norm(x)[:, 0])``."""

    def __init__(self, dim=8):
        super().__init__()
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, 5)

    def forward(self, x):
        return self.head(self.norm(x)[:, 0])


class SliceTokens(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, 5)

    def forward(self, x):
        return self.head(self.norm(x)[:, 1:3])


class MeanTokens(nn.Module):
    """timm's ``global_pool="avg"``: ``head(norm(x)[:, 1:].mean(1))``."""

    def __init__(self, dim=8):
        super().__init__()
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, 5)

    def forward(self, x):
        return self.head(self.norm(x)[:, 1:].mean(1))


class PickedTokens(nn.Module):
    """``head(norm(x).index_select(1, idx))``, or ``head(norm(x)[:, idx])`` (``aten.index``)."""

    def __init__(self, dim=8, advanced=False):
        super().__init__()
        self.norm, self.head, self.advanced = nn.LayerNorm(dim), nn.Linear(dim, 5), advanced
        self.register_buffer("idx", torch.tensor([0, 2, 3]))

    def forward(self, x):
        y = self.norm(x)
        return self.head(y[:, self.idx] if self.advanced else torch.index_select(y, 1, self.idx))


CASES = {
    "class_token": (ClassToken, (2, 4, 8)),
    "slice_tokens": (SliceTokens, (2, 4, 8)),
    "mean_tokens": (MeanTokens, (2, 4, 8)),
    "index_select_tokens": (PickedTokens, (2, 4, 8)),
    # ONNX: the exporter writes x[:, idx] as Transpose + GatherND, no hop there (the LayerNorm stays)
    "index_tokens": (lambda: PickedTokens(advanced=True), (2, 4, 8)),
}


def _calibrated(name):
    make, shape = CASES[name]
    model = calibrate(make(), shape, seed=1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-1, 1)
    return model, torch.randn(shape, generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize("ir", ["default", "decomposed", "edge", "onnx"])
@pytest.mark.parametrize("name", list(CASES))
def test_affine_folds_through_a_non_channel_pick_or_mean(name, ir):
    if (name, ir) == ("index_tokens", "onnx"):
        pytest.skip("the exporter writes x[:, idx] as Transpose + GatherND, which is no hop")
    model, x = _calibrated(name)
    ref = reference(model, x)
    if ir == "onnx":
        result = bnfold.fold(onnx_export(model, x))
        (out,) = run_onnx(result.model, x)
        ops = [n.op_type for n in result.model.graph.node]
        assert "BatchNormalization" not in ops
    else:
        result = bnfold.fold(export(model, (x,), ir))
        with torch.no_grad():
            out = result.model.module()(x)
        assert not [n for n in result.model.graph.nodes if "batch_norm" in str(n.target)]
    norm = "norm"
    assert [f.norm for f in result.report.folded][0] in (norm, "node_" + norm) or ir == "onnx", result.report
    assert result.report.folded and not result.report.skipped, result.report
    assert_matches(out, ref)


class BiasLessAfterBN(nn.Module):
    """``conv2(bn(relu(conv1(x))))`` with a bias-less conv2: the dynamo exporter (optimize=False)
    writes its zero bias as ``Expand(CastLike(0, y))``, whose type-only read of ``y`` is no user."""

    def __init__(self):
        super().__init__()
        self.c1, self.bn, self.c2 = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Conv2d(4, 4, 1, bias=False)

    def forward(self, x):
        return self.c2(self.bn(torch.relu(self.c1(x))))


def test_onnx_castlike_type_input_is_no_user():
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    model = calibrate(BiasLessAfterBN(), tuple(x.shape), seed=4)
    proto = onnx_export(model, x)
    assert "CastLike" in [n.op_type for n in proto.graph.node]
    result = bnfold.fold(proto)
    assert len(result.report.folded) == 1 and not result.report.skipped, result.report
    assert "BatchNormalization" not in [n.op_type for n in result.model.graph.node]
    (out,) = run_onnx(result.model, x)
    assert_matches(out, reference(model, x))


class WSConv(nn.Conv2d):
    """timm's nf_resnet-style weight standardization: ``batch_norm(w, training=True)`` over the weight."""

    def forward(self, x):
        flat = self.weight.reshape(1, self.out_channels, -1)
        w = torch.nn.functional.batch_norm(flat, None, None, training=True, momentum=0.0, eps=1e-5)
        return torch.nn.functional.conv2d(x, w.reshape_as(self.weight), self.bias)


class ScaledWSConv(nn.Conv2d):
    """timm's ``ScaledStdConv2d``: the standardized weight times a learnable ``gain`` and ``fan_in ** -0.5``."""

    def __init__(self, *args, eps=1e-6, **kwargs):
        super().__init__(*args, **kwargs)
        self.gain = nn.Parameter(torch.ones(self.out_channels, 1, 1, 1))
        self.scale, self.eps = self.weight[0].numel() ** -0.5, eps

    def forward(self, x):
        flat = self.weight.reshape(1, self.out_channels, -1)
        gain = (self.gain * self.scale).view(-1)
        w = torch.nn.functional.batch_norm(flat, None, None, weight=gain, training=True, momentum=0.0, eps=self.eps)
        return torch.nn.functional.conv2d(x, w.reshape_as(self.weight), self.bias)


WS_CONVS = {"std": WSConv, "scaled_std": ScaledWSConv}


class WSThenBN(nn.Module):
    def __init__(self, bn=True, conv=WSConv):
        super().__init__()
        self.conv, self.bn = conv(3, 4, 3), nn.BatchNorm2d(4) if bn else nn.Identity()

    def forward(self, x):
        return self.bn(self.conv(x))


def _onnx_fold(model, x, dynamo=True):
    """``bnfold.fold`` of the dynamo export (optimize=False: the weight computation stays in the
    graph) or of the TorchScript exporter's (``dynamo=False``: the weight's BatchNormalization has
    training_mode=1), and the folded model's output under onnxruntime."""
    proto = onnx_export(model, x, dynamo)
    result = bnfold.fold(proto)
    (out,) = run_onnx(result.model, x)
    return proto, result, out


def _fold_ws(model, x, ir):
    """The fold result, the normalization nodes left, the folded output and the name the report
    gives the BN after the conv (ONNX: its node, the one that reads the Conv's output)."""
    if ir in ("onnx", "onnx-torchscript"):
        proto, result, out = _onnx_fold(model, x, dynamo=ir == "onnx")
        conv = next(n for n in proto.graph.node if n.op_type == "Conv")
        bn = [n.name for n in proto.graph.node if n.op_type == "BatchNormalization" and n.input[0] == conv.output[0]]
        left = [n for n in result.model.graph.node if n.op_type == "BatchNormalization"]
        return result, left, out, bn
    result = bnfold.fold(export(model, (x,), ir))
    with torch.no_grad():
        out = result.model.module()(x)
    return result, [n for n in result.model.graph.nodes if "batch_norm" in str(n.target)], out, ["bn"]


@pytest.mark.parametrize("conv", list(WS_CONVS))
@pytest.mark.parametrize("ir", ["default", "decomposed", "edge", "onnx", "onnx-torchscript"])
def test_weight_standardized_conv_folds_in_every_ir(ir, conv):
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    model = calibrate(WSThenBN(conv=WS_CONVS[conv]), tuple(x.shape), seed=5)
    result, norms_left, out, bn = _fold_ws(model, x, ir)
    assert [f.norm for f in result.report.folded] == bn and not result.report.skipped, result.report
    assert not norms_left  # the conv's BN folded, the weight's is gone with the rest of its computation
    assert_matches(out, reference(model, x))
    # without a BatchNorm after it the standardized weight is computed once and stored all the same
    lone = calibrate(WSThenBN(bn=False, conv=WS_CONVS[conv]), tuple(x.shape))
    alone, left, out, _ = _fold_ws(lone, x, ir)
    assert not alone.report.skipped and not left, alone.report
    assert [(f.rule, f.side) for f in alone.report.folded] == [("constant", "weight")], alone.report
    assert_matches(out, reference(lone, x))


def test_onnx_weight_standardization_leaves_one_conv():
    """After the fold the weight computation of the dynamo export (Concat, Reshape, ReduceMean, Sub, Mul,
    BatchNormalization, Shape, Expand, CastLike) is gone: what is left is the conv with its folded weight."""
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    model = calibrate(WSThenBN(conv=ScaledWSConv), tuple(x.shape), seed=5)
    proto, result, _ = _onnx_fold(model, x)
    assert {"ReduceMean", "Concat", "Mul", "BatchNormalization"} <= {n.op_type for n in proto.graph.node}
    assert [n.op_type for n in result.model.graph.node] == ["Conv"]
    conv = result.model.graph.node[0]
    assert sorted(t.name for t in result.model.graph.initializer) == sorted(conv.input[1:])


def test_onnx_castlike_of_a_constant_is_a_constant():
    """A frozen BatchNorm written as ``x * CastLike(scale, x) + CastLike(shift, x)`` (DETR-style, or a
    decomposed GroupNorm affine): the CastLike of a constant is a constant, so the chain folds."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((4, 3, 3, 3)), rng.standard_normal(4)
    scale, shift = rng.uniform(0.5, 2.0, (1, 4, 1, 1)), rng.standard_normal((1, 4, 1, 1))
    inits = [
        numpy_helper.from_array(w.astype(np.float32), "W"),
        numpy_helper.from_array(b.astype(np.float32), "B"),
        numpy_helper.from_array(scale, "scale64"),  # float64 constants, cast like the data
        numpy_helper.from_array(shift, "shift64"),
    ]
    nodes = [
        helper.make_node("Conv", ["X", "W", "B"], ["c"], name="conv"),
        helper.make_node("CastLike", ["scale64", "c"], ["s"], name="cast_scale"),
        helper.make_node("Mul", ["c", "s"], ["m"], name="mul"),
        helper.make_node("CastLike", ["shift64", "c"], ["t"], name="cast_shift"),
        helper.make_node("Add", ["m", "t"], ["Y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3, 8, 8])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 4, 6, 6])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    result = bnfold.fold(model)
    assert len(result.report.folded) == 1 and result.report.folded[0].into == "conv", result.report
    assert [n.op_type for n in result.model.graph.node] == ["Conv"]  # Mul, Add and both CastLikes gone
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    (out,) = run_onnx(result.model, torch.from_numpy(x))
    conv = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w), torch.from_numpy(b))
    assert_matches(out, conv * torch.from_numpy(scale) + torch.from_numpy(shift))
