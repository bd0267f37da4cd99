"""H. What the fold saves, measured on the task: trained PaddleOCR models on rendered text, in fp32, in real
fp16 runtimes and under bnfold's emulator profiles, unfolded and folded.

    .venv/bin/python benchmarks/task_accuracy.py [--pages 6] [--lines 24] [--no-torch] [--quick] [--out DIR]

The models are the ones the rapidocr wheels ship (PP-OCRv4 and PP-OCRv6 det and rec, the v2.0 angle
classifier).  The inputs are rendered here (:mod:`bnfold.demo.pages`: matplotlib's DejaVu Sans, strings
from fixed seeds): ``--pages`` pages of four lines for the detectors and recognizers (each page's lines,
cut at their ground-truth boxes, are one recognizer batch) and ``--lines`` lines, every other one turned
by 180 degrees, for the classifier.  Task metrics (:mod:`bnfold.demo.ocr_task`):

* det: DB post-processing as PaddleOCR runs it (threshold 0.3, box threshold 0.6, unclip ratio 1.5);
  regions matched one to one at IoU >= 0.5 against the rendered ground truth and against fp32's
  regions (recall, precision), and the IoU of the text mask (probability > 0.3) with fp32's;
* rec: CTC greedy decoding with the model's own character table; lines read exactly and character
  error rate, against the ground truth and against fp32's reading;
* cls: top-1 against the rotation drawn and agreement with fp32.

Columns: ONNX Runtime fp32; ONNX Runtime on the float16 conversion (onnxconverter-common,
``keep_io_types=True``) and PyTorch half (the ONNX graph op by op in float16 on CPU; no torch model of
these networks exists), each unfolded and folded (the ONNX ``bnfold fold`` writes); the emulator
profiles ``fp16`` and ``ort-cpu`` at the model's eps and ``htp`` at QNN's batch-norm eps 1e-9, unfolded
and folded.  Writes ``task_accuracy.{json,md}`` under ``--out`` (``*_quick`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import RESULTS, machine, quiet, table, write_json, write_text  # noqa: E402

from bnfold.demo.ctc import characters  # noqa: E402
from bnfold.demo.ocr_metrics import cer, line_accuracy, top1  # noqa: E402
from bnfold.demo.ocr_runners import folded_model, runner  # noqa: E402
from bnfold.demo.ocr_task import MODELS, READ_PAD, classify, detect, load_model, read  # noqa: E402
from bnfold.demo.pages import render_page, rotated_lines  # noqa: E402

QNN_EPS = 1e-9
#: (column, how, bn_eps, folded)
COLUMNS = (
    ("fp32 ORT", "fp32", None, False),
    ("ORT fp16", "ort-fp16", None, False),
    ("ORT fp16 folded", "ort-fp16", None, True),
    ("torch half", "torch-half", None, False),
    ("torch half folded", "torch-half", None, True),
    ("fp16", "fp16", None, False),
    ("fp16 folded", "fp16", None, True),
    ("ort-cpu", "ort-cpu", None, False),
    ("ort-cpu folded", "ort-cpu", None, True),
    ("htp 1e-9", "htp", QNN_EPS, False),
    ("htp 1e-9 folded", "htp", QNN_EPS, True),
)
PAGE_SEED, LINE_SEED = 100, 200


def _columns(torch_half: bool):
    return [c for c in COLUMNS if torch_half or c[1] != "torch-half"]


def _log(model: str, col: str, text: str, seconds: float) -> None:
    print(f"  {model:<15} {col:<18} {text} ({seconds:.0f} s)", flush=True)


def bench_det(key: str, pages, columns) -> dict:
    """Per column: regions found, matched to the ground truth and to fp32's, the worst page's mask IoU."""
    model = load_model(key)
    folded = folded_model(model)
    out, ref = {}, None
    for col, how, eps, fold in columns:
        t = time.perf_counter()
        run = runner(folded if fold else model, how, eps)
        dets = [detect(run, p, None if ref is None else ref[i].regions) for i, p in enumerate(pages)]
        if ref is None:
            ref = dets
        cell = {
            "found": sum(len(d.regions) for d in dets),
            "truth": sum(d.truth.truth for d in dets),
            "matched_truth": sum(d.truth.matched for d in dets),
            "fp32_regions": sum(len(d.regions) for d in ref),
            "matched_fp32": sum((d.fp32.matched if d.fp32 else len(d.regions)) for d in dets),
            "pages_all_fp32": sum(bool(d.fp32 is None or d.fp32.matched == d.fp32.truth == d.fp32.found) for d in dets),
            "mask_iou_fp32_min": min(d.mask_iou(r) for d, r in zip(dets, ref)),
            "seconds": time.perf_counter() - t,
        }
        out[col] = cell
        text = (
            f"{cell['found']:>3} regions, {cell['matched_truth']}/{cell['truth']} of the text lines, "
            f"{cell['matched_fp32']}/{cell['fp32_regions']} of fp32's, mask IoU >= {cell['mask_iou_fp32_min']:.3f}"
        )
        _log(MODELS[key][0], col, text, cell["seconds"])
    return out


def bench_rec(key: str, pages, columns) -> dict:
    """Per column: lines read exactly and CER, against the ground truth and against fp32's reading."""
    model = load_model(key)
    folded = folded_model(model)
    table_ = characters(model)
    truth = [t for p in pages for t in p.texts]
    crops = [p.crops(pad=READ_PAD) for p in pages]
    out, ref = {}, None
    for col, how, eps, fold in columns:
        t = time.perf_counter()
        run = runner(folded if fold else model, how, eps)
        got = [s for c in crops for s in read(run, table_, c)]
        ref = got if ref is None else ref
        cell = {
            "lines": len(truth),
            "exact_truth": sum(a == b for a, b in zip(got, truth)),
            "cer_truth": cer(got, truth),
            "same_as_fp32": sum(a == b for a, b in zip(got, ref)),
            "cer_fp32": cer(got, ref),
            "line_accuracy": line_accuracy(got, truth),
            "seconds": time.perf_counter() - t,
        }
        out[col] = cell
        text = (
            f"{cell['exact_truth']}/{cell['lines']} lines exact, CER {100 * cell['cer_truth']:.1f}%, "
            f"{cell['same_as_fp32']}/{cell['lines']} as fp32 reads them"
        )
        _log(MODELS[key][0], col, text, cell["seconds"])
    return out


def bench_cls(lines: int, columns) -> dict:
    """Per column: top-1 against the rotation drawn, agreement with fp32."""
    model = load_model("cls")
    folded = folded_model(model)
    crops, labels = rotated_lines(LINE_SEED, lines)
    out, ref = {}, None
    for col, how, eps, fold in columns:
        t = time.perf_counter()
        pred = classify(runner(folded if fold else model, how, eps), crops)
        ref = pred if ref is None else ref
        cell = {
            "lines": len(labels),
            "correct": int(round(top1(pred, labels) * len(labels))),
            "agree_fp32": int(round(top1(pred, ref) * len(labels))),
            "seconds": time.perf_counter() - t,
        }
        out[col] = cell
        text = f"{cell['correct']}/{cell['lines']} correct, {cell['agree_fp32']}/{cell['lines']} as fp32"
        _log(MODELS["cls"][0], col, text, cell["seconds"])
    return out


def render(doc: dict) -> str:
    cols = doc["columns"]
    rows = []
    for key, res in doc["det"].items():
        name = MODELS[key][0]
        rows.append([f"{name}: regions found"] + [str(res[c]["found"]) for c in cols])
        rows.append(
            [f"{name}: text lines found (IoU >= 0.5)"] + [f"{res[c]['matched_truth']}/{res[c]['truth']}" for c in cols]
        )
        rows.append(
            [f"{name}: fp32's regions found"] + [f"{res[c]['matched_fp32']}/{res[c]['fp32_regions']}" for c in cols]
        )
        rows.append(
            [f"{name}: text-mask IoU with fp32 (worst page)"] + [f"{res[c]['mask_iou_fp32_min']:.3f}" for c in cols]
        )
    for key, res in doc["rec"].items():
        name = MODELS[key][0]
        rows.append([f"{name}: lines read exactly"] + [f"{res[c]['exact_truth']}/{res[c]['lines']}" for c in cols])
        rows.append([f"{name}: CER"] + [f"{100 * res[c]['cer_truth']:.1f}%" for c in cols])
        rows.append(
            [f"{name}: lines as fp32 reads them"] + [f"{res[c]['same_as_fp32']}/{res[c]['lines']}" for c in cols]
        )
    if doc["cls"]:
        res = doc["cls"]
        rows.append([f"{MODELS['cls'][0]}: top-1"] + [f"{res[c]['correct']}/{res[c]['lines']}" for c in cols])
        rows.append([f"{MODELS['cls'][0]}: as fp32"] + [f"{res[c]['agree_fp32']}/{res[c]['lines']}" for c in cols])
    n = doc["samples"]
    head = (
        f"Samples: {n['pages']} rendered pages ({n['text_lines']} text lines) for det and rec, {n['cls_lines']} "
        f"lines ({n['cls_lines'] // 2} turned by 180 degrees) for cls; seeds {PAGE_SEED} and {LINE_SEED}."
    )
    return head + "\n\n" + table(["", *cols], rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=6, help="rendered pages of four lines (det, rec)")
    ap.add_argument("--lines", type=int, default=24, help="rendered lines for the angle classifier")
    ap.add_argument("--no-torch", action="store_true", help="leave out the torch-half columns (the slowest)")
    ap.add_argument("--quick", action="store_true", help="one page, 6 lines, PP-OCRv4 det and rec only")
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = ap.parse_args(argv)
    quiet()
    import torch

    torch.set_num_threads(1)
    pages_n, lines_n = (1, 6) if args.quick else (args.pages, args.lines)
    columns = _columns(not args.no_torch)
    t0 = time.perf_counter()
    pages = [render_page(PAGE_SEED + i) for i in range(pages_n)]
    print(f"H. task accuracy: {pages_n} pages, {lines_n} classifier lines, {len(columns)} columns", flush=True)
    dets = ("v4-det",) if args.quick else ("v4-det", "v6-det")
    recs = ("v4-rec",) if args.quick else ("v4-rec", "v6-rec")
    doc = {
        "quick": args.quick,
        "columns": [c[0] for c in columns],
        "samples": {"pages": pages_n, "text_lines": sum(len(p.texts) for p in pages), "cls_lines": lines_n},
        "det": {k: bench_det(k, pages, columns) for k in dets},
        "rec": {k: bench_rec(k, pages, columns) for k in recs},
        "cls": bench_cls(lines_n, columns),
        "qnn_eps": QNN_EPS,
    }
    doc["seconds"] = time.perf_counter() - t0
    doc["machine"] = machine()
    text = render(doc)
    suffix = "_quick" if args.quick else ""
    out = args.out or RESULTS
    write_json("task_accuracy" + suffix, doc, out)
    write_text("task_accuracy" + suffix, "## H. Task accuracy\n\n" + text, out)
    print("\n" + text + f"\n\n({doc['seconds']:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
