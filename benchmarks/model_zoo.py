"""The library zoo (`make zoo`): torchvision's and timm's own model classes folded in the default, decomposed and
edge IR and in ONNX, each checked against its own deploy form (``tests/library_zoo.py`` says what passes).

Prints one table row per model and IR: folds, merges, normalizations left (BatchNorms / others, and in brackets the
BatchNorms / other normalizations the hand-made deploy form keeps), the folded program's conv / add / BatchNorm
counts (``= own`` when they equal the model's own merge, folded), the error against float64 over the output
magnitude, the CLI's ``check`` and ``audit`` exit statuses, and why a row fails.  Writes ``model_zoo.{json,md}``
under ``--out`` (default benchmarks/results).  Each model runs in its own process (``--jobs`` at a time).  Exit
status 1 when a row fails.

    PYTHONPATH=src .venv/bin/python benchmarks/model_zoo.py [--models tv:resnet18,timm:repvgg_a0] [--irs default,onnx]
        [--quick] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import re
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests"), str(HERE.parent / "tests" / "reparam")]
from common import RESULTS, machine, quiet, table, write_json, write_text  # noqa: E402


def _one(args) -> list[dict]:
    name, irs, folder = args
    quiet()
    import torch

    torch.set_num_threads(1)
    from library_zoo import check_model

    return [r.to_dict() for r in check_model(name, Path(folder) / name.replace(":", "_"), irs)]


def _fmt_err(r) -> str:
    return "-" if r["err"] is None else f"{r['err']:.1e}"


def _merge_cell(r) -> str:
    c = r["counts"]
    if not c:
        return "-"
    text = f"{c['conv']}/{c['add']}/{c['bn']}"
    if r["own"] is None:
        return text
    return text + (" = own" if r["own"] == c else f" (own {r['own']['conv']}/{r['own']['add']}/{r['own']['bn']})")


def _why(failures: list[str]) -> str:
    """The failures of a row, without the temporary folder the files were in."""
    return re.sub(r"\S*bnfold_zoo_[^/\s]+/[^/\s]+/", "", "; ".join(failures)).replace("|", "/")


def render(rows: list[dict], seconds: float) -> str:
    head = ["model", "IR", "folded", "merged", "left BN/other (keeps BN/other)", "conv/add/BN", "max err"]
    head += ["check", "audit", "ok", "why not"]
    body = [
        [
            r["model"],
            r["ir"],
            r["folded"],
            r["merged"],
            f"{r['left_bn']}/{r['left_other']} ({r['keeps']}/{r.get('keeps_other', '?')})",  # ?: a row from before
            _merge_cell(r),
            _fmt_err(r),
            r["check"],
            r["audit"],
            "yes" if r["ok"] else "**no**",
            _why(r["failures"]),
        ]
        for r in rows
    ]
    failed = sorted({r["model"] for r in rows if not r["ok"]})
    models = len({r["model"] for r in rows})
    return "\n".join(
        [
            table(head, body, align="llrrllllll" + "l"),
            "",
            f"{models} models, {len(rows)} rows, {sum(r['ok'] for r in rows)} pass"
            + ("" if seconds != seconds else f"; {seconds:.0f} s wall")
            + ". "
            + (f"Failing models: {', '.join(failed)}." if failed else "All pass."),
        ]
    )


def main(argv=None) -> int:
    from library_models import MODELS, QUICK, SLOW, available
    from library_zoo import IRS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=None, help="comma-separated names (default: all but the slow ones)")
    ap.add_argument("--all", action="store_true", help=f"also the slow ones: {', '.join(SLOW)}")
    ap.add_argument("--quick", action="store_true", help="the subset `make test` runs")
    ap.add_argument("--irs", default=",".join(IRS))
    ap.add_argument("--jobs", type=int, default=1, help="models checked at once, each in its own process")
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    ap.add_argument(
        "--from-rows",
        default=None,
        metavar="FILE[,FILE]",
        help="only print the table of runs' model_zoo_rows.jsonl (a later file's row of a model and IR replaces one "
        "from an earlier file)",
    )
    args = ap.parse_args(argv)
    folder = Path(args.out) if args.out else RESULTS
    if args.from_rows:
        merged: dict = {}
        for path in args.from_rows.split(","):
            for line in Path(path).read_text().splitlines():
                if line.strip():
                    r = json.loads(line)
                    merged[(r["model"], r["ir"])] = r
        rows = list(merged.values())
        from library_zoo import fewer_folds

        for model in {r["model"]: None for r in rows}:  # rows written before the cross-IR check existed
            mine = [r for r in rows if r["model"] == model]
            for ir, why in fewer_folds({r["ir"]: r["folded"] for r in mine if r["counts"]}).items():
                r = next(r for r in mine if r["ir"] == ir)
                if why not in r["failures"]:
                    r["failures"].append(why)
                    r["ok"] = False
        print(render(rows, float("nan")))
        return 0
    why = available()
    if why:
        print(f"model_zoo: {why}", file=sys.stderr)
        return 2
    if args.models:
        names = [m.strip() for m in args.models.split(",") if m.strip()]
        unknown = [m for m in names if m not in MODELS]
        if unknown:
            ap.error(f"unknown model(s) {unknown}; choose from {', '.join(MODELS)}")
    elif args.quick:
        names = list(QUICK)
    else:
        names = [m for m in MODELS if args.all or m not in SLOW]
    irs = tuple(i for i in args.irs.split(",") if i)
    quiet()
    info = machine()
    t0 = time.perf_counter()
    rows: list[dict] = []
    folder.mkdir(parents=True, exist_ok=True)
    stream = folder / ("model_zoo_rows" + ("_quick" if args.quick else "") + ".jsonl")
    stream.write_text("")  # each model's rows as they come (a stopped run still has them)
    with tempfile.TemporaryDirectory(prefix="bnfold_zoo_") as files:
        work = [(n, QUICK[n] if args.quick else irs, files) for n in names]
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(args.jobs, maxtasksperchild=1) as pool:
            for model_rows in pool.imap(_one, work):
                for r in model_rows:
                    print(
                        f"{r['model']:<34} {r['ir']:<10} {'ok ' if r['ok'] else 'NO '} {r['seconds']:6.1f}s "
                        + "; ".join(r["failures"]),
                        file=sys.stderr,
                        flush=True,
                    )
                rows += model_rows
                with stream.open("a") as f:
                    f.writelines(json.dumps(r) + "\n" for r in model_rows)
    seconds = time.perf_counter() - t0
    text = render(rows, seconds)
    print(text)
    doc = {"benchmark": "model_zoo", "machine": info, "models": names, "irs": irs, "seconds": seconds, "rows": rows}
    stem = "model_zoo" + ("_quick" if args.quick else "")
    write_json(stem, doc, folder)
    write_text(stem, text, folder)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
