"""A (goals). The fold's scaling and its share of torch.export on part A's chain, against a baseline.

    .venv/bin/python benchmarks/fold_scaling.py [--sizes 200,800,1600] [--rounds 5] [--baseline DIR] [--out DIR]
    .venv/bin/python benchmarks/fold_scaling.py --fp16-range [--sizes 50,200] [--rounds 3] [--baseline DIR]

Part A's ``Chain(N)`` (``models.chain``), exported once per N.  In ONE process, round robin (the order
reversed every other round, an untimed ``gc.collect()`` before each call, 1 torch thread):

* ``bnfold``          ``bnfold.fold(ep)`` (the input is kept: the graph is copied);
* ``bnfold inplace``  ``bnfold.fold(copy.deepcopy(ep), inplace=True)`` (the copy untimed);
* ``baseline``        with ``--baseline DIR``: ``fold(ep)`` of another bnfold, the package folder ``DIR``
                      imported under the name ``bnfold_baseline`` (e.g. ``git archive <commit> src/bnfold``
                      unpacked and renamed), so both versions meet the same machine at the same moments.

``--flush-mib M``: after each collection, M MiB are written (untimed), so every call starts with none of its
program in the core's caches.  Without it, the collection (which walks every object) leaves a small program
cached and a large one not: part of what ``t(800) / t(200)`` reads above 4 is that, not the fold's work.

``torch.export.export`` is timed once per N (twice at 800, the goal's size).  The table gives each
call's least time over the rounds and the range; the goals (issue 43) are the reference lines:
``t(800) / t(200) <= 4.2`` and ``t(800) <= 5%`` of export, each from the least times.  Wall time and
the process's CPU time are both shown: on a shared machine a call that waits for a core shows it in
the wall time only.

``--fp16-range``: that the range rewrite stays linear too (issue 43).  ``models.hot_chain(N)``, part A's
chain with calibrated statistics and every second block's output past fp16's range over the margin
(N / 2 values to rewrite); round robin as above, ``bnfold.fold(ep)`` and ``bnfold.fold(ep,
fp16_range=2 batches)`` (calibration, rewrite, the float64 proof on the batches and fresh inputs); the
range part is the difference of the two least times; with ``--baseline DIR`` the baseline's two calls join the
round robin (its rows labelled ``baseline``).  Every size's calls share each round (the ratio's two sizes meet
the same load).  "values rewritten": the report's entries with a factor other than 1 (``N / 2`` meant).
Reference line: ``t(4N) / t(N) <= 4.2``.
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

RATIO_GOAL, SHARE_GOAL = 4.2, 0.05


#: ``--flush-mib``: a buffer written whole before each timed call (after the collection), or None
_FLUSH: list[bytearray] = []
_MIB = bytes(1 << 20)


def _clock(fn) -> tuple[float, float]:
    gc.collect()
    for buf in _FLUSH:  # every byte written, a MiB at a time: what the call reads next is no longer cached
        view, mib = memoryview(buf), 1 << 20
        for at in range(0, len(buf), mib):
            view[at : at + mib] = _MIB
    t, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t, time.process_time() - c


def measure(sizes: list[int], rounds: int, baseline: str | None) -> dict:
    import torch
    from models import chain

    import bnfold

    torch.set_num_threads(1)
    calls = {"bnfold": bnfold.fold}
    if baseline:
        calls["baseline"] = _baseline(baseline).fold
    model, x = chain(2)
    for fold in calls.values():  # imports and first-call set-up
        fold(torch.export.export(model, x))
    rows = {}
    for n in sizes:
        model, x = chain(n)
        times: dict[str, list] = {"export": []}
        for _ in range(2 if n == 800 else 1):
            ep = None

            def export():
                nonlocal ep
                ep = torch.export.export(model, x)

            times["export"].append(_clock(export))
        for fold in calls.values():
            fold(ep)
        names = [*calls, "bnfold_inplace"]
        for i in range(rounds):
            for name in names if i % 2 == 0 else reversed(names):
                if name == "bnfold_inplace":
                    consumed = copy.deepcopy(ep)
                    times.setdefault(name, []).append(_clock(lambda c=consumed: bnfold.fold(c, inplace=True)))
                    del consumed
                else:
                    times.setdefault(name, []).append(_clock(lambda f=calls[name]: f(ep)))
        rows[n] = times
        print(f"  N={n}: " + ", ".join(f"{k} {min(w for w, _ in v):.3f} s" for k, v in times.items()), flush=True)
    return rows


def measure_range(sizes: list[int], rounds: int, baseline: str | None = None) -> dict:
    import torch
    from models import hot_chain, structured_inputs

    import bnfold

    torch.set_num_threads(1)
    versions = {"": bnfold.fold}
    if baseline:
        versions["baseline "] = _baseline(baseline).fold
    calls, rescaled = {}, {}
    for n in sizes:
        model, x = hot_chain(n)
        ep = torch.export.export(model, x)
        batches = [(b,) for b in structured_inputs(tuple(x[0].shape), 2, seed=1)]
        for label, fold in versions.items():
            calls[n, f"{label}fold"] = lambda f=fold, ep=ep: f(ep)
            calls[n, f"{label}fp16_range"] = lambda f=fold, ep=ep, b=batches: f(ep, fp16_range=b)
            calls[n, f"{label}fold"]()  # the first calls' set-up, untimed
            rescaled[n, label] = sum(e.factor != 1.0 for e in calls[n, f"{label}fp16_range"]().report.rescaled)
    times: dict = {}
    for i in range(rounds):  # every size's calls in each round: a change of load meets both sizes alike
        for key in calls if i % 2 == 0 else reversed(calls):
            times.setdefault(key, []).append(_clock(calls[key]))
    rows = {}
    for n in sizes:
        rows[n] = ({k: v for (m, k), v in times.items() if m == n}, {k: v for (m, k), v in rescaled.items() if m == n})
        print(f"  N={n}: " + ", ".join(f"{k} {min(w for w, _ in v):.3f} s" for k, v in rows[n][0].items()), flush=True)
    return rows


def _baseline(folder: str):
    """The bnfold package ``folder`` imported under its folder's name (``--baseline``)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(folder)))
    return importlib.import_module(os.path.basename(os.path.abspath(folder)))


def render_range(rows: dict, load: str) -> str:
    from common import table

    labels = list(rows[min(rows)][1])

    def least(n: int, label: str) -> dict:
        t = {k: (min(w for w, _ in v), min(c for _, c in v)) for k, v in rows[n][0].items() if k.startswith(label)}
        t = {k.removeprefix(label): v for k, v in t.items() if k.removeprefix(label) in ("fold", "fp16_range")}
        t["range"] = tuple(a - b for a, b in zip(t["fp16_range"], t["fold"]))
        return t

    head = ["N blocks", "values rewritten", "fold s (cpu)", "fold + fp16_range s (cpu)", "range part s (cpu)"]
    body = []
    for n in sorted(rows):
        for label in labels:
            t = least(n, label)
            cells = [f"{t[k][0]:.3f} ({t[k][1]:.3f})" for k in ("fold", "fp16_range", "range")]
            body.append([f"{label}{n}", str(rows[n][1][label]), *cells])
    lines = [table(head, body), ""]
    goal = []
    for a, b in zip(sorted(rows), sorted(rows)[1:]):
        for label in labels:
            ta, tb = least(a, label), least(b, label)
            row = [f"{label}t({b})/t({a}) (x{b / a:g} the blocks)"]
            for k in ("fold", "fp16_range", "range"):
                w, c = tb[k][0] / ta[k][0], tb[k][1] / ta[k][1]
                row.append(f"{w:.2f} {'PASS' if w <= RATIO_GOAL * b / a / 4 else 'MISS'} (cpu {c:.2f})")
            goal.append(row)
    lines.append(table(["ratio (goal <= 4.2 for x4)", "fold", "fold + fp16_range", "range part"], goal, align="lrrr"))
    lines.append(f"\nload average {load}")
    return "\n".join(lines)


def render(rows: dict, load: str) -> str:
    from common import table

    sizes = sorted(rows)
    names = [k for k in rows[sizes[0]] if k != "export"]
    head = ["N blocks", "torch.export s (wall / cpu)"] + [f"{k} s (least, range; cpu)" for k in names]
    body = []
    for n in sizes:
        r = rows[n]
        ex = min(w for w, _ in r["export"]), min(c for _, c in r["export"])
        cells = [str(n), f"{ex[0]:.2f} / {ex[1]:.2f}"]
        for k in names:
            w = [a for a, _ in r[k]]
            c = min(b for _, b in r[k])
            cells.append(f"{min(w):.3f} ({min(w):.3f}-{max(w):.3f}; {c:.3f})")
        body.append(cells)
    lines = [table(head, body), ""]
    goal = [["goal", f"<= {RATIO_GOAL}", "", f"<= {SHARE_GOAL:.0%}", ""]]
    for k in names:
        row = [k, "", "", "", ""]
        if 200 in rows and 800 in rows:
            w = min(a for a, _ in rows[800][k]) / min(a for a, _ in rows[200][k])
            c = min(b for _, b in rows[800][k]) / min(b for _, b in rows[200][k])
            row[1], row[2] = f"{w:.2f} {'PASS' if w <= RATIO_GOAL else 'MISS'}", f"{c:.2f}"
        if 800 in rows:
            ex = min(a for a, _ in rows[800]["export"]), min(b for _, b in rows[800]["export"])
            w = min(a for a, _ in rows[800][k]) / ex[0]
            c = min(b for _, b in rows[800][k]) / ex[1]
            row[3], row[4] = f"{w:.1%} {'PASS' if w <= SHARE_GOAL else 'MISS'}", f"{c:.1%}"
        goal.append(row)
    lines.append(table(["call", "t(800)/t(200) wall", "cpu", "t(800) / export wall", "cpu"], goal, align="lrrrr"))
    lines.append(f"\nload average {load}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="200,800,1600")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline", default=None, help="a bnfold package folder to compare with (imported by its name)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--fp16-range", action="store_true", help="the range rewrite's scaling (sizes default 50,200)")
    ap.add_argument("--flush-mib", type=int, default=0, help="write this many MiB before each timed call (cold caches)")
    args = ap.parse_args()
    if args.flush_mib > 0:
        _FLUSH.append(bytearray(args.flush_mib << 20))
    from common import load_now, quiet, write_text

    quiet()
    if args.fp16_range:
        sizes = [int(s) for s in (args.sizes if args.sizes != ap.get_default("sizes") else "50,200").split(",")]
        text = render_range(measure_range(sizes, args.rounds, args.baseline), str(load_now()))
        write_text("fold_scaling_fp16_range", text, args.out)
        print(text, flush=True)
        return
    rows = measure([int(s) for s in args.sizes.split(",")], args.rounds, args.baseline)
    text = render(rows, str(load_now()))
    write_text("fold_scaling", text, args.out)
    print(text, flush=True)


if __name__ == "__main__":
    main()
