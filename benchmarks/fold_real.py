"""D. Fold speed on real architectures: bnfold.fold against torch.export, on the edge program, and against weight I/O.

    .venv/bin/python benchmarks/fold_real.py [--models resnet18,resnet50,...] [--rounds 3] [--quick] [--out DIR]
    .venv/bin/python benchmarks/fold_real.py --profile resnet50[,r3d_18,...]

Models: ``real_models.py`` (ResNet-18/50, R3D-18, EfficientNetV2-S, MobileNetV3-Large, FCN-ResNet50,
LeViT-128S; faithful layer tables, random weights, calibrated BatchNorm statistics).  ``chain800`` (part A's
800-block conv-BN-ReLU chain) can be selected with ``--models`` for the synthetic goal; it is not in the default list
(its ``to_edge`` alone takes over a minute).

Per model, measured side by side in one process, round robin (one call of each per round, median over rounds;
a full ``gc.collect()`` runs untimed before every timed call; 1 torch thread):

* ``export``     ``torch.export.export(model, x)``;
* ``fold``       ``bnfold.fold(ep)`` on that program (default ATen IR);
* ``fold edge``  ``bnfold.fold(edge_ep)``, ``edge_ep = executorch.exir.to_edge(ep).exported_program()``
                 (``to_edge`` runs once, untimed for the ratio, its time shown for context);
* ``weight I/O`` the baseline for the large-weight goal: for every tensor the fold writes (the tensors of the
                 folded program that are not tensors of the input program: the folded conv / linear weights and
                 their new or updated biases), ``w * s`` with ``s`` a per-output-channel scale of ``w``'s dtype,
                 broadcast over the other dimensions: one read and one write of each written tensor, the memory
                 floor of any fold that writes them (the same work as a ``clone()`` plus a multiply); the products
                 are all kept until the timed call returns, as the folded program keeps its new tensors;
* ``f64 I/O``    ``(w.double() * s64).to(w.dtype)`` over the same tensors: the same scaling through a float64
                 round trip (three passes over float64 data), what a fold doing all weight arithmetic in float64
                 costs (context only, no goal).

Goals (``GOALS``; PASS / MISS per model): fold <= 10% of ``torch.export`` (5% for ``chain800``); edge fold <= 2x the
default-IR fold; fold <= 3x weight I/O for large-weight models (>= 10 M parameters).  Ratios are medians of the
per-round ratios.  Nothing asserts on a time.  Results: ``benchmarks/results/fold_real/`` (``fold_real.{json,md}``,
``*_quick.*`` with ``--quick``, ``fold_real_profile.txt`` from ``--profile``); that folder carries its own
``.gitignore`` (``*``), so regenerated results never show up as changes.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (
    RESULTS,
    batch_norm_nodes,
    fmt_pct,
    fmt_s,
    fmt_x,
    load_now,
    log,
    machine,
    median,
    paired_ratio,
    quiet,  # noqa: E402
    round_robin,
    table,
    write_json,
    write_text,
)
from common import timed as _timed  # noqa: E402

DEFAULT_MODELS = (
    "resnet18",
    "resnet50",
    "r3d_18",
    "efficientnet_v2_s",
    "mobilenet_v3_large",
    "fcn_resnet50",
    "levit_128s",
)
QUICK_MODELS = ("resnet18", "levit_128s")
EXTRA_MODELS = ("chain800",)
LARGE_WEIGHT_PARAMS = 10_000_000
GOALS = {
    "fold_over_export": 0.10,
    "fold_over_export_synthetic": 0.05,
    "edge_over_default": 2.0,
    "fold_over_weight_io": 3.0,
}
COLUMNS = ("export", "fold", "fold_edge", "weight_io", "f64_io")
SUBDIR = "fold_real"


def timed(fn):
    """``common.timed`` after an untimed full garbage collection (as in fold_speed.py)."""
    gc.collect()
    return _timed(fn)


def out_folder(out: str | Path | None) -> Path:
    """``<results>/fold_real/``, created with a ``.gitignore`` of ``*`` (regenerated files are never tracked)."""
    path = Path(out or RESULTS) / SUBDIR
    path.mkdir(parents=True, exist_ok=True)
    ignore = path / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# written by benchmarks/fold_real.py: regenerated results, not kept in git\n*\n")
    return path


def build(name: str) -> dict:
    import torch

    if name.startswith("chain"):
        from models import chain

        n = int(name[len("chain") :])
        model, x = chain(n)
        return {
            "model": model,
            "example": x,
            "shape": tuple(x[0].shape),
            "description": f"part A's synthetic chain: {n} conv-BN-ReLU blocks "
            "(8 channels, every second conv depthwise)",
            "batchnorms": n,
            "parameters": sum(p.numel() for p in model.parameters()),
            "synthetic": True,
        }
    import real_models

    torch.manual_seed(0)
    b = real_models.build(name)
    b["synthetic"] = False
    return b


def to_edge_program(ep):
    """``to_edge(ep).exported_program()``; if the IR validity check rejects the program, again without it."""
    from executorch.exir import EdgeCompileConfig, to_edge

    try:
        return to_edge(ep).exported_program(), True
    except Exception as e:  # pragma: no cover - depends on the model's ops
        log(f"    to_edge with IR validation failed ({type(e).__name__}: {str(e)[:120]}); retrying without")
        return to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program(), False


def _tensors(ep):
    import torch

    for store in (ep.state_dict, ep.constants):
        for v in store.values():
            if isinstance(v, torch.Tensor):
                yield v


def written_tensors(before, after) -> list:
    """Tensors of the folded program ``after`` whose storage is not one of the input program's: what the fold wrote
    (bnfold replaces tensors and shares every untouched one with its input)."""
    old = {t.untyped_storage().data_ptr() for t in _tensors(before)}
    return [t.detach() for t in _tensors(after) if t.untyped_storage().data_ptr() not in old]


def weight_io_pairs(tensors: list) -> list:
    """(w, s64, s) per written tensor: per-output-channel scales in float64 and in w's dtype, shaped to broadcast."""
    import torch

    g = torch.Generator().manual_seed(0)
    out = []
    for w in tensors:
        s = torch.empty(w.shape[0] if w.dim() else 1, dtype=torch.float64).uniform_(0.5, 1.5, generator=g)
        s = s.view(-1, *([1] * (w.dim() - 1))) if w.dim() else s[0]
        out.append((w, s, s.to(w.dtype)))
    return out


def weight_io(pairs) -> list:
    """One read and one write of every written tensor (the large-weight baseline).  The results stay alive until the
    call returns, as a fold's output program keeps its new tensors: each write lands in fresh memory (page faults
    included), not in the buffer the previous product just freed."""
    return [w * s for w, _, s in pairs]


def f64_io(pairs) -> list:
    """The same scaling through a float64 round trip (context); results kept alive as in ``weight_io``."""
    return [(w.double() * s64).to(w.dtype) for w, s64, _ in pairs]


def _bn_folds(report) -> int:
    return sum(f.kind == "batch_norm" for f in report.folded)


def _patterns(report) -> dict:
    out: dict[str, int] = {}
    for f in report.folded:
        out[f.pattern] = out.get(f.pattern, 0) + 1
    return out


def measure(name: str, rounds: int) -> dict:
    import torch

    import bnfold

    t0 = time.perf_counter()
    b = build(name)
    model, x = b["model"], b["example"]
    t_build = time.perf_counter() - t0
    ep = torch.export.export(model, x)  # untimed: the program every fold works on (and a per-model warm-up)
    t_edge, (eep, validated) = timed(lambda: to_edge_program(ep))
    res = bnfold.fold(ep)  # warm-up, and the report / written tensors
    res_edge = bnfold.fold(eep)
    written = written_tensors(ep, res.model)
    pairs = weight_io_pairs(written)
    written_bytes = sum(w.numel() * w.element_size() for w in written)
    info = {
        "model": name,
        "description": b["description"],
        "input_shape": list(b["shape"]),
        "calib_shape": list(b.get("calib_shape") or []),
        "synthetic": b["synthetic"],
        "parameters": b["parameters"],
        "batchnorm_modules": b["batchnorms"],
        "large_weight": b["parameters"] >= LARGE_WEIGHT_PARAMS,
        "nodes_aten": len(ep.graph.nodes),
        "nodes_edge": len(eep.graph.nodes),
        "batch_norm_nodes_aten": batch_norm_nodes(ep),
        "batch_norm_nodes_edge": batch_norm_nodes(eep),
        # folds of a batch norm (``Folded.kind``); the rest are other per-channel affines bnfold also folds
        # (e.g. the ``/ 6`` of a decomposed hardswish in the edge program)
        "folded": _bn_folds(res.report),
        "folded_other": len(res.report.folded) - _bn_folds(res.report),
        "skipped": len(res.report.skipped),
        "skipped_reasons": [f"{s.norm}: {s.reason}" for s in res.report.skipped],
        "folded_edge": _bn_folds(res_edge.report),
        "folded_other_edge": len(res_edge.report.folded) - _bn_folds(res_edge.report),
        "skipped_edge": len(res_edge.report.skipped),
        "patterns": _patterns(res.report),
        "patterns_edge": _patterns(res_edge.report),
        "batch_norm_nodes_left": batch_norm_nodes(res.model),
        "batch_norm_nodes_left_edge": batch_norm_nodes(res_edge.model),
        "written_tensors": len(written),
        "written_bytes": written_bytes,
        "to_edge_s": t_edge,
        "to_edge_validated": validated,
        "build_s": t_build,
    }
    del res, res_edge

    def t_fold():
        return timed(lambda: bnfold.fold(ep))[0]

    def t_fold_edge():
        return timed(lambda: bnfold.fold(eep))[0]

    fns = {
        "export": lambda: timed(lambda: torch.export.export(model, x))[0],
        "fold": t_fold,
        "fold_edge": t_fold_edge,
        "weight_io": lambda: timed(lambda: weight_io(pairs))[0],
        "f64_io": lambda: timed(lambda: f64_io(pairs))[0],
    }
    t1 = time.perf_counter()
    times = round_robin(fns, rounds)
    med = {k: median(v) for k, v in times.items()}
    # the default-IR fold back to back (GC paused inside each call): the floor under the round-robin number
    warm = []
    for _ in range(3):
        gc.collect()
        gc.disable()
        try:
            warm.append(_timed(lambda: bnfold.fold(ep))[0])
        finally:
            gc.enable()
    ratios = {
        "fold_over_export": paired_ratio(times["fold"], times["export"]),
        "edge_over_default": paired_ratio(times["fold_edge"], times["fold"]),
        "fold_over_weight_io": paired_ratio(times["fold"], times["weight_io"]),
        "fold_over_f64_io": paired_ratio(times["fold"], times["f64_io"]),
        "fold_back_to_back_over_export": min(warm) / med["export"],
    }
    export_goal = GOALS["fold_over_export_synthetic"] if b["synthetic"] else GOALS["fold_over_export"]
    goals = {
        "fold_over_export": {
            "target": export_goal,
            "value": ratios["fold_over_export"],
            "pass": ratios["fold_over_export"] <= export_goal,
        },
        "edge_over_default": {
            "target": GOALS["edge_over_default"],
            "value": ratios["edge_over_default"],
            "pass": ratios["edge_over_default"] <= GOALS["edge_over_default"],
        },
        "fold_over_weight_io": (
            {
                "target": GOALS["fold_over_weight_io"],
                "value": ratios["fold_over_weight_io"],
                "pass": ratios["fold_over_weight_io"] <= GOALS["fold_over_weight_io"],
            }
            if info["large_weight"]
            else {"target": None, "value": ratios["fold_over_weight_io"], "pass": None}
        ),
    }
    log(
        f"  {name}: "
        + ", ".join(f"{k} {med[k]:.3f}s" for k in COLUMNS)
        + f"; to_edge {t_edge:.1f}s; fold/export {fmt_pct(ratios['fold_over_export'])}, edge/default "
        f"{fmt_x(ratios['edge_over_default'])}, fold/weight I/O {fmt_x(ratios['fold_over_weight_io'])}; "
        f"{len(times['export'])} rounds in {time.perf_counter() - t1:.0f}s; load {load_now()}"
    )
    return {
        **info,
        "rounds": len(times["export"]),
        "times_s": times,
        "median_s": med,
        "fold_back_to_back_s": warm,
        "fold_back_to_back_min_s": min(warm),
        "ratios": ratios,
        "goals": goals,
    }


def _src_dirty() -> list[str]:
    """Files under src/ that differ from HEAD when the run starts (read-only ``git status``): the numbers belong to
    the working tree, which others may be editing."""
    import subprocess

    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--", "src"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).resolve().parent.parent,
        ).stdout
    except Exception:
        return []
    return [line[3:] for line in out.splitlines() if line.strip()]


def _verdict(rows: list[dict]) -> dict:
    def status(goal):
        marks = [r["goals"][goal]["pass"] for r in rows if r["goals"][goal]["pass"] is not None]
        return {
            "checked": len(marks),
            "passed": sum(marks),
            "all_pass": all(marks),
            "missed": [r["model"] for r in rows if r["goals"][goal]["pass"] is False],
        }

    return {g: status(g) for g in ("fold_over_export", "edge_over_default", "fold_over_weight_io")}


def _mark(p) -> str:
    return "-" if p is None else ("PASS" if p else "MISS")


def render(doc: dict) -> str:
    rows = doc["rows"]
    head = [
        "model",
        "params",
        "BN folded/skipped (ATen)",
        "BN folded/skipped (edge)",
        "export s",
        "fold s",
        "fold edge s",
        "weight I/O s",
        "f64 I/O s",
        "to_edge s (1x)",
        "fold / export",
        "goal",
        "edge / default",
        "goal <= 2x",
        "fold / weight I/O",
        "goal <= 3x",
    ]
    body = []
    for r in rows:
        m, q, g = r["median_s"], r["ratios"], r["goals"]
        body.append(
            [
                r["model"],
                f"{r['parameters'] / 1e6:.2f}M",
                f"{r['folded']}/{r['skipped']}",
                f"{r['folded_edge']}/{r['skipped_edge']}",
                fmt_s(m["export"]),
                fmt_s(m["fold"]),
                fmt_s(m["fold_edge"]),
                fmt_s(m["weight_io"]),
                fmt_s(m["f64_io"]),
                fmt_s(r["to_edge_s"]),
                fmt_pct(q["fold_over_export"]),
                f"{_mark(g['fold_over_export']['pass'])} (<= {g['fold_over_export']['target']:.0%})",
                fmt_x(q["edge_over_default"]),
                _mark(g["edge_over_default"]["pass"]),
                fmt_x(q["fold_over_weight_io"], 1),
                _mark(g["fold_over_weight_io"]["pass"]),
            ]
        )
    notes = []
    for r in rows:
        notes.append(
            f"- **{r['model']}**: {r['description']}; input {'x'.join(map(str, r['input_shape']))}"
            + (f" (BN calibrated at {'x'.join(map(str, r['calib_shape'][1:]))})" if r["calib_shape"] else "")
            + f"; {r['nodes_aten']} ATen / {r['nodes_edge']} edge nodes, {r['batch_norm_nodes_aten']} "
            f"batch_norm nodes ({r['batch_norm_nodes_left']} left after the fold, "
            f"{r['batch_norm_nodes_left_edge']} in the edge program); the fold writes "
            f"{r['written_tensors']} tensors, {r['written_bytes'] / 2**20:.1f} MiB"
            + (
                f"; other affines folded: {r['folded_other']} (ATen), {r['folded_other_edge']} (edge: "
                + ", ".join(f"{k} x{v}" for k, v in r["patterns_edge"].items() if "batch_norm" not in k)
                + ")"
                if r["folded_other"] or r["folded_other_edge"]
                else ""
            )
            + f"; fold back-to-back min "
            f"{fmt_s(r['fold_back_to_back_min_s'])} s = {fmt_pct(r['ratios']['fold_back_to_back_over_export'])}"
            f" of export; fold / f64 I/O {fmt_x(r['ratios']['fold_over_f64_io'], 1)}"
            + (f"; skipped: {'; '.join(r['skipped_reasons'])}" if r["skipped_reasons"] else "")
            + ("" if r["to_edge_validated"] else "; to_edge without IR validation")
        )
    v = doc["verdict"]
    summary = "; ".join(
        f"{g}: {s['passed']}/{s['checked']} pass" + (f" (MISS: {', '.join(s['missed'])})" if s["missed"] else "")
        for g, s in v.items()
    )
    rounds = ", ".join(sorted({str(r["rounds"]) for r in rows}))
    return "\n".join(
        [
            "### D. Fold speed on real architectures "
            "(seconds, median of rounds; round robin in one process, 1 torch thread)",
            "",
            table(head, body),
            "",
            f"Rounds: {rounds}. Ratios are medians of per-round ratios. weight I/O = `w * s` (s: per-output-channel "
            "scale in w's dtype) over every tensor the fold writes, all products kept alive until the timed call "
            "returns: one read and one write (to fresh memory) of each. f64 I/O = "
            "`(w.double() * s).to(w.dtype)` over the same tensors (context). "
            "The weight-I/O goal applies to models with >= 10M parameters."
            + (
                f" Working tree: uncommitted changes in {', '.join(doc['src_dirty'])} at the start "
                "(numbers are for the working tree, not HEAD)."
                if doc.get("src_dirty")
                else ""
            ),
            f"Goals: {summary}.",
            "",
            *notes,
        ]
    )


def run(models=DEFAULT_MODELS, rounds: int = 3, quick: bool = False, out=None) -> dict:
    quiet()
    import torch

    torch.set_num_threads(1)
    from models import chain

    import bnfold

    src_dirty, info = _src_dirty(), machine()  # at the start: the code the numbers belong to
    log("D. fold speed on real models: warm-up")
    model, x = chain(2)  # pay the import / first-call costs of export, fold and to_edge before any model
    ep = torch.export.export(model, x)
    bnfold.fold(ep)
    bnfold.fold(to_edge_program(ep)[0])
    rows = []
    for name in models:
        log(f"  {name} ...")
        rows.append(measure(name, rounds))
        gc.collect()
    doc = {
        "benchmark": "fold_real",
        "quick": quick,
        "machine": info,
        "src_dirty": src_dirty,
        "goals": GOALS,
        "large_weight_params": LARGE_WEIGHT_PARAMS,
        "rows": rows,
        "verdict": _verdict(rows),
        "load_end": load_now(),
    }
    folder = out_folder(out)
    suffix = "_quick" if quick else ""
    text = render(doc)
    doc["json"] = str(write_json("fold_real" + suffix, doc, folder))
    write_text("fold_real" + suffix, text, folder)
    print(text, flush=True)
    return doc


def profile(names, top: int = 30, out=None, ir: str = "default") -> str:
    """cProfile of one ``bnfold.fold`` per model on the default-IR program (``ir="edge"``: on the edge program) with
    GC off inside (so collection pauses are not charged to whichever function allocated), after plain wall times
    with GC on and off; top ``top`` by cumulative time and the top 15 by own time.  Written to
    ``fold_real_profile.txt`` (``fold_real_profile_edge.txt``)."""
    quiet()
    import torch

    torch.set_num_threads(1)
    import bnfold

    parts = []
    for name in names:
        b = build(name)
        ep = torch.export.export(b["model"], b["example"])
        t_export, _ = timed(lambda b=b: torch.export.export(b["model"], b["example"]))
        if ir == "edge":
            ep = to_edge_program(ep)[0]
        res = bnfold.fold(ep)  # warm
        written = written_tensors(ep, res.model)
        del res
        walls = []
        for gc_on in (True, False, True, False):
            gc.collect()
            if not gc_on:
                gc.disable()
            try:
                walls.append((gc_on, _timed(lambda ep=ep: bnfold.fold(ep))[0]))
            finally:
                gc.enable()
        gc.collect()
        gc.disable()
        try:
            pr = cProfile.Profile()
            pr.enable()
            bnfold.fold(ep)
            pr.disable()
        finally:
            gc.enable()
        s = io.StringIO()
        s.write(
            f"## {name}: bnfold.fold on the {ir}-IR program ({len(ep.graph.nodes)} nodes, "
            f"{batch_norm_nodes(ep)} batch_norm nodes, {b['parameters'] / 1e6:.2f}M parameters, fold writes "
            f"{len(written)} tensors / {sum(w.numel() * w.element_size() for w in written) / 2**20:.1f} MiB)\n"
        )
        s.write(f"torch.export.export once: {t_export:.3f} s\n")
        for gc_on, t in walls:
            s.write(f"  fold wall {t:.3f} s with GC {'on' if gc_on else 'off'}\n")
        st = pstats.Stats(pr, stream=s)
        st.sort_stats("cumulative").print_stats(top)
        st.sort_stats("tottime").print_stats(15)
        parts.append(s.getvalue())
        log(f"  profiled {name}")
        del ep, b
        gc.collect()
    info = machine()
    head = (
        f"bnfold {info.get('bnfold')}, git HEAD {info.get('git_head')}, torch {info.get('torch')}, executorch "
        f"{info.get('executorch')}; uncommitted changes under src/: {', '.join(_src_dirty()) or 'none'}\n\n"
    )
    text = head + "\n".join(parts)
    path = out_folder(out) / f"fold_real_profile{'_edge' if ir == 'edge' else ''}.txt"
    path.write_text(text)
    print(text, flush=True)
    log(f"  written {path}")
    return text


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--models",
        default=None,
        help=f"comma-separated, from {', '.join(DEFAULT_MODELS + EXTRA_MODELS)} (default: all but chain800)",
    )
    ap.add_argument("--rounds", type=int, default=3, help="round-robin rounds per model")
    ap.add_argument("--quick", action="store_true", help=f"smoke run: {', '.join(QUICK_MODELS)}, 1 round")
    ap.add_argument(
        "--profile",
        default=None,
        metavar="NAME[,NAME]",
        help="only cProfile the default-IR fold of these models (top 30 cumulative)",
    )
    ap.add_argument(
        "--profile-ir",
        choices=("default", "edge"),
        default="default",
        help="with --profile: profile the fold of the default-IR (ATen) or the edge program",
    )
    ap.add_argument(
        "--out", default=None, help="results folder (default benchmarks/results); files go to its fold_real/ subfolder"
    )
    args = ap.parse_args(argv)
    known = DEFAULT_MODELS + EXTRA_MODELS

    def names(spec):
        out = [m.strip() for m in spec.split(",") if m.strip()]
        bad = [m for m in out if m not in known and not (m.startswith("chain") and m[5:].isdigit())]
        if bad:
            ap.error(f"unknown model(s) {bad}; choose from {', '.join(known)}")
        return out

    if args.profile:
        profile(names(args.profile), out=args.out, ir=args.profile_ir)
        return
    models = names(args.models) if args.models else (QUICK_MODELS if args.quick else DEFAULT_MODELS)
    run(models, 1 if args.quick else args.rounds, args.quick, args.out)


if __name__ == "__main__":
    main()
