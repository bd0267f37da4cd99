"""Portable-runtime latency of an EfficientNet-style block, unfolded vs folded ``.pte``.

Both programs are lowered portable-only (``to_edge(...).to_executorch()``, no
delegate), loaded into the same process with ``executorch.runtime`` and run in
alternation, so drift in machine load hits both alike.  Prints the median and
the 10th / 90th percentiles of the per-call wall time, and the median CPU time
of the calling thread (the portable kernels run on it), which other processes
on a busy machine disturb far less than the wall time.

    .venv/bin/python benchmarks/pte_latency.py [--channels 32] [--size 28] [--repeats 100]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "tests"), os.path.join(HERE, "..", "tests", "executorch")]

from common import batch_norm_nodes  # noqa: E402
from et_models import prepared  # noqa: E402  (tests/executorch/et_models.py)

from bnfold_testutil import reference  # noqa: E402  (tests/bnfold_testutil.py)
from zoo import MBConv  # noqa: E402  (tests/zoo.py: the model zoo shared with the tests)


def lower(ep, fold: bool):
    from executorch.exir import to_edge

    from bnfold.executorch import FoldBatchNormPass

    edge = to_edge(ep)
    report = None
    if fold:
        pass_ = FoldBatchNormPass()
        edge = edge.transform([pass_])
        report = pass_.report
    norms = batch_norm_nodes(edge.exported_program())
    return edge.to_executorch().buffer, norms, report


def percentile(values, q):
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--channels", type=int, default=32)
    ap.add_argument("--expand", type=int, default=4)
    ap.add_argument("--size", type=int, default=28, help="input height and width")
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args(argv)

    from executorch.runtime import Runtime

    torch.manual_seed(0)
    model = prepared(MBConv(args.channels, args.expand))
    x = torch.randn(1, args.channels, args.size, args.size)
    ep = torch.export.export(model, (x,))
    ref = reference(model, x)

    runtime = Runtime.get()
    variants = {}
    for name, fold in (("unfolded", False), ("folded", True)):
        buffer, norms, report = lower(ep, fold)
        method = runtime.load_program(buffer).load_method("forward")
        out = method.execute([x])[0]
        err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
        variants[name] = {
            "method": method,
            "bytes": len(buffer),
            "norms": norms,
            "err": err,
            "times": [],
            "cpu": [],
            "report": report,
        }

    for _ in range(args.warmup):
        for v in variants.values():
            v["method"].execute([x])
    for _ in range(args.repeats):
        for v in variants.values():
            c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
            v["method"].execute([x])
            v["times"].append((time.perf_counter_ns() - t0) / 1e6)
            v["cpu"].append((time.thread_time_ns() - c0) / 1e6)

    print(
        f"EfficientNet-style block: MBConv(c={args.channels}, expand={args.expand}), "
        f"input 1x{args.channels}x{args.size}x{args.size}, portable kernels, "
        f"{args.repeats} runs each (alternating, {args.warmup} warm-up)"
    )
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, cpus {os.cpu_count()}")
    header = (
        f"{'variant':<10} {'batch_norm ops':>14} {'.pte bytes':>11} {'median ms':>10} {'min ms':>8} "
        f"{'p10 ms':>8} {'p90 ms':>8} {'cpu median ms':>14} {'rel. err':>9}"
    )
    print(header)
    print("-" * len(header))
    for name, v in variants.items():
        t = v["times"]
        print(
            f"{name:<10} {v['norms']:>14} {v['bytes']:>11} {statistics.median(t):>10.3f} {min(t):>8.3f} "
            f"{percentile(t, 0.1):>8.3f} {percentile(t, 0.9):>8.3f} {statistics.median(v['cpu']):>14.3f} "
            f"{v['err']:>9.1e}"
        )
    base, folded = (statistics.median(variants[k]["times"]) for k in ("unfolded", "folded"))
    cpu_base, cpu_folded = (statistics.median(variants[k]["cpu"]) for k in ("unfolded", "folded"))
    print(
        f"speed-up, unfolded / folded: wall median {base / folded:.3f}x, "
        f"wall min {min(variants['unfolded']['times']) / min(variants['folded']['times']):.3f}x, "
        f"thread CPU median {cpu_base / cpu_folded:.3f}x"
    )
    print(variants["folded"]["report"].table())


if __name__ == "__main__":
    main()
