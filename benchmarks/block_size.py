"""L (bounded memory). What a block of ``fold_math.BLOCK_ELEMENTS`` costs, by its size.

    .venv/bin/python benchmarks/block_size.py [--rounds 5] [--sizes 32736,32767,32768,262144,1048576] [--baseline DIR]

The blocks of ``fold_math`` (a weight's product and its checks, the float64 route's checks, ``scale_pow2``'s
slices) and of ``engine.range_planner.span`` bound what a fold or a range rewrite holds beside a weight. torch
runs an elementwise op or a reduction on its intra-op thread pool from its grain (``at::internal::GRAIN_SIZE``,
32768 elements) up; on a busy machine each hand-off waits for a descheduled thread.

* per op: the ops a block runs, on one block of ``n`` float32 elements (the product's ``mul`` with a broadcast
  scale, ``aminmax``, ``abs().amin()``, ``count_nonzero``; the float64 route's five ops; a ``scale_pow2`` slice;
  ``span``; and a reduction over a dim, for reference), each repeated to about 1M elements a measure;
* per call: ``scale_weight`` (checked, deferred; and the float64 route of a scale inexact in float32),
  ``scale_pow2`` and ``span`` of a 1024 x 4096 float32 weight in blocks of at most ``n`` elements
  (``BLOCK_ELEMENTS`` set to ``n + 1``): 4096-element rows, so a block of 32768 is eight rows, exactly the grain;
* by shape: the same calls on 2048 x 4096 and 64 x 131072 float32 weights (8M elements each; a row of the second
  is longer than a block), with ``--baseline DIR`` against another bnfold package folder imported under its
  folder's name (as ``fold_scaling.py --baseline``).

Sizes round robin in ONE process at torch's default thread count (as bnfold runs): the least wall and CPU time
(``process_time``: every thread of the process, a thread pool's spinning too) over the rounds, and the load.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import load_now, table  # noqa: E402
from fold_scaling import _baseline  # noqa: E402

TOTAL = 1 << 20  # elements a per-op measure covers (repeats of one block)


def _clock(fn, reps: int) -> tuple[float, float]:
    t, c = time.perf_counter(), time.process_time()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps, (time.process_time() - c) / reps


def per_op(n: int) -> dict:
    import torch

    from bnfold import fold_math as fm
    from bnfold.engine.range_planner import _span

    g = torch.Generator().manual_seed(n)
    w = torch.randn(n, generator=g)
    s = torch.tensor([0.75]).expand(n)
    s64 = torch.tensor([0.75], dtype=torch.float64).expand(n)
    out, mag = torch.empty(n), torch.empty(n)
    v64, m64 = torch.empty(n, dtype=torch.float64), torch.empty(n, dtype=torch.float64)

    def cast_route():  # fold_math._check_cast_blocks' block
        torch.mul(w, s64, out=v64)
        out.copy_(v64)
        bool(torch.isfinite(out).all())
        float(torch.abs(v64, out=m64).max())
        int(((out == 0) & (v64 != 0)).sum())

    ops = {
        "mul(out=)": lambda: torch.mul(w, s, out=out),
        "aminmax": lambda: torch.aminmax(w),
        "abs(out=).amin": lambda: torch.abs(w, out=mag).amin(),
        "count_nonzero": lambda: torch.count_nonzero(w),
        "float64 route": cast_route,
        "scale_pow2 slice": lambda: fm._scale_pow2(w, 3, torch.float32, "w"),
        "span": lambda: _span(w),
    }
    if n % 32 == 0:
        cols = w.view(n // 32, 32)
        ops["amin(dim=0)"] = lambda: cols.amin(dim=0)
    return ops


def calls(weight, fm, rp) -> dict:
    """The calls that read ``weight`` in blocks, of the bnfold modules ``fm`` (fold_math) and ``rp`` (range_planner)."""
    import torch

    scales = torch.full((weight.shape[0], 1), 0.75, dtype=torch.float64)
    odd = torch.full((weight.shape[0], 1), 0.1, dtype=torch.float64)  # not exact in float32: checked as float64
    return {
        "scale_weight": lambda: fm.scale_weight(weight, scales, torch.float32, "w"),
        "scale_weight deferred": lambda: fm.scale_weight(weight, scales, torch.float32, "w", True),
        "float64 route": lambda: fm._check_cast_blocks(weight, odd, torch.float32, "w"),
        "scale_pow2": lambda: fm.scale_pow2(weight, 3, torch.float32, "w"),
        "span": lambda: rp.span(weight),
    }


def per_call(n: int, weight) -> dict:
    from bnfold import fold_math as fm
    from bnfold.engine import range_planner as rp

    def patched(fn):
        def run():
            saved = fm.BLOCK_ELEMENTS, fm._POW2_CHUNK, rp.BLOCK_ELEMENTS
            fm.BLOCK_ELEMENTS = rp.BLOCK_ELEMENTS = n + 1  # blocks of fewer than n + 1 elements
            fm._POW2_CHUNK = n
            try:
                fn()
            finally:
                fm.BLOCK_ELEMENTS, fm._POW2_CHUNK, rp.BLOCK_ELEMENTS = saved

        return run

    return {name: patched(fn) for name, fn in calls(weight, fm, rp).items()}


def by_shape(baseline: str | None) -> dict:
    """``{(code, shape): calls}`` for this code and the baseline's."""
    import importlib

    import torch

    import bnfold

    packages = {"this": bnfold}
    if baseline:
        packages["baseline"] = _baseline(baseline)
    out = {}
    for shape in ((2048, 4096), (64, 131072)):
        weight = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
        for code, pkg in packages.items():
            fm = importlib.import_module(f"{pkg.__name__}.fold_math")
            rp = importlib.import_module(f"{pkg.__name__}.engine.range_planner")
            out[(code, "x".join(map(str, shape)))] = calls(weight, fm, rp)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", default="32736,32767,32768,262144,1048576")
    ap.add_argument("--baseline", help="another bnfold package folder, for the by-shape table")
    args = ap.parse_args()
    import torch

    sizes = [int(x) for x in args.sizes.split(",")]
    weight = torch.randn(1024, 4096, generator=torch.Generator().manual_seed(0))
    ops = {n: per_op(n) for n in sizes}
    calls = {n: per_call(n, weight) for n in sizes}
    shapes = by_shape(args.baseline)
    best: dict = {}
    load = [load_now()]
    for _ in range(args.rounds):
        for key, fns in shapes.items():
            for name, fn in fns.items():
                gc.collect()
                wall, cpu = _clock(fn, 1)
                k = ("shape", name, key)
                best[k] = tuple(min(a, b) for a, b in zip(best.get(k, (wall, cpu)), (wall, cpu)))
        for n in sizes:  # interleaved: every size each round
            for name, fn in ops[n].items():
                fn()
                wall, cpu = _clock(fn, max(1, TOTAL // n))
                key = ("op", name, n)
                best[key] = tuple(min(a, b) for a, b in zip(best.get(key, (wall, cpu)), (wall, cpu)))
            for name, fn in calls[n].items():
                gc.collect()
                wall, cpu = _clock(fn, 1)
                key = ("call", name, n)
                best[key] = tuple(min(a, b) for a, b in zip(best.get(key, (wall, cpu)), (wall, cpu)))
    load.append(load_now())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load {load[0]} -> {load[-1]}")
    print(f"least of {args.rounds} rounds, wall / CPU")
    names = list(ops[sizes[0]])
    rows = [
        [name]
        + [
            f"{best[('op', name, n)][0] * 1e6:.1f} / {best[('op', name, n)][1] * 1e6:.1f}"
            if ("op", name, n) in best
            else "-"
            for n in sizes
        ]
        for name in names
    ]
    print("\none block of n float32 elements, us\n")
    print(table(["op"] + [f"n={n}" for n in sizes], rows))
    rows = [
        [name] + [f"{best[('call', name, n)][0] * 1e3:.1f} / {best[('call', name, n)][1] * 1e3:.1f}" for n in sizes]
        for name in calls[sizes[0]]
    ]
    print("\na 1024x4096 float32 weight in blocks of at most n elements, ms per call\n")
    print(table(["call"] + [f"n={n}" for n in sizes], rows))
    print("\n8M-element float32 weights, ms per call\n")
    rows = [
        [name] + [f"{best[('shape', name, k)][0] * 1e3:.1f} / {best[('shape', name, k)][1] * 1e3:.1f}" for k in shapes]
        for name in calls[sizes[0]]
    ]
    print(table(["call"] + [f"{code} {shape}" for code, shape in shapes], rows))


if __name__ == "__main__":
    main()
