"""The ONNX frontend: fold BatchNormalization and per-channel affines into
Conv / ConvTranspose / Gemm / MatMul of an ``onnx.ModelProto``.

* :func:`fold_onnx` folds a model (or a model file) and returns a new model
  with its :class:`~bnfold.report.FoldReport`.
* :func:`load_onnx` reads a model file and its external data safely and
  returns ``(model, layout)``; :func:`save_onnx` writes a model atomically,
  with external data as the :class:`ExternalLayout` it is given says.  Both
  live in :mod:`bnfold.io.onnx`.
* ``FoldNormalizationPass`` (:mod:`bnfold.onnx.ir_pass`, needs ``onnx_ir``): the same
  fold as an onnx-ir ``FunctionalPass``, to compose with other passes.
"""

from ..io.onnx import ExternalLayout, OnnxModel, load_onnx, save_onnx
from .fold import fold_onnx

__all__ = ["ExternalLayout", "OnnxModel", "fold_onnx", "load_onnx", "save_onnx"]


def __getattr__(name):
    if name == "FoldNormalizationPass":  # onnx_ir is optional: imported only when asked for
        from .ir_pass import FoldNormalizationPass

        return FoldNormalizationPass
    raise AttributeError(f"module 'bnfold.onnx' has no attribute {name!r}")
