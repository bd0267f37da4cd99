"""B. Inference speed: unfolded vs folded vs no-BatchNorm ideal, in torch eager, the ExecuTorch
portable runtime and ExecuTorch + XNNPACK.

    .venv/bin/python benchmarks/inference_speed.py [--archs efficientnet,resnet,audio] [--quick]
        [--runtimes eager,portable,xnnpack] [--rounds 30] [--portable-rounds 15]

Per architecture (see ``models.py``; BatchNorm statistics calibrated in train
mode on structured random inputs, then eval):

* ``unfolded``  ``torch.export`` of the calibrated model;
* ``folded``    ``bnfold.fold`` of that program;
* ``ideal``     the same network with every BatchNorm replaced by ``nn.Identity``
                (same conv / linear weights; bias-free convs stay bias-free), exported
                the same way: the cost a perfect fold reaches;
* ``ideal+bias``  a control: the BatchNorm-free network where every conv the fold gave a
                bias has one, loaded with the folded tensors and exported directly.  It is
                what the folded program should be; folded vs ideal+bias isolates anything
                the fold adds beyond the bias, ideal+bias vs ideal is the price of the bias.

Runtimes (1 thread everywhere: ``torch.set_num_threads(1)``, and ExecuTorch's
threadpool reset to 1 thread):

* ``eager``     ``ExportedProgram.module()`` of each program (the same call path for all three);
* ``portable``  ``to_edge(ep).to_executorch()`` (no delegate), run with ``executorch.runtime``;
* ``xnnpack``   ``to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()``.

Timing: the three variants are interleaved, one sample each per round, and
the order rotates every round (ABC, BCA, CAB, ...) so drift and position
effects hit all alike; a sample is ``k`` back-to-back calls (``k`` chosen so
a sample lasts about 20 ms).  Reported: median ms per call, speedup
``unfolded / folded`` and ``folded / ideal``, each the median of the
per-round ratios.  Target for ``folded / ideal``: <= 1.02.  Nothing asserts.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (
    batch_norm_nodes,
    fmt_x,
    load_now,
    log,
    machine,
    median,
    paired_ratio,
    percentile,
    quiet,
    table,  # noqa: E402
    write_json,
    write_text,
)

VARIANTS = ("unfolded", "folded", "ideal", "ideal_bias")
RUNTIMES = ("eager", "portable", "xnnpack")
SAMPLE_S = 0.02


def _rel_err(out, ref) -> float:
    out = out[0] if isinstance(out, (list, tuple)) else out
    ref = ref[0] if isinstance(ref, (list, tuple)) else ref
    return float((out.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-30))


def _calls_per_sample(fn, target_s: float = SAMPLE_S) -> tuple[int, float]:
    fn()  # warm
    t = time.perf_counter()
    fn()
    one = time.perf_counter() - t
    return max(1, min(1000, math.ceil(target_s / max(one, 1e-6)))), one


def interleaved(fns: dict, rounds: int, k: int) -> dict[str, list[float]]:
    """``rounds`` rounds; in each, every fn runs ``k`` times back to back (one sample, seconds per call);
    the order rotates by one every round."""
    names = list(fns)
    times = {n: [] for n in names}
    gc.collect()
    gc.disable()  # no collection lands inside a sample (a fold's garbage is not the runtime's cost)
    try:
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for n in order:
                fn = fns[n]
                t = time.perf_counter()
                for _ in range(k):
                    fn()
                times[n].append((time.perf_counter() - t) / k)
            if r % 4 == 3:
                gc.enable()
                gc.collect()
                gc.disable()
    finally:
        gc.enable()
    return times


def _summary(times: dict[str, list[float]]) -> dict:
    out = {"median_ms": {}, "p10_ms": {}, "p90_ms": {}}
    for v, ts in times.items():
        out["median_ms"][v] = 1e3 * median(ts)
        out["p10_ms"][v] = 1e3 * percentile(ts, 0.1)
        out["p90_ms"][v] = 1e3 * percentile(ts, 0.9)
    out["speedup"] = paired_ratio(times["unfolded"], times["folded"])
    out["folded_over_ideal"] = paired_ratio(times["folded"], times["ideal"])
    out["unfolded_over_ideal"] = paired_ratio(times["unfolded"], times["ideal"])
    out["folded_over_ideal_bias"] = paired_ratio(times["folded"], times["ideal_bias"])
    out["ideal_bias_over_ideal"] = paired_ratio(times["ideal_bias"], times["ideal"])
    return out


def _lower_portable(ep):
    from executorch.exir import to_edge

    edge = to_edge(ep)
    bn = batch_norm_nodes(edge.exported_program())
    return edge.to_executorch().buffer, bn


def lower_xnnpack(ep):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
    gm = edge.exported_program().graph_module
    delegated = sum(
        1 for n in gm.graph.nodes if n.op == "call_function" and "executorch_call_delegate" in str(n.target)
    )
    left = [
        getattr(n.target, "__name__", str(n.target))
        for n in gm.graph.nodes
        if n.op == "call_function"
        and "executorch_call_delegate" not in str(n.target)
        and "getitem" not in str(n.target)
    ]
    return edge.to_executorch().buffer, {
        "delegate_calls": delegated,
        "ops_outside_delegate": len(left),
        "outside": sorted(set(left)),
        "batch_norm_outside": batch_norm_nodes(edge.exported_program()),
    }


def bench_arch(arch: str, quick: bool, runtimes, rounds: int, portable_rounds: int, et_archs=None) -> dict:
    import torch
    from models import DESCRIPTIONS, QUICK_SHAPES, bn_stats_summary, build, ideal_with_bias

    import bnfold

    t0 = time.perf_counter()
    b = build(arch, QUICK_SHAPES[arch] if quick else None, calib_batches=2 if quick else 8)
    x = b["example"]
    ep = torch.export.export(b["model"], x)
    fold = bnfold.fold(ep)
    ideal_bias = ideal_with_bias(arch, dict(fold.model.state_dict))
    eps = {
        "unfolded": ep,
        "folded": fold.model,
        "ideal": torch.export.export(b["ideal"], x),
        "ideal_bias": torch.export.export(ideal_bias, x),
    }
    with torch.no_grad():
        ref = eps["unfolded"].module()(*x)
    res = {
        "arch": arch,
        "description": DESCRIPTIONS[arch],
        "input_shape": list(b["shape"]),
        "batchnorms": b["batchnorms"],
        "parameters": b["parameters"],
        "bn_stats": bn_stats_summary(b["model"]),
        "folded": len(fold.report.folded),
        "skipped": [s.__dict__ for s in fold.report.skipped],
        "batch_norm_nodes": {v: batch_norm_nodes(e) for v, e in eps.items()},
        "runtimes": {},
    }
    log(
        f"  {arch}: input {tuple(b['shape'])}, {b['batchnorms']} BatchNorms, {len(fold.report.folded)} folded, "
        f"{len(fold.report.skipped)} skipped"
    )

    if "eager" in runtimes:
        mods = {v: e.module() for v, e in eps.items()}
        calls = {v: (lambda m=m: m(*x)) for v, m in mods.items()}
        with torch.no_grad():
            k, one = _calls_per_sample(calls["unfolded"])
            for fn in calls.values():
                fn()
            times = interleaved(calls, rounds, k)
            errs = {v: _rel_err(m(*x), ref) for v, m in mods.items()}
        res["runtimes"]["eager"] = {
            **_summary(times),
            "rounds": rounds,
            "calls_per_sample": k,
            "times_s": times,
            "rel_err_vs_unfolded": errs,
        }
        log(f"    eager    {_line(res['runtimes']['eager'])}")

    from executorch.runtime import Runtime

    rt = Runtime.get()
    for name, lower, n_rounds in (("portable", _lower_portable, portable_rounds), ("xnnpack", lower_xnnpack, rounds)):
        if name not in runtimes or (et_archs is not None and arch not in et_archs):
            continue
        try:
            methods, info, lower_s, sizes = {}, {}, {}, {}
            keep = []  # the runtime reads the .pte bytes in place: buffers and programs must outlive the methods
            for v, e in eps.items():
                tl = time.perf_counter()
                buf, info[v] = lower(e)
                lower_s[v] = time.perf_counter() - tl
                sizes[v] = len(buf)
                program = rt.load_program(buf)
                keep += [buf, program]
                methods[v] = program.load_method("forward")
            calls = {v: (lambda m=m: m.execute(list(x))) for v, m in methods.items()}
            k, one = _calls_per_sample(calls["unfolded"])
            for fn in calls.values():
                fn()
            times = interleaved(calls, n_rounds, k)
            errs = {v: _rel_err(m.execute(list(x)), ref) for v, m in methods.items()}
            res["runtimes"][name] = {
                **_summary(times),
                "rounds": n_rounds,
                "calls_per_sample": k,
                "times_s": times,
                "rel_err_vs_unfolded": errs,
                "pte_bytes": sizes,
                "lower_s": lower_s,
                "lowered": info,
            }
            log(f"    {name:<8} {_line(res['runtimes'][name])}")
        except Exception as e:  # a runtime that does not run this model: say so, keep going
            res["runtimes"][name] = {"error": f"{type(e).__name__}: {e}"}
            log(f"    {name:<8} failed: {type(e).__name__}: {e}")
    res["seconds"] = time.perf_counter() - t0
    return res


def _line(r: dict) -> str:
    m = r["median_ms"]
    return (
        f"unfolded {m['unfolded']:.3f} ms, folded {m['folded']:.3f} ms, ideal {m['ideal']:.3f} ms, "
        f"ideal+bias {m['ideal_bias']:.3f} ms; speedup {r['speedup']:.3f}x, folded/ideal "
        f"{r['folded_over_ideal']:.3f}, folded/(ideal+bias) {r['folded_over_ideal_bias']:.3f} "
        f"({r['rounds']} rounds x {r['calls_per_sample']} calls; load {load_now()})"
    )


def run(
    archs=("efficientnet", "resnet", "audio"),
    runtimes=RUNTIMES,
    quick=False,
    rounds=30,
    portable_rounds=15,
    out_dir=None,
    et_archs=None,
) -> dict:
    quiet()
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    try:
        from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool

        _unsafe_reset_threadpool(1)
        et_threads = 1
    except Exception as e:  # pragma: no cover
        et_threads = f"default (could not reset: {e})"
    log("B. inference speed")
    rows = [bench_arch(a, quick, runtimes, rounds, portable_rounds, et_archs) for a in archs]
    doc = {
        "benchmark": "inference_speed",
        "quick": quick,
        "machine": machine(),
        "torch_threads": 1,
        "executorch_threads": et_threads,
        "rows": rows,
        "load_end": load_now(),
    }
    doc["summary"] = summary(rows)
    text = render(doc)
    suffix = "_quick" if quick else ""
    doc["json"] = str(write_json("inference_speed" + suffix, doc, out_dir))
    write_text("inference_speed" + suffix, text, out_dir)
    print(text, flush=True)
    return doc


def summary(rows) -> dict:
    out = {}
    for rt in RUNTIMES:
        vals = [r["runtimes"][rt] for r in rows if rt in r["runtimes"] and "error" not in r["runtimes"][rt]]
        if vals:
            out[rt] = {
                "worst_folded_over_ideal": max(v["folded_over_ideal"] for v in vals),
                "median_folded_over_ideal": median([v["folded_over_ideal"] for v in vals]),
                "median_speedup": median([v["speedup"] for v in vals]),
                "worst_folded_over_ideal_bias": max(v["folded_over_ideal_bias"] for v in vals),
                "median_ideal_bias_over_ideal": median([v["ideal_bias_over_ideal"] for v in vals]),
                "within_target": all(v["folded_over_ideal"] <= 1.02 for v in vals),
            }
    return out


def render(doc: dict) -> str:
    head = [
        "model",
        "runtime",
        "unfolded ms",
        "folded ms",
        "ideal ms",
        "ideal+bias ms",
        "speedup unf/fold",
        "folded/ideal",
        "unfolded/ideal",
        "folded/(ideal+bias)",
        "rounds x calls",
        "max rel. err folded",
    ]
    body = []
    for r in doc["rows"]:
        for rt in RUNTIMES:
            v = r["runtimes"].get(rt)
            if v is None:
                continue
            if "error" in v:
                body.append([r["arch"], rt, "failed: " + v["error"][:60], *([""] * 9)])
                continue
            m = v["median_ms"]
            body.append(
                [
                    r["arch"],
                    rt,
                    f"{m['unfolded']:.3f}",
                    f"{m['folded']:.3f}",
                    f"{m['ideal']:.3f}",
                    f"{m['ideal_bias']:.3f}",
                    fmt_x(v["speedup"], 3),
                    f"{v['folded_over_ideal']:.3f}",
                    f"{v['unfolded_over_ideal']:.3f}",
                    f"{v['folded_over_ideal_bias']:.3f}",
                    f"{v['rounds']} x {v['calls_per_sample']}",
                    f"{v['rel_err_vs_unfolded']['folded']:.1e}",
                ]
            )
    models = "\n".join(
        f"- **{r['arch']}**: {r['description']}; input {'x'.join(map(str, r['input_shape']))}; "
        f"{r['batchnorms']} BatchNorms ({r['folded']} folded, {len(r['skipped'])} skipped), "
        f"{r['parameters']:,} parameters; calibrated BN stats: max kappa "
        f"{r['bn_stats']['max_kappa']:.2f}, max |gamma|/sqrt(var+eps) {r['bn_stats']['max_scale']:.2f}"
        for r in doc["rows"]
    )
    xnn = []
    for r in doc["rows"]:
        v = r["runtimes"].get("xnnpack")
        if v and "lowered" in v:
            lw = v["lowered"]
            xnn.append(
                f"{r['arch']}: "
                + ", ".join(
                    f"{k} {lw[k]['delegate_calls']} delegate call(s) + {lw[k]['ops_outside_delegate']} op(s) outside "
                    f"({', '.join(lw[k]['outside']) or '-'})"
                    for k in VARIANTS
                )
            )
    s = doc["summary"]
    lines = [
        "### B. Inference latency (ms per call, batch 1, median; variants interleaved, 1 thread)",
        "",
        table(head, body, "ll" + "r" * 10),
        "",
        models,
        "",
        "speedup = unfolded/folded and folded/ideal = median of per-round ratios (target folded/ideal <= 1.02).",
    ]
    if xnn:
        lines += ["XNNPACK partitioning: " + "; ".join(xnn) + "."]
    for rt, v in s.items():
        lines.append(
            f"- {rt}: folded/ideal worst {v['worst_folded_over_ideal']:.3f} "
            f"({'all within' if v['within_target'] else 'NOT all within'} 1.02), median speedup "
            f"{v['median_speedup']:.3f}x; folded/(ideal+bias) worst {v['worst_folded_over_ideal_bias']:.3f}; "
            f"price of the conv biases (ideal+bias)/ideal, median {v['median_ideal_bias_over_ideal']:.3f}."
        )
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archs", default="efficientnet,resnet,audio")
    ap.add_argument("--runtimes", default=",".join(RUNTIMES))
    ap.add_argument("--rounds", type=int, default=30, help="rounds for eager and xnnpack")
    ap.add_argument("--portable-rounds", type=int, default=15)
    ap.add_argument(
        "--et-archs",
        default=None,
        help="architectures that also run on ExecuTorch (default: all; --quick: audio only, since "
        "lowering 4 programs x 2 runtimes dominates a smoke run)",
    )
    ap.add_argument("--quick", action="store_true", help="tiny inputs, 5 rounds (3 portable)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    rounds, prounds = (5, 3) if args.quick else (args.rounds, args.portable_rounds)
    et_archs = args.et_archs or ("audio" if args.quick else None)
    run(
        tuple(args.archs.split(",")),
        tuple(args.runtimes.split(",")),
        args.quick,
        rounds,
        prounds,
        args.out,
        tuple(et_archs.split(",")) if et_archs else None,
    )


if __name__ == "__main__":
    main()
