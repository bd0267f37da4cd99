"""The ONNX frontend: fold BatchNormalization and per-channel affines into
Conv / ConvTranspose / Gemm / MatMul of an ``onnx.ModelProto``.

* :func:`fold_onnx` folds a model (or a model file) and returns a new model
  with its :class:`~bnfold.report.FoldReport`.
* :func:`load_onnx` reads a model file and its external data safely.
* :func:`save_onnx` writes a model atomically, keeping external data when the
  source had it.
"""

from .fold import fold_onnx
from .load import load_onnx
from .save import save_onnx

__all__ = ["fold_onnx", "load_onnx", "save_onnx"]
