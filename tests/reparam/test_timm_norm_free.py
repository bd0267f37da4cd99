"""timm's NF-ResNet (``ScaledStdConv2d``: weight standardization, no BatchNorm anywhere; issue 30): each
conv's weight is ``batch_norm(w, training=True) * gain``, a normalization of a constant.  It is computed
once and stored as the conv's weight in every IR and in ONNX, so no normalization is left (``check
--strict`` passes), and the ONNX constant evaluation that computes it counts only what it holds at once.
A small instance of timm's class (the ``nf_resnet26`` configuration with one block a stage)."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
from reparam_onnx import onnx_export, run_onnx
from timm_models import timm

import bnfold
from bnfold.io import cost, meter
from bnfold.torch_export.ops import op_name
from bnfold_testutil import assert_matches, export, reference

SHAPE = (1, 3, 32, 32)
IRS = ("default", "decomposed", "edge", "onnx")


@functools.cache
def _model():
    timm()
    from timm.models.nfnet import NormFreeNet, model_cfgs

    cfg = dataclasses.replace(model_cfgs["nf_resnet26"], depths=(1, 1, 1, 1), channels=(32, 64, 128, 256))
    torch.manual_seed(0)
    model = NormFreeNet(cfg, num_classes=10).eval()
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(1))
    return model, x, reference(model, x)


@functools.cache
def _default():
    """The default export, made once: the other IRs start from a copy of it."""
    model, x, _ = _model()
    return export(model, (x,))


@functools.cache
def _onnx():
    model, x, _ = _model()
    return onnx_export(model, x)


@pytest.mark.parametrize("ir", IRS)
def test_weight_standardization_is_computed_into_every_conv(ir):
    model, x, ref = _model()
    if ir == "onnx":
        result = bnfold.fold(_onnx())
        graph = result.model.graph
        left = [n.op_type for n in graph.node if n.op_type == "BatchNormalization"]
        stored = {t.name for t in graph.initializer}
        computed = [n.name for n in graph.node if n.op_type == "Conv" and n.input[1] not in stored]
        out = run_onnx(result.model, x)[0]
    else:
        result = bnfold.fold(export(model, (x,), ir, base=_default()))
        calls = [n for n in result.model.graph.nodes if n.op == "call_function"]
        names = [op_name(n.target) for n in calls]
        left = [n for n in names if "batch_norm" in n or n.startswith(("var_mean", "rsqrt"))]
        convs = [n for n in calls if op_name(n.target).startswith(("conv", "convolution"))]
        computed = [n.name for n in convs if n.args[1].op == "call_function"]
        with torch.no_grad():
            out = result.model.module()(x)
    assert not left and not computed and not result.report.skipped, (left, computed, result.report.skipped)
    assert any(f.rule == "constant" and f.side == "weight" for f in result.report.folded), result.report
    assert_matches(out, ref)


def test_constant_evaluation_counts_what_is_alive():
    """Under a budget of 8 times the weights' bytes: computing every standardized weight (again after each
    edit) makes many times that in all, float64 temporaries included, but each value is freed once its
    last reader is computed (all of them at an edit), so the fold fits; a budget of the weights' bytes,
    under one layer's float64 arithmetic, is still refused."""
    proto = _onnx()
    weights = sum(len(t.raw_data) or 4 * len(t.float_data) for t in proto.graph.initializer)
    made = []
    charge = meter.WorkMeter.charge

    def counting(self, op, nbytes, flops=0):
        made.append(nbytes)
        return charge(self, op, nbytes, flops)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(meter.WorkMeter, "charge", counting)
        with cost.max_work(8 * weights):
            result = bnfold.fold(proto)
    assert sum(made) > 8 * weights, (sum(made), weights)  # what a meter that never frees would count
    assert not result.report.skipped
    with cost.max_work(weights), pytest.raises(cost.WorkError, match="computing the constant"):
        bnfold.fold(proto)
