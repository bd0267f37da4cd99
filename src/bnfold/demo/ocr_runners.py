"""The ways the OCR task runs a PaddleOCR model, each a ``run(x) -> output`` on float32 numpy arrays.

* ``fp32``: ONNX Runtime (CPU) on the model as shipped;
* ``ort-fp16``: ONNX Runtime (CPU) on the float16 model onnxconverter-common's
  ``convert_float_to_float16(keep_io_types=True)`` writes (how ONNX Runtime users convert);
* ``torch-half``: PyTorch eager on CPU in float16, running the ONNX graph op by op (no torch model of
  these networks exists; this is the runtime bnfold's ``fp16`` profile stands for);
* a profile name (``fp16``, ``ort-cpu``, ``htp``): bnfold's emulator under that profile, optionally with
  a runtime batch-norm eps.

``folded`` runs the ONNX ``bnfold.fold`` writes instead of the model.  Every runner goes through
:mod:`bnfold.numerics` (its runtimes and ONNX emulator); this module is the one place that does.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import torch

RUNTIMES = ("fp32", "ort-fp16", "torch-half")


def folded_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """What ``bnfold fold`` writes for ``model``."""
    from ..api import fold

    return fold(model).model


def runner(model: onnx.ModelProto, how: str, bn_eps: float | None = None) -> Callable[[np.ndarray], np.ndarray]:
    """``run(x)``: the model's first output for input ``x`` (float32 numpy), computed ``how``."""
    if how == "fp32":
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name
        return lambda x: sess.run(None, {name: np.ascontiguousarray(x, dtype=np.float32)})[0]
    if how == "ort-fp16":
        from ..numerics.real_runtimes import onnxruntime_fp16

        run = onnxruntime_fp16(model)
        return lambda x: run((torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)),))[0].numpy()
    if how == "torch-half":
        from ..numerics.real_runtimes import torch_half

        return lambda x: torch_half(model, (torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)),))[0].numpy()
    from ..numerics.onnx_program import OnnxEmulator

    emu = OnnxEmulator(model, how, bn_eps)

    def emulate(x: np.ndarray) -> np.ndarray:
        res = emu.run(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), reference=False)
        return res.outputs[0].to(torch.float32).numpy()

    return emulate
