"""Audit speed: ``bnfold.audit`` time against the model's float32 forward (issue 19, goal: audit <= 10x forward + fold).

    .venv/bin/python benchmarks/audit_speed.py [--rounds 3] [--size 128]

Models: PP-OCRv4 rec (the trained ONNX model of the rapidocr-onnxruntime wheel, input 1x3x48x320) and the
EfficientNetV2-S-shaped network of ``real_models.py`` (random weights, calibrated BatchNorm statistics;
input 1x3xSxS), the latter both as ONNX (``torch.onnx.export``) and as a torch program.

Per model (1 torch thread; medians over ``--rounds`` after one untimed warm-up call of each):

* ``fp32 fwd``  the float32 forward the audit is measured against: the ONNX graph run eagerly with the audit's
                torch ops (``OnnxEmulator(model, "fp32").run(x, reference=False)``), or ``ep.module()(x)``;
* ``fold``      ``bnfold.fold`` of the model (the audit folds once);
* ``audit``     ``bnfold.audit(model, [(x,)], profile="fp16")`` with one batch: fold, emulate unfolded (with the
                float64 reference and local errors) and folded, risk, table data;
* ``ratio``     ``(audit - fold) / fp32 fwd``; goal <= 10 (``PASS`` / ``MISS``).

A benchmark, not a test: nothing asserts on a time.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import onnx
import torch

import bnfold
from bnfold.numerics.onnx_emulator import OnnxEmulator

GOAL = 10.0


def _median_time(fn, rounds: int) -> float:
    fn()  # warm-up (oneDNN builds its kernels on first use of a shape and dtype)
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _pp_ocr_v4_rec():
    import importlib.util

    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "models", "ch_PP-OCRv4_rec_infer.onnx")
    return onnx.load(path), torch.randn(1, 3, 48, 320)


def _efficientnet(size: int):
    from real_models import CALIB_SHAPES, DEFAULT_CALIB_SHAPE, calibrate, efficientnet_v2_s

    torch.manual_seed(0)
    net = calibrate(efficientnet_v2_s(), CALIB_SHAPES.get("efficientnet_v2_s", DEFAULT_CALIB_SHAPE))
    x = torch.randn(1, 3, size, size)
    f = io.BytesIO()
    torch.onnx.export(net, (x,), f, dynamo=False, opset_version=17, input_names=["x"], do_constant_folding=False)
    return net, onnx.load_from_string(f.getvalue()), x


def _row(name: str, model, x, rounds: int) -> list:
    if isinstance(model, onnx.ModelProto):
        fp32 = OnnxEmulator(model, "fp32")
        fwd = _median_time(lambda: fp32.run(x, reference=False), rounds)
    else:
        module = model.module()
        with torch.no_grad():
            fwd = _median_time(lambda: module(x), rounds)
    fold = _median_time(lambda: bnfold.fold(model), rounds)
    audit = _median_time(lambda: bnfold.audit(model, [(x,)], profile="fp16"), rounds)
    ratio = (audit - fold) / fwd
    return [name, f"{fwd:.3f}", f"{fold:.3f}", f"{audit:.3f}", f"{ratio:.1f}x", "PASS" if ratio <= GOAL else "MISS"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--size", type=int, default=128, help="EfficientNetV2-S input side (default 128)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    rec = _pp_ocr_v4_rec()
    if rec is None:
        print("rapidocr-onnxruntime is not installed (make install): PP-OCRv4 rec skipped", file=sys.stderr)
    else:
        rows.append(_row("PP-OCRv4 rec (ONNX) 1x3x48x320", *rec, args.rounds))
    net, eff_onnx, x = _efficientnet(args.size)
    rows.append(_row(f"EfficientNetV2-S (ONNX) 1x3x{args.size}x{args.size}", eff_onnx, x, args.rounds))
    ep = torch.export.export(net, (x,))
    rows.append(_row(f"EfficientNetV2-S (torch program) 1x3x{args.size}x{args.size}", ep, x, args.rounds))
    headers = ["model", "fp32 fwd s", "fold s", "audit s", "(audit-fold)/fwd", f"goal <= {GOAL:g}x"]
    widths = [max(len(str(r[i])) for r in rows + [headers]) for i in range(len(headers))]
    for r in [headers] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
