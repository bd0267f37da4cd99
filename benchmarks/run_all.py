"""Run the bnfold benchmarks A-D end to end (``make bench``).

    .venv/bin/python benchmarks/run_all.py [--quick] [--only A,B,C,D] [--out DIR]

A  fold_speed.py        fold time and scaling on conv-BN-ReLU chains (50, 200, 800 blocks)
B  inference_speed.py   latency unfolded / folded / no-BN ideal: torch eager, ExecuTorch portable, XNNPACK
C  fp16_fidelity.py     fp16 / htp fidelity unfolded vs folded (bnfold.audit): demo model + the B architectures
D  fold_real.py         fold time on real architectures (ResNet-18/50, R3D-18, EfficientNetV2-S, MobileNetV3-L,
                        FCN-ResNet50, LeViT-128S) vs torch.export, on the edge program, and vs weight I/O;
                        its files go to ``benchmarks/results/fold_real/`` (ignored by git via its own .gitignore)
E  transformer_block.py LayerNorm affines folded in a ViT block: latency and error
F  lowering.py          lowering the batch norms that cannot fold (x * scale + shift)
H  task_accuracy.py     the OCR task (trained PaddleOCR det / rec / cls on rendered text): fp32, ONNX Runtime fp16,
                        torch half and the emulator profiles, unfolded and folded

Each part runs in its own process (a part's memory and garbage do not leak
into the next one's timings), prints its tables and writes them as JSON and
Markdown under ``benchmarks/results/`` (``*_quick.*`` with ``--quick``).  This
script then writes ``summary.json`` / ``summary.md`` with the headline
ratios and the machine.  ``--quick`` is a smoke run with tiny sizes (about a
minute or two on an idle 2-core machine).  Nothing asserts on a time; the exit
status is non-zero only when a part fails to run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import RESULTS, fmt_pct, fmt_x, load_now, machine, write_json, write_text  # noqa: E402

#: The parts of the benchmark package, in run order: key -> (script, its results file without suffix).
#: A new part is one row (its script prints its tables and takes ``--quick`` and ``--out``).
PARTS = {
    "A": ("fold_speed.py", "fold_speed"),
    "B": ("inference_speed.py", "inference_speed"),
    "C": ("fp16_fidelity.py", "fp16_fidelity"),
    "D": ("fold_real.py", "fold_real/fold_real"),
    "E": ("transformer_block.py", "transformer_block"),
    "F": ("lowering.py", "lowering"),
    "H": ("task_accuracy.py", "task_accuracy"),
}
# Lines native libraries print on import that say nothing about the benchmark.
NOISE = re.compile(
    r"torchao/_C|_C_mxfp8|_C_cutlass|cpuinfo_utils\.cpp|register_constant\(\)|KernelPreference|"
    r"copyreg\.py|return cls\.__new__|LeafSpec|threadpool\.cpp"
)


def run_part(key: str, quick: bool, out: Path | None, extra: list[str]) -> tuple[int, float]:
    script, _ = PARTS[key]
    cmd = [
        sys.executable,
        "-u",
        str(HERE / script),
        *(["--quick"] if quick else []),
        *(["--out", str(out)] if out else []),
        *extra,
    ]
    print(f"\n=== {key}: {' '.join(cmd[2:])}", flush=True)
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=HERE.parent)
    assert proc.stdout is not None
    for line in proc.stdout:
        if not NOISE.search(line):
            print(line, end="", flush=True)
    rc = proc.wait()
    dt = time.perf_counter() - t
    print(f"=== {key}: exit {rc}, {dt:.0f} s", flush=True)
    return rc, dt


def _load(name: str, quick: bool, out: Path | None) -> dict | None:
    path = Path(out or RESULTS) / f"{name}{'_quick' if quick else ''}.json"
    if not path.exists():
        return None
    return json.loads(path.read_text())


def headline(quick: bool, out: Path | None) -> dict:
    h = {}
    a = _load("fold_speed", quick, out)
    if a:
        v = a["verdict"]
        h["A"] = {
            "largest_n": v["largest_n"],
            "et_pass_over_bnfold_edge": v["et_pass_over_bnfold_edge"],
            "et_pass_over_bnfold": v["et_pass_over_bnfold"],
            "bnfold_over_export": v["bnfold_over_export"],
            "bnfold_back_to_back_over_export": v.get("bnfold_back_to_back_over_export"),
            "bnfold_scaling": v["bnfold_scaling"],
            "bnfold_edge_scaling": v["bnfold_edge_scaling"],
            "bnfold_back_to_back_scaling": v.get("bnfold_back_to_back_scaling"),
            "bnfold_calls_scaling": v.get("bnfold_calls_scaling"),
            "et_pass_scaling": v["et_pass_scaling"],
            "target_met": v["target_met"],
            "linear": v.get("linear"),
            "under_5pct": v.get("under_5pct"),
        }
    b = _load("inference_speed", quick, out)
    if b:
        h["B"] = {
            rt: {
                "worst_folded_over_ideal": s["worst_folded_over_ideal"],
                "median_speedup": s["median_speedup"],
                "worst_folded_over_ideal_bias": s["worst_folded_over_ideal_bias"],
                "within_1.02": s["within_target"],
            }
            for rt, s in b["summary"].items()
        }
    c = _load("fp16_fidelity", quick, out)
    if c:
        h["C"] = {
            p: {
                "min_agreement_unfolded": s["min_agreement"]["unfolded"],
                "min_agreement_folded": s["min_agreement"]["folded"],
                "agreement_per_model": s.get("agreement_per_model", {}),
                "sqnr_gain_db": s["sqnr_gain_db"],
                "nonfinite": s["nonfinite"],
            }
            for p, s in c["summary"].items()
        }
    d = _load("fold_real/fold_real", quick, out)
    if d:
        h["D"] = {
            "verdict": d["verdict"],
            "goals": d["goals"],
            "rows": {
                r["model"]: {
                    "fold_over_export": r["ratios"]["fold_over_export"],
                    "edge_over_default": r["ratios"]["edge_over_default"],
                    "fold_over_weight_io": r["ratios"]["fold_over_weight_io"],
                    "large_weight": r["large_weight"],
                }
                for r in d["rows"]
            },
        }
    t = _load("task_accuracy", quick, out)
    if t:
        v4 = t["det"].get("v4-det", {})
        h["H"] = {
            "samples": t["samples"],
            "v4_det_text_lines": {c: [r["matched_truth"], r["truth"], r["found"]] for c, r in v4.items()},
        }
    return h


def render_headline(h: dict) -> str:
    lines = ["### Headline ratios", ""]
    if "A" in h:
        a = h["A"]
        lines.append(
            f"- A, N={a['largest_n']} blocks: ExecuTorch FuseBatchNormWithConvPass takes "
            f"{fmt_x(a['et_pass_over_bnfold_edge'], 1)} the bnfold fold time on the same edge program "
            f"({fmt_x(a['et_pass_over_bnfold'], 1)} bnfold on the ATen program); bnfold = "
            f"{fmt_pct(a['bnfold_over_export'])} of torch.export ("
            f"{fmt_pct(a['bnfold_back_to_back_over_export'])} back-to-back; target < 5%); scaling N/(N/4): bnfold "
            f"{fmt_x(a['bnfold_scaling'])} (ATen, round-robin median), {fmt_x(a['bnfold_edge_scaling'])} (edge), "
            f"{fmt_x(a['bnfold_back_to_back_scaling'])} (back-to-back min), "
            f"{fmt_x(a['bnfold_calls_scaling'])} (Python calls), ET pass "
            f"{fmt_x(a['et_pass_scaling'])}. Target {'met' if a['target_met'] else 'missed'} (linear: "
            f"{'yes' if a['linear'] else 'no'}; under 5% of export: {'yes' if a['under_5pct'] else 'no'})."
        )
    if "B" in h:
        for rt, v in h["B"].items():
            lines.append(
                f"- B, {rt}: folded/ideal worst {v['worst_folded_over_ideal']:.3f} (target <= 1.02: "
                f"{'met' if v['within_1.02'] else 'missed'}), median speedup unfolded/folded "
                f"{v['median_speedup']:.3f}x; folded/(ideal+bias) worst {v['worst_folded_over_ideal_bias']:.3f}."
            )
    if "C" in h:
        for p, v in h["C"].items():
            gains = ", ".join(f"{g:+.1f}" for g in v["sqnr_gain_db"])
            per = "; ".join(
                f"{m} {fmt_pct(a.get('unfolded'), 2)} -> {fmt_pct(a.get('folded'), 2)}"
                for m, a in v["agreement_per_model"].items()
            )
            lines.append(
                f"- C, {p}: top-1 agreement with fp32, unfolded -> folded: {per}; output SQNR gain from "
                f"folding {gains} dB; NaN+inf unfolded {v['nonfinite']['unfolded']}, folded "
                f"{v['nonfinite']['folded']}."
            )
    if "D" in h:
        d, v = h["D"], h["D"]["verdict"]
        per = "; ".join(
            f"{m} {fmt_pct(r['fold_over_export'])}, {fmt_x(r['edge_over_default'])}, "
            + (fmt_x(r["fold_over_weight_io"], 1) if r["large_weight"] else "-")
            for m, r in d["rows"].items()
        )
        lines.append(
            f"- D, real models (fold / export, edge / default fold, fold / weight I/O): {per}. Goals: "
            f"fold <= 10% of export {v['fold_over_export']['passed']}/{v['fold_over_export']['checked']}, "
            f"edge <= 2x default {v['edge_over_default']['passed']}/{v['edge_over_default']['checked']}, "
            f"fold <= 3x weight I/O (>= 10M params) {v['fold_over_weight_io']['passed']}/"
            f"{v['fold_over_weight_io']['checked']}."
        )
    if "H" in h:
        per = "; ".join(f"{c} {m}/{n} ({f} found)" for c, (m, n, f) in h["H"]["v4_det_text_lines"].items())
        lines.append(f"- H, PP-OCRv4 det on {h['H']['samples']['pages']} rendered pages, text lines found: {per}.")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run with tiny sizes")
    ap.add_argument("--only", default=",".join(PARTS), help="parts to run, e.g. A,C (default: all)")
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = ap.parse_args(argv)
    out = Path(args.out) if args.out else None
    t0 = time.perf_counter()
    info = machine()
    print(
        f"bnfold benchmarks{' (quick)' if args.quick else ''}: torch {info.get('torch')}, executorch "
        f"{info.get('executorch')}, {info.get('cpus')} CPUs ({info.get('lscpu', {}).get('Model name', '?')}), "
        f"load {load_now()}",
        flush=True,
    )
    status, seconds = {}, {}
    keys = [k.strip().upper() for k in args.only.split(",") if k.strip()]
    unknown = [k for k in keys if k not in PARTS]
    if unknown:
        ap.error(f"unknown part(s) {unknown}; choose from {', '.join(PARTS)}")
    for key in keys:
        # full run: also profile ExecuTorch's pass at 200 blocks, to show where its superlinear time goes
        extra = ["--profile-et", "200"] if key == "A" and not args.quick else []
        status[key], seconds[key] = run_part(key, args.quick, out, extra)
    total = time.perf_counter() - t0
    h = headline(args.quick, out)
    text = render_headline(h)
    parts = {}
    for key, (_, name) in PARTS.items():
        p = Path(out or RESULTS) / f"{name}{'_quick' if args.quick else ''}.md"
        if key in status and p.exists():
            parts[key] = p.read_text().strip()
    suffix = "_quick" if args.quick else ""
    doc = {
        "quick": args.quick,
        "machine": info,
        "load_end": load_now(),
        "exit": status,
        "seconds": seconds,
        "total_seconds": total,
        "headline": h,
    }
    write_json("summary" + suffix, doc, out)
    lscpu = info.get("lscpu", {})
    mach = (
        f"Machine: {lscpu.get('Model name', '?')}, {info.get('cpus')} CPUs ({lscpu.get('Core(s) per socket', '?')} "
        f"core(s)/socket, {lscpu.get('Thread(s) per core', '?')} thread(s)/core), {info.get('platform')}; "
        f"python {info.get('python')}, torch {info.get('torch')}, executorch {info.get('executorch')}, bnfold "
        f"{info.get('bnfold')}. Load average at start {info.get('loadavg_start')}, at end {doc['load_end']}. "
        f"Wall time {total:.0f} s (" + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items()) + ")."
    )
    write_text("summary" + suffix, "\n\n".join([text, mach, *parts.values()]), out)
    print("\n" + text + "\n\n" + mach, flush=True)
    return 0 if all(rc == 0 for rc in status.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
