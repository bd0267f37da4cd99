"""ONNX for the re-parameterization tests: the exports a user makes and onnxruntime runs of a model."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch


def conv3d_translation() -> dict:
    """A translation of ``aten.conv3d`` for the dynamo exporter that writes a valid Conv for a bias-less Conv3d.

    onnxscript's torch_lib (``aten_conv3d``, 0.7.2 here) writes the zero bias of a Conv3d without one as
    ``Expand(0, Concat(Shape(W)[0:1], [2]))``: shape ``[out_channels, 2]`` where ONNX requires ``[out_channels]``
    (its conv1d and conv2d write ``[out_channels]``).  ONNX Runtime creates the session, then refuses the run
    ("bias must be a 1D tensor of size output_channels"), and no fold can use that bias.  torchvision's video
    ResNets (r3d_18, mc3_18, r2plus1d_18) are Conv3d + BatchNorm3d with no conv bias, so their export would
    measure the exporter, not bnfold.  With ``optimize=True`` or the TorchScript exporter the model is valid
    but the exporter folds the BatchNorms itself (nothing left for bnfold).  This translation writes the 1-D
    zero bias torch_lib's conv2d writes and leaves everything else to torch_lib's own ``aten_conv3d``.  Empty
    when torch_lib is not importable (the export then is the plain one)."""
    try:
        from onnxscript import opset18 as op
        from onnxscript.function_libs.torch_lib.ops.core import aten_conv3d
    except ImportError:
        return {}

    def conv3d(input, weight, bias=None, stride=(1, 1, 1), padding=(0, 0, 0), dilation=(1, 1, 1), groups=1):
        if bias is None:
            bias = op.Expand(op.CastLike(0.0, input), op.Shape(weight, start=0, end=1))
        return aten_conv3d(input, weight, bias, stride, padding, dilation, groups)

    return {torch.ops.aten.conv3d.default: conv3d}


def onnx_export(module, x: torch.Tensor, dynamo: bool = True, fix_conv3d: bool = True):
    """The ModelProto of the dynamo exporter with ``optimize=False`` (what bnfold must fold: the
    exporter's own optimizer would fuse some of it), or of the TorchScript exporter (``dynamo=False``,
    opset 17).  ``fix_conv3d``: a bias-less Conv3d gets a valid zero bias (:func:`conv3d_translation`)."""
    import onnx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")
            table = conv3d_translation() if fix_conv3d else {}
            return torch.onnx.export(
                module, (x,), verbose=False, dynamo=True, optimize=False, custom_translation_table=table or None
            ).model_proto
        f = io.BytesIO()
        torch.onnx.export(module, (x,), f, dynamo=False, opset_version=17)
        return onnx.load_from_string(f.getvalue())


def run_onnx(model, x: torch.Tensor) -> list[torch.Tensor]:
    """Every output of ``model`` (a ModelProto with one input) on ``x``, under onnxruntime's CPU provider."""
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: x.numpy()}
    return [torch.from_numpy(np.asarray(out)) for out in sess.run(None, feed)]
