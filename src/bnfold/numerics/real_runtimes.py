"""Real fp16 runtimes next to the emulation (``audit(..., runtime=...)``).

* ``torch``: PyTorch eager in half precision on CPU, running the ONNX graph op by op with the
  same torch functions the emulator uses (:mod:`bnfold.onnx.semantics`), every float value
  and constant in ``torch.float16``.  The ``fp16`` profile emulates it.
* ``onnxruntime``: ONNX Runtime's CPU provider running the float16 model that onnxconverter-common's
  ``convert_float_to_float16(model, keep_io_types=True)`` writes.  The ``ort-cpu`` profile emulates it.

Both are measured against the same reference run as the emulation, unfolded and folded.
"""

from __future__ import annotations

import onnx
import torch

from .audit_report import RuntimeRun
from .end_to_end import EndToEndSum
from .onnx_program import onnx_program
from .runner import run_in

RUNTIMES = {"torch": "fp16", "onnxruntime": "ort-cpu"}


def torch_half(model: onnx.ModelProto, batch: tuple) -> list[torch.Tensor]:
    """``model``'s outputs run by PyTorch eager in float16 on CPU (returned as float32)."""
    outs = run_in(onnx_program(model), batch, torch.float16)
    return [o.to(torch.float32) if o.is_floating_point() else o for o in outs]


def float16_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` converted to float16 by onnxconverter-common (inputs and outputs stay float32)."""
    try:
        from onnxconverter_common import float16
    except ImportError as e:
        raise ValueError("runtime 'onnxruntime' needs onnxconverter-common (pip install onnxconverter-common)") from e
    import warnings

    with warnings.catch_warnings():  # it warns once per constant it clamps to [1e-7, 1e4]
        warnings.simplefilter("ignore")
        return float16.convert_float_to_float16(model, keep_io_types=True)


def onnxruntime_fp16(model: onnx.ModelProto):
    """``run(batch) -> outputs`` of ONNX Runtime (CPU) on the float16 conversion of ``model``."""
    try:
        import onnxruntime as ort
    except ImportError as e:
        raise ValueError("runtime 'onnxruntime' needs onnxruntime (pip install onnxruntime)") from e
    half = float16_model(model)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(half.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]

    def run(batch: tuple) -> list[torch.Tensor]:
        feed = {n: torch.as_tensor(x).numpy() for n, x in zip(names, batch)}
        return [torch.from_numpy(o).to(torch.float32) for o in sess.run(None, feed)]

    return run


def _runner(runtime: str, model: onnx.ModelProto):
    if runtime == "torch":
        return lambda batch: torch_half(model, batch)
    if runtime == "onnxruntime":
        return onnxruntime_fp16(model)
    raise ValueError(f"unknown runtime {runtime!r}; choose from {', '.join(RUNTIMES)}")


def runtime_run(runtime: str, model, folded_model, batches: list[tuple], reference, task=None) -> RuntimeRun:
    """Run ``runtime`` on the unfolded (and folded) model; end-to-end numbers (and those of ``task``,
    a :class:`~bnfold.numerics.end_to_end.Task`) against ``reference(i, holding)``, the float model's outputs of
    batch ``i`` (computed once per batch, as the runtimes run batch by batch: no batch's outputs are kept)."""
    out = RuntimeRun(runtime, RUNTIMES.get(runtime, "?"), None)
    runs = {which: _runner(runtime, m) for which, m in (("unfolded", model), ("folded", folded_model)) if m is not None}
    sums = {which: EndToEndSum(task, top1=False) for which in runs}
    for i, b in enumerate(batches):
        refs = reference(i, 0)
        for which, run in runs.items():
            sums[which].add(run(b), refs)
        del refs
    for which, s in sums.items():
        setattr(out, which, s.result())
    return out
