"""Audit cost per model: ``bnfold.audit`` of one batch against the model's float32 forward (issue 26: <= 10x + fold).

    .venv/bin/python benchmarks/audit_ratio.py [--rounds 5] [--profile fp16] [--quick]

Models: the suite's architectures (``benchmarks/models.py``: calibrated BatchNorm statistics, one batch of
the default shape, ``--quick``: the small shapes), each as a torch program and as ONNX (TorchScript
exporter, BatchNorm kept), and the trained PaddleOCR models of the rapidocr wheels installed in the venv.

Per model (1 torch thread; the least process CPU time over ``--rounds`` after one untimed warm-up call of each):

* ``fp32 fwd``  the float32 forward: ``ep.module()(x)`` for a torch program; for ONNX the same graph run
                eagerly with the audit's torch ops (``OnnxEmulator(model, "fp32").run(x, reference=False)``);
* ``fold``      ``bnfold.fold`` of the model (the audit folds once);
* ``audit``     ``bnfold.audit(model, [(x,)], profile=..., tensors=False)``: what ``bnfold audit`` runs for its
                table: fold, the unfolded program emulated with its reference (float32 under the profiles
                that store fp16) and local errors, the folded one, the values the rows read measured, risk;
* ``json``      the same with ``tensors=True`` (``bnfold audit --json``, the API's default): every floating
                value of both programs measured against its reference;
* ``ratio``     ``(audit - fold) / fp32 fwd`` (goal <= 10: ``PASS`` / ``MISS``), and the same for ``json``.

A benchmark, not a test: nothing asserts on a time.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "numerics"))

import onnx
import torch
from numerics_helpers import onnx_keeping_batch_norms

import bnfold
from bnfold.numerics.onnx_emulator import OnnxEmulator

GOAL = 10.0
#: the rapidocr models and the input each audits on (a text line, a page crop, a cls crop)
OCR = {"cls": (1, 3, 48, 192), "v4-det": (1, 3, 320, 320), "v4-rec": (1, 3, 48, 320), "v6-rec": (1, 3, 48, 320)}


def _min_time(fn, rounds: int) -> float:
    """The least CPU time of this process over ``rounds`` calls (one thread: a shared machine's other load
    inflates wall-clock time, hardly the process's own CPU time; the least is the least disturbed)."""
    fn()  # warm-up (oneDNN builds its kernels on first use of a shape and dtype)
    times = []
    for _ in range(rounds):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return min(times)


def _onnx(net, x) -> onnx.ModelProto:
    return onnx_keeping_batch_norms(net, x)  # TorchScript exporter, BatchNorm nodes kept


def _row(name: str, model, x, rounds: int, profile: str) -> list:
    if isinstance(model, onnx.ModelProto):
        fp32 = OnnxEmulator(model, "fp32")
        fwd = _min_time(lambda: fp32.run(x, reference=False), rounds)
    else:
        module = model.module()
        with torch.no_grad():
            fwd = _min_time(lambda: module(x), rounds)
    fold = _min_time(lambda: bnfold.fold(model), rounds)
    audit = _min_time(lambda: bnfold.audit(model, [(x,)], profile=profile, tensors=False), rounds)
    full = _min_time(lambda: bnfold.audit(model, [(x,)], profile=profile, tensors=True), rounds)
    ratio, ratio_full = (audit - fold) / fwd, (full - fold) / fwd
    return [
        name,
        f"{fwd:.4f}",
        f"{fold:.3f}",
        f"{audit:.3f}",
        f"{ratio:.1f}x",
        "PASS" if ratio <= GOAL else "MISS",
        f"{full:.3f}",
        f"{ratio_full:.1f}x",
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--profile", default="fp16")
    p.add_argument("--quick", action="store_true", help="the suite's small shapes, no rapidocr models")
    p.add_argument("--only", default="", help="comma-separated model keys (resnet, efficientnet, audio, v4-rec, ...)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    from models import ARCHS, QUICK_SHAPES, build

    only = set(filter(None, args.only.split(",")))
    rows = []
    for arch in ARCHS:
        if only and arch not in only:
            continue
        b = build(arch, QUICK_SHAPES[arch] if args.quick else None, calib_batches=2)
        (x,) = b["example"]
        shape = "x".join(map(str, x.shape))
        rows.append(
            _row(f"{arch} (torch program) {shape}", torch.export.export(b["model"], (x,)), x, args.rounds, args.profile)
        )
        rows.append(_row(f"{arch} (ONNX) {shape}", _onnx(b["model"], x), x, args.rounds, args.profile))
    if not args.quick:
        try:
            from paddleocr_models import model_path
        except ImportError:
            model_path = None
        for key, shape in OCR.items():
            if only and key not in only:
                continue
            try:
                model = onnx.load(model_path(key))
            except (FileNotFoundError, TypeError):
                print(f"rapidocr model {key} is not installed: skipped", file=sys.stderr)
                continue
            x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
            rows.append(_row(f"PP-OCR {key} (ONNX) {'x'.join(map(str, shape))}", model, x, args.rounds, args.profile))
    headers = ["model", "fp32 fwd s", "fold s", "audit s", "(audit-fold)/fwd", f"goal <= {GOAL:g}x", "json s", "ratio"]
    widths = [max(len(str(r[i])) for r in rows + [headers]) for i in range(len(headers))]
    for r in [headers] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
