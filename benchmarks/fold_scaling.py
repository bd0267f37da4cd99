"""A (goals). The fold's scaling and its share of torch.export on part A's chain, against a baseline.

    .venv/bin/python benchmarks/fold_scaling.py [--sizes 200,800,1600] [--rounds 5] [--baseline DIR] [--out DIR]

Part A's ``Chain(N)`` (``models.chain``), exported once per N.  In ONE process, round robin (the order
reversed every other round, an untimed ``gc.collect()`` before each call, 1 torch thread):

* ``bnfold``          ``bnfold.fold(ep)`` (the input is kept: the graph is copied);
* ``bnfold inplace``  ``bnfold.fold(copy.deepcopy(ep), inplace=True)`` (the copy untimed);
* ``baseline``        with ``--baseline DIR``: ``fold(ep)`` of another bnfold, the package folder ``DIR``
                      imported under the name ``bnfold_baseline`` (e.g. ``git archive <commit> src/bnfold``
                      unpacked and renamed), so both versions meet the same machine at the same moments.

``torch.export.export`` is timed once per N (twice at 800, the goal's size).  The table gives each
call's least time over the rounds and the range; the goals (issue 43) are the reference lines:
``t(800) / t(200) <= 4.2`` and ``t(800) <= 5%`` of export, each from the least times.  Wall time and
the process's CPU time are both shown: on a shared machine a call that waits for a core shows it in
the wall time only.
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


def _clock(fn) -> tuple[float, float]:
    gc.collect()
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
        sys.path.insert(0, os.path.dirname(os.path.abspath(baseline)))
        calls["baseline"] = importlib.import_module(os.path.basename(os.path.abspath(baseline))).fold
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
    args = ap.parse_args()
    from common import load_now, quiet, write_text

    quiet()
    rows = measure([int(s) for s in args.sizes.split(",")], args.rounds, args.baseline)
    text = render(rows, str(load_now()))
    write_text("fold_scaling", text, args.out)
    print(text, flush=True)


if __name__ == "__main__":
    main()
