"""``bnfold demo``: what fp16 does to a small trained EfficientNet-style net, unfolded and folded.

Loads the committed checkpoint (trained by ``scripts/train_demo.py``), exports
the network, audits it under ``fp32``, ``fp16`` and ``htp`` (each audit folds
it with ``bnfold.fold`` and measures both programs), prints one table and
writes ``report.json`` and ``report_sqnr.png`` into ``out_dir``.  Every
number is measured on the held-out split; nothing is edited to provoke a
failure.
"""

from __future__ import annotations

import json
import math
import textwrap
import time
from pathlib import Path

import torch

from ..io.atomic import write_text
from ..numerics import audit
from ..numerics.errors import json_float
from ..numerics.plot import plot_reports
from ..numerics.table import db, pct, sci
from .data import load_split
from .model import DigitNet

CHECKPOINT = Path(__file__).resolve().parent / "digitnet.pt"
BATCH, QUICK_SAMPLES, QUICK_BATCH = 150, 64, 32
#: unit roundoff of fp16: an unfolded BN whose kappa approaches 1/U leaves nothing but rounding noise
U_FP16 = 2.0**-11


def load_model(path: Path = CHECKPOINT) -> tuple[DigitNet, dict]:
    ckpt = torch.load(path, weights_only=True)
    model = DigitNet()
    model.load_state_dict(ckpt["state_dict"])
    return model.eval(), ckpt.get("meta", {})


def _rows(reports: dict) -> list[dict]:
    rows = []
    fp32 = reports["fp32"]
    rows.append(_row("fp32", fp32, "unfolded"))
    for prof in ("fp16", "htp"):
        for which in ("unfolded", "folded"):
            rows.append(_row(f"{prof} {which}", reports[prof], which))
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
        "nan": e2e.output.nan,
        "inf": e2e.output.inf,
        "worst_layer": worst[0].label if worst else None,
        "worst_layer_sqnr_db": w.sqnr_db if w else None,
    }


def _table(rows: list[dict]) -> str:
    head = f"  {'model':<15} {'accuracy':>9} {'agree w/ fp32':>14} {'output SQNR':>12} {'NaN/inf':>8}   worst layer (SQNR dB)"
    lines = [head, "  " + "-" * (len(head) + 6)]
    for r in rows:
        worst = f"{r['worst_layer']} ({db(r['worst_layer_sqnr_db'])})" if r["worst_layer"] else "-"
        lines.append(f"  {r['model']:<15} {pct(r['accuracy']):>9} {pct(r['agreement_with_fp32']):>14} "
                     f"{db(r['output_sqnr_db']) + ' dB':>12} {str(r['nan']) + '/' + str(r['inf']):>8}   {worst}")
    return "\n".join(lines)


def _worst_layers(rep, n: int = 3) -> list[str]:
    out = []
    for r in rep.worst_layers(n, "unfolded"):
        folded = db(r.folded.sqnr_db) + " dB" if r.folded else "-"
        nan = f", NaN/inf {r.unfolded.nan}/{r.unfolded.inf}" if r.unfolded.nonfinite else ""
        out.append(f"    {r.label or r.name:<28} {r.kind + ('+bn' if r.norm else ''):<9} "
                   f"unfolded {db(r.unfolded.sqnr_db):>5} dB -> folded {folded}{nan}")
    return out


def _verdict(reports: dict, rows: list[dict]) -> tuple[bool, list[str]]:
    fp32_acc = rows[0]["accuracy"]
    unfolded = [r for r in rows[1:] if r["model"].endswith("unfolded")]
    problem = any(r["nan"] or r["inf"] or (r["agreement_with_fp32"] or 0) < 1.0 or (r["accuracy"] or 0) < fp32_acc
                  for r in unfolded)
    rep = reports["htp"]
    gain = {p: reports[p].folded.output.sqnr_db - reports[p].unfolded.output.sqnr_db for p in ("fp16", "htp")}
    lines = []
    if problem:
        bad = ", ".join(f"{r['model']}: accuracy {pct(r['accuracy'])}, agreement {pct(r['agreement_with_fp32'])}, "
                        f"NaN/inf {r['nan']}/{r['inf']}" for r in unfolded)
        lines.append(f"verdict: fp16 changes this network's predictions ({bad}).")
    else:
        lines.append("verdict: no fp16 problem on this network: fp16 and htp keep every held-out prediction of the "
                     "fp32 model, with no NaN/inf, unfolded or folded.")
    lines.append(f"folding changes the output SQNR by {gain['fp16']:+.1f} dB under fp16 and {gain['htp']:+.1f} dB "
                 "under htp.")
    norms = rep.norms
    if norms:
        k = max(norms, key=lambda n: n.kappa)
        h = min(norms, key=lambda n: n.headroom if not math.isnan(n.headroom) else math.inf)
        lines.append(f"where it would break: the largest kappa is {k.kappa:.3g} (at {k.name}, channel "
                     f"{k.kappa_channel}); an unfolded BN multiplies the fp16 rounding error of its input by about "
                     f"kappa, so its output is pure rounding noise once kappa nears 1/u = {1 / U_FP16:.0f} "
                     f"({1 / (U_FP16 * k.kappa):.3g} times this network's largest).")
        lines.append(f"the smallest overflow headroom is {sci(h.headroom)}x (input of {h.name}, max |x| "
                     f"{h.input_max_abs:.3g}): activations that much larger overflow fp16 (65504) to inf there.")
    return problem, lines


def run_demo(out_dir=".", quick: bool = False, verbose: bool = True) -> dict:
    """Run the demo, print its table, write ``report.json`` and ``report_sqnr.png``; return the numbers
    (plain data: the table's rows, the verdict, the file paths).

    ``quick`` audits the first 64 held-out samples instead of all 450 (for tests).
    Runs single-threaded (restored afterwards): the ops are small, and threads only contend.
    """
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
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
        reports = {"fp32": audit(ep, batches, profile="fp32", labels=y_test, fold=False)}
        for prof in ("fp16", "htp"):
            reports[prof] = audit(ep, batches, profile=prof, labels=y_test)
    finally:
        torch.set_num_threads(threads)
    rows = _rows(reports)
    problem, verdict = _verdict(reports, rows)
    n_params = sum(p.numel() for p in model.parameters())
    lines = [
        f"bnfold demo: DigitNet (EfficientNet-style: depthwise convs, SiLU, squeeze-excite; "
        f"{len(reports['htp'].norms)} BatchNorms, {n_params} parameters)",
        f"  trained by scripts/train_demo.py ({meta.get('epochs', '?')} epochs, seed {meta.get('seed', '?')}), "
        f"{len(y_test)} held-out digits{' (quick subset)' if quick else ''}; "
        f"{len(reports['htp'].fold_report.folded)} BatchNorms folded, {len(reports['htp'].fold_report.skipped)} skipped",
        "",
        _table(rows),
        "",
    ]
    for prof in ("fp16", "htp"):
        lines.append(f"  worst layers under {prof} (SQNR against float64):")
        lines.extend(_worst_layers(reports[prof]))
    lines.append("")
    for i, v in enumerate(verdict):
        lines.extend(textwrap.wrap(v, 100, initial_indent="  " if i else "", subsequent_indent="    "))
    json_path, png_path = out_dir / "report.json", out_dir / "report_sqnr.png"
    plot_reports([reports["fp16"], reports["htp"]], png_path,
                 titles=[f"DigitNet, profile {p}: per-layer SQNR vs float64" for p in ("fp16", "htp")])
    result = {
        "problem": problem,
        "verdict": verdict,
        "rows": rows,
        "samples": len(y_test),
        "quick": quick,
        "model": {"name": "DigitNet", "parameters": n_params, "checkpoint": CHECKPOINT.name, "training": meta},
        "report_json": str(json_path),
        "chart": str(png_path),
    }
    doc = dict(result, rows=[{k: json_float(v) if isinstance(v, float) else v for k, v in r.items()} for r in rows],
               audits={p: rep.to_dict() for p, rep in reports.items()})
    write_text(json_path, json.dumps(doc, indent=1))
    lines.append("")
    lines.append(f"  wrote {json_path} and {png_path} ({time.perf_counter() - t0:.0f} s)")
    if verbose:
        print("\n".join(lines))
    return result
