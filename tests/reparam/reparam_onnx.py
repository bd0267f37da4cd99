"""ONNX for the re-parameterization tests: the exports a user makes and onnxruntime runs of a model."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch


def onnx_export(module, x: torch.Tensor, dynamo: bool = True):
    """The ModelProto of the dynamo exporter with ``optimize=False`` (what bnfold must fold: the
    exporter's own optimizer would fuse some of it), or of the TorchScript exporter (``dynamo=False``,
    opset 17)."""
    import onnx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")
            return torch.onnx.export(module, (x,), verbose=False, dynamo=True, optimize=False).model_proto
        f = io.BytesIO()
        torch.onnx.export(module, (x,), f, dynamo=False, opset_version=17)
        return onnx.load_from_string(f.getvalue())


def run_onnx(model, x: torch.Tensor) -> list[torch.Tensor]:
    """Every output of ``model`` (a ModelProto with one input) on ``x``, under onnxruntime's CPU provider."""
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: x.numpy()}
    return [torch.from_numpy(np.asarray(out)) for out in sess.run(None, feed)]
