"""Structural re-parameterization on the graph (issue 21): bnfold's merge against the model's own.

The models are written in ``reparam_models.py`` (timm is not a dependency): a MobileOne-s0-, a
RepVGG-A0-, a RepViT-M0.9- and a GhostNetV3-0.5-shaped network, random weights, BN statistics from
a few train-mode batches, each exported WITHOUT calling its own ``reparameterize()``.  Three
programs per model:

* ``today``  bnfold without the merge rule (every branch's BN folded, identity BNs, convs, adds left);
* ``bnfold`` bnfold as it is (branches merged on the graph);
* ``own``    the model's own ``reparameterize()`` (plain torch), then bnfold.

Printed: node counts (call_function nodes, BN, conv, add) of the default IR, the error of each
program against the unmerged model in float64 (``rel.err``: max |difference| / max |reference|),
eager latency and XNNPACK (``to_edge_transform_and_lower`` + ``executorch.runtime``) latency, each
timed in alternation (today / bnfold / own, the order reversed every other round) on one thread;
ratios are medians of the per-round ratios against ``own``.  Under each model: that its own merge
is exact (the merged model against the unmerged one, both in float64).  A benchmark prints a
table; it asserts nothing.

    PYTHONPATH=src .venv/bin/python benchmarks/reparam.py [--models mobileone_s0,ghostnetv3_050] [--rounds 30]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import paired_ratio, quiet  # noqa: E402
from reparam_models import MODELS, calibrated  # noqa: E402

# ------------------------------------------------------------------------------------------ measure


def counts(ep) -> dict:
    from bnfold.torch_export.ops import op_name

    names = [op_name(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    return {
        "nodes": len(names),
        "bn": sum("batch_norm" in n for n in names),
        "conv": sum(n.startswith("conv") for n in names),
        "add": sum(n in ("add", "add_") for n in names),  # `out += branch(x)` is add_ in the default IR
    }


def fold_without_merge(ep):
    import bnfold
    from bnfold.engine import driver
    from bnfold.engine.reparam import MERGE

    saved = driver.RULES
    driver.RULES = tuple(r for r in saved if r is not MERGE)
    try:
        return bnfold.fold(ep)
    finally:
        driver.RULES = saved


def xnnpack(ep):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    buffer = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer
    program = Runtime.get().load_program(buffer)
    _KEEP.append((buffer, program))  # a method must not outlive its program and buffer
    return program.load_method("forward"), len(buffer)


_KEEP: list = []


def interleaved(calls: dict, rounds: int, warmup: int = 10) -> dict:
    """Each call once per round, the order reversed every other round (what runs first in a round
    meets the cache the previous one left); ``warmup`` rounds first (XNNPACK packs weights on its
    first runs)."""
    for _ in range(warmup):
        for fn in calls.values():
            fn()
    times = {k: [] for k in calls}
    keys = list(calls)
    for r in range(rounds):
        for k in keys if r % 2 == 0 else keys[::-1]:
            t = time.perf_counter()
            calls[k]()
            times[k].append(time.perf_counter() - t)
    return times


def bench(name: str, size: int, rounds: int, runtimes) -> dict:
    import bnfold

    model = calibrated(MODELS[name], size)
    x = torch.randn(1, 3, size, size)
    ep = torch.export.export(model, (x,))
    own_model = copy.deepcopy(model)
    own_model.reparameterize()
    programs = {
        "today": fold_without_merge(ep).model,
        "bnfold": None,
        "own": bnfold.fold(torch.export.export(own_model, (x,))).model,
    }
    t = time.perf_counter()
    result = bnfold.fold(ep)
    fold_s = time.perf_counter() - t
    programs["bnfold"] = result.model
    with torch.no_grad():
        model64 = copy.deepcopy(model).double()
        ref = model64(x.double())
        model64.reparameterize()  # its own merge, exact in float64?
        own_err = ((model64(x.double()) - ref).abs().max() / ref.abs().max()).item()
    row = {"model": name, "fold_s": fold_s, "merged": len(result.report.merged), "counts": {}, "err": {}}
    row["own_err64"] = own_err
    row["counts"]["exported"] = counts(ep)
    mods = {k: p.module() for k, p in programs.items()}
    with torch.no_grad():
        for k, m in mods.items():
            row["counts"][k] = counts(programs[k])
            row["err"][k] = ((m(x).double() - ref).abs().max() / ref.abs().max()).item()
        if "eager" in runtimes:
            times = interleaved({k: (lambda m=m: m(x)) for k, m in mods.items()}, rounds)
            row["eager_ms"] = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            row["eager_ratio"] = {k: paired_ratio(times[k], times["own"]) for k in times}
    if "xnnpack" in runtimes:
        methods, sizes = {}, {}
        for k, p in programs.items():
            methods[k], sizes[k] = xnnpack(p)
        times = interleaved({k: (lambda m=m: m.execute([x])) for k, m in methods.items()}, rounds)
        row["xnnpack_ms"] = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        row["xnnpack_ratio"] = {k: paired_ratio(times[k], times["own"]) for k in times}
        row["pte_mb"] = {k: v / 2**20 for k, v in sizes.items()}
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--runtimes", default="eager,xnnpack")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    quiet()
    torch.set_num_threads(args.threads)
    runtimes = set(args.runtimes.split(","))
    rows = [bench(m, args.size, args.rounds, runtimes) for m in args.models.split(",")]
    print(
        f"input 1x3x{args.size}x{args.size}, {args.threads} thread(s), {args.rounds} interleaved rounds; "
        f"torch {torch.__version__}"
    )
    head = f"{'model':<14} {'program':<8} {'nodes':>6} {'BN':>4} {'conv':>5} {'add':>4} {'rel.err':>8}"
    head += "".join(f" {r + ' ms':>11} {r + '/own':>11}" for r in ("eager", "xnnpack") if r in runtimes)
    head += f" {'.pte MB':>8}" if "xnnpack" in runtimes else ""
    print(head)
    print("-" * len(head))
    for row in rows:
        c = row["counts"]["exported"]
        print(f"{row['model']:<14} {'exported':<8} {c['nodes']:>6} {c['bn']:>4} {c['conv']:>5} {c['add']:>4}")
        for k in ("today", "bnfold", "own"):
            c = row["counts"][k]
            line = f"{'':<14} {k:<8} {c['nodes']:>6} {c['bn']:>4} {c['conv']:>5} {c['add']:>4} {row['err'][k]:>8.1e}"
            for r in ("eager", "xnnpack"):
                if r in runtimes:
                    line += f" {row[r + '_ms'][k]:>11.3f} {row[r + '_ratio'][k]:>10.3f}x"
            if "xnnpack" in runtimes:
                line += f" {row['pte_mb'][k]:>8.2f}"
            print(line)
        print(f"{'':<14} bnfold merged {row['merged']} sums in {row['fold_s']:.2f} s")
        print(f"{'':<14} own reparameterize() vs the unmerged model, float64: rel.err {row['own_err64']:.1e}")


if __name__ == "__main__":
    main()
