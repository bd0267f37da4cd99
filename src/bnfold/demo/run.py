"""``bnfold demo``: what fp16 does to trained PaddleOCR models on their task (:mod:`bnfold.demo.ocr_demo`,
printed first) and to a small trained EfficientNet-style net, unfolded and folded.

Loads the committed checkpoint (trained by ``scripts/train_demo.py``), exports
the network, audits it under ``fp32``, ``fp16``, ``htp`` and ``htp`` with the
runtime eps of ExecuTorch's QNN batch-norm builder (1e-9, whatever the model
says), each unfolded and folded; prints one table and writes ``report.json``
and ``report_sqnr.png`` into ``out_dir``.  Every number is measured on the
held-out split; nothing is edited to provoke a failure: if the trained network
does not break, the demo says so.

What it prints does not move with the host CPU's float32 and half kernels: an output SQNR comes
with its spread over the batches (``58.5 ± 0.3 dB``), an SQNR above :data:`FLOAT32_DB` (float32's
own rounding against float64) is printed as ``>120``, and the worst batch norm is the one
:meth:`AuditReport.worst_norms` ranks first (by verdict and predicted loss, not by a measurement).
"""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import torch

from ..io.atomic import write_text
from ..numerics import audit
from ..numerics.plot import plot_reports
from ..numerics.risk import QNN_EPS
from ..numerics.table import db, pct, sci, sqnr, sqnr_spread
from ..numerics.tensor_error import json_float
from .data import load_split
from .model import DigitNet

CHECKPOINT = Path(__file__).resolve().parent / "digitnet.pt"
#: 450 held-out digits in 9 batches: the per-batch SQNRs give each output SQNR its spread
BATCH, QUICK_SAMPLES, QUICK_BATCH = 50, 64, 32
#: an SQNR above this is float32's rounding against float64 (~130 dB), whose last digits move with the CPU
FLOAT32_DB = 120.0
#: the audits: (key, profile, runtime eps); "htp-qnn" is htp with the QNN builder's eps
AUDITS = (("fp16", "fp16", None), ("htp", "htp", None), ("htp-qnn", "htp", QNN_EPS))
LABELS = {"fp16": "fp16", "htp": "htp", "htp-qnn": f"htp eps={QNN_EPS:g}"}


def load_model(path: Path = CHECKPOINT) -> tuple[DigitNet, dict]:
    ckpt = torch.load(path, weights_only=True)
    model = DigitNet()
    model.load_state_dict(ckpt["state_dict"])
    return model.eval(), ckpt.get("meta", {})


def _rows(reports: dict) -> list[dict]:
    rows = []
    fp32 = reports["fp32"]
    rows.append(_row("fp32", fp32, "unfolded"))
    for key, _, _ in AUDITS:
        for which in ("unfolded", "folded"):
            rows.append(_row(f"{LABELS[key]} {which}", reports[key], which))
    return rows


def _row(label: str, rep, which: str) -> dict:
    e2e = getattr(rep, which)
    worst = rep.worst_layers(1, which)
    w = getattr(worst[0], which) if worst else None
    return {
        "model": label,
        "accuracy": e2e.accuracy,
        "agreement_with_fp32": e2e.top1_agreement,
        "output_sqnr_db": e2e.output.sqnr_db,
        "output_sqnr_spread_db": e2e.sqnr_spread_db,
        "output_sqnr_cell": _sqnr_cell(e2e),
        "nonfinite_share": e2e.output.nonfinite_share,
        "nan": e2e.output.nan,
        "inf": e2e.output.inf,
        "worst_layer": worst[0].label if worst else None,
        "worst_layer_sqnr_db": w.sqnr_db if w else None,
    }


def _above_float32(x) -> bool:
    return x is not None and math.isfinite(x) and x > FLOAT32_DB


def _sqnr_cell(e2e) -> str:
    """The output SQNR with its spread over batches, ``>120`` where it is float32 noise, NaN/inf share if any."""
    if _above_float32(e2e.output.sqnr_db) and not e2e.output.nonfinite:
        return f">{FLOAT32_DB:.0f}"
    return sqnr_spread(e2e)


def _layer_db(x) -> str:
    return f">{FLOAT32_DB:.0f}" if _above_float32(x) else db(x)


def _table(rows: list[dict]) -> str:
    head = (
        f"  {'model':<24} {'accuracy':>9} {'agree w/ fp32':>14} {'output SQNR':>14} {'NaN/inf':>8}   "
        "worst layer (cumulative SQNR dB)"
    )
    lines = [head, "  " + "-" * (len(head) + 6)]
    for r in rows:
        worst = f"{r['worst_layer']} ({_layer_db(r['worst_layer_sqnr_db'])})" if r["worst_layer"] else "-"
        if _above_float32(r["worst_layer_sqnr_db"]):  # which layer is "worst" is float32 noise: none is named
            worst = f"- (every layer >{FLOAT32_DB:.0f})"
        out = r["output_sqnr_cell"] + ("" if r["nan"] or r["inf"] else " dB")
        lines.append(
            f"  {r['model']:<24} {pct(r['accuracy']):>9} {pct(r['agreement_with_fp32']):>14} "
            f"{out:>14} {str(r['nan']) + '/' + str(r['inf']):>8}   {worst}"
        )
    return "\n".join(lines)


def _worst_layers(rep, n: int = 3) -> list[str]:
    out = []
    for r in rep.worst_layers(n, "unfolded"):
        folded = _layer_sqnr(r.folded) + (" dB" if r.folded is not None and not r.folded.nonfinite else "")
        unfolded = _layer_sqnr(r.unfolded) + ("" if r.unfolded.nonfinite else " dB")
        out.append(
            f"    {r.title:<28} {r.kind + ('+bn' if r.norm else ''):<9} unfolded {unfolded:>8} -> folded {folded}"
        )
    return out


def _layer_sqnr(err) -> str:
    return f">{FLOAT32_DB:.0f}" if err is not None and not err.nonfinite and _above_float32(err.sqnr_db) else sqnr(err)


def _breaks(r: dict, fp32_acc) -> bool:
    return bool(r["nan"] or r["inf"] or (r["agreement_with_fp32"] or 0) < 1.0 or (r["accuracy"] or 0) < fp32_acc)


def _e2e(r: dict) -> str:
    out = f"NaN/inf {100 * r['nonfinite_share']:.3g}%" if r["nan"] or r["inf"] else f"{r['output_sqnr_cell']} dB"
    return f"accuracy {pct(r['accuracy'])}, agreement {pct(r['agreement_with_fp32'])}, output {out}"


def _risk_summary(rep) -> str:
    """How many norms each verdict got under ``rep``, and the worst one's predicted vs measured loss (the
    worst by :meth:`AuditReport.worst_norms`: verdict, then predicted loss, so the same on every CPU)."""
    counts = {v: sum(n.verdict == v for n in rep.norms) for v in ("overflows", "degrades", "safe")}
    worst = rep.worst_norms(1)
    text = ", ".join(f"{c} {v}" for v, c in counts.items() if c)
    if worst and worst[0].risk is not None and worst[0].risk.effective is not None:
        w = worst[0]
        meas = w.risk.measured.loss_db if w.risk.measured is not None else None
        text += (
            f"; the worst, {w.name} (kappa {w.runtime_kappa if w.runtime_kappa is not None else w.kappa:.3g}), "
            f"loses {w.risk.effective.loss_db:.1f} dB predicted, {db(meas)} dB measured (local SQNR, "
            "folded minus unfolded)"
        )
    return text


def _verdict(reports: dict, rows: list[dict]) -> tuple[bool, list[str]]:
    fp32_acc = rows[0]["accuracy"]
    by = {r["model"]: r for r in rows}
    plain = [by[f"{LABELS[k]} unfolded"] for k in ("fp16", "htp")]
    qnn_u, qnn_f = by[f"{LABELS['htp-qnn']} unfolded"], by[f"{LABELS['htp-qnn']} folded"]
    problem = any(_breaks(r, fp32_acc) for r in plain + [qnn_u])
    lines = []
    if any(_breaks(r, fp32_acc) for r in plain):
        bad = "; ".join(f"{r['model']}: {_e2e(r)}" for r in plain)
        lines.append(f"verdict: fp16 changes this network's predictions at its own eps ({bad}).")
    else:
        lines.append(
            "verdict at the model's eps: no fp16 problem on this network: fp16 and htp keep every held-out "
            "prediction of the fp32 model, with no NaN/inf, unfolded or folded."
        )
    if _breaks(qnn_u, fp32_acc):
        lines.append(
            f"with the runtime eps of ExecuTorch's QNN batch-norm builder ({QNN_EPS:g}) under htp, the "
            f"unfolded network breaks ({_e2e(qnn_u)}); folded it does not ({_e2e(qnn_f)})."
        )
    else:
        lines.append(
            f"with the runtime eps of ExecuTorch's QNN batch-norm builder ({QNN_EPS:g}) under htp, this "
            f"network does not break either: unfolded {_e2e(qnn_u)}; folded {_e2e(qnn_f)}."
        )
    lines.append(
        "why the fold protects it: a folded BatchNorm is part of the conv's weights and bias, computed in "
        "float64 and rounded once, so the backend never sees a BatchNorm and never applies its own eps or "
        "fp16 scale and bias'."
    )
    for key, _, _ in AUDITS:
        rep = reports[key]
        lines.append(f"batch norms under {LABELS[key]}: {_risk_summary(rep)}.")
    gain = {k: _gain(reports[k]) for k, _, _ in AUDITS}
    shown = ", ".join(f"{v} dB under {LABELS[k]}" for k, v in gain.items() if v is not None)
    if shown:
        lines.append(f"folding changes the output SQNR by {shown}.")
    h = min(reports["htp"].norms, key=lambda n: n.headroom if not math.isnan(n.headroom) else math.inf, default=None)
    if h is not None:
        lines.append(
            f"the smallest overflow headroom under htp is {sci(h.headroom)}x (at {h.name}, over its input, "
            "x*scale, bias' and sum)."
        )
    return problem, lines


def _gain(rep) -> str | None:
    """Folded minus unfolded output SQNR, batch by batch: ``+0.9 ± 0.2`` (mean ± standard deviation over
    the batches), or the difference of the totals when there is one batch; None when undefined."""
    u, f = rep.unfolded.batch_sqnr_db, rep.folded.batch_sqnr_db
    if len(u) >= 2 and len(u) == len(f) and all(math.isfinite(x) for x in u + f):
        d = [b - a for a, b in zip(u, f)]
        mean = sum(d) / len(d)
        spread = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1))
        return f"{mean:+.1f} ± {max(spread, 0.1):.1f}"
    total = rep.folded.output.sqnr_db - rep.unfolded.output.sqnr_db
    return f"{total:+.1f}" if math.isfinite(total) else None


def _wrap(text: str, indent: str) -> list[str]:
    """``text`` in lines of at most 100 characters that never split a ``value ± spread``."""
    glued = text.replace(" ± ", "\u00a0±\u00a0")  # textwrap breaks only at ASCII whitespace
    lines = textwrap.wrap(glued, 100, initial_indent=indent, subsequent_indent="    ")
    return [line.replace("\u00a0", " ") for line in lines]


def _ocr_task(out_dir: Path) -> tuple[list[str], dict | None]:
    """The OCR task part (:mod:`bnfold.demo.ocr_demo`), or one line saying why it cannot run."""
    from .ocr_demo import run as run_ocr

    try:
        return run_ocr(out_dir)
    except ValueError as e:  # the rapidocr wheels are not installed
        return [f"the OCR task: {e}"], None


def run_demo(out_dir=".", quick: bool = False, verbose: bool = True) -> dict:
    """Run the demo, print its table, write ``report.json`` and ``report_sqnr.png``; return the numbers
    (plain data: the table's rows, the verdict, the file paths).

    ``quick`` audits the first 64 held-out samples instead of all 450 (for tests).
    Runs single-threaded (restored afterwards): the ops are small, and threads only contend.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        task_lines, task = _ocr_task(out_dir)
        model, meta = load_model()
        _, _, x_test, y_test = load_split()
        if quick:
            x_test, y_test = x_test[:QUICK_SAMPLES], y_test[:QUICK_SAMPLES]
        size = QUICK_BATCH if quick else BATCH
        batches = [(b,) for b in x_test.split(size)]
        dynamic = None
        if len({b[0].shape[0] for b in batches}) > 1:
            dynamic = ({0: torch.export.Dim("batch")},)
        ep = torch.export.export(model, batches[0], dynamic_shapes=dynamic)
        reports = {"fp32": audit(ep, batches, profile="fp32", labels=y_test, fold=False, name="DigitNet")}
        for key, prof, eps in AUDITS:
            reports[key] = audit(ep, batches, profile=prof, bn_eps=eps, labels=y_test, name="DigitNet")
    finally:
        torch.set_num_threads(threads)
    rows = _rows(reports)
    problem, verdict = _verdict(reports, rows)
    n_params = sum(p.numel() for p in model.parameters())
    lines = [
        *task_lines,
        "",
        f"bnfold demo: DigitNet (EfficientNet-style: depthwise convs, SiLU, squeeze-excite; "
        f"{len(reports['htp'].norms)} BatchNorms, {n_params} parameters)",
        f"  trained by scripts/train_demo.py ({meta.get('epochs', '?')} epochs, seed {meta.get('seed', '?')}), "
        f"{len(y_test)} held-out digits{' (quick subset)' if quick else ''}; "
        f"{len(reports['htp'].fold_report.folded)} BatchNorms folded, "
        f"{len(reports['htp'].fold_report.skipped)} skipped",
        "",
        _table(rows),
        "",
    ]
    for key, _, _ in AUDITS:
        lines.append(f"  worst layers under {LABELS[key]} (cumulative SQNR against the reference run):")
        lines.extend(_worst_layers(reports[key]))
    lines.append("")
    for i, v in enumerate(verdict):
        lines.extend(_wrap(v, "  " if i else ""))
    json_path, png_path = out_dir / "report.json", out_dir / "report_sqnr.png"
    plot_reports([reports[key] for key, _, _ in AUDITS], png_path)
    result = {
        "ocr_task": task,
        "problem": problem,
        "verdict": verdict,
        "rows": rows,
        "samples": len(y_test),
        "quick": quick,
        "model": {"name": "DigitNet", "parameters": n_params, "checkpoint": CHECKPOINT.name, "training": meta},
        "report_json": str(json_path),
        "chart": str(png_path),
    }
    doc = dict(
        result,
        rows=[{k: json_float(v) if isinstance(v, float) else v for k, v in r.items()} for r in rows],
        audits={p: rep.to_dict() for p, rep in reports.items()},
    )
    write_text(json_path, json.dumps(doc, indent=1))
    lines.append("")
    lines.append(f"  wrote {json_path} and {png_path}")
    if verbose:
        print("\n".join(lines))
    return result
