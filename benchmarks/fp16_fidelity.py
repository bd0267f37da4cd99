"""C. fp16 fidelity, unfolded vs folded, via ``bnfold.audit``.

    .venv/bin/python benchmarks/fp16_fidelity.py [--models demo,efficientnet,resnet,audio] [--quick]
        [--samples 256] [--batch 32]

Models:

* ``demo``  the trained DigitNet that ships with bnfold (``bnfold.demo``: checkpoint
            trained by ``scripts/train_demo.py`` on scikit-learn's digits; its BatchNorm
            statistics come from that training), audited on the 450 held-out digits
            (labels given, so accuracy is reported too);
* ``efficientnet``, ``resnet``, ``audio``  the part-B architectures (``models.py``) with
            BatchNorm statistics calibrated in train mode on structured random inputs
            (8 batches of 16, cumulative average), then eval; audited on held-out
            structured inputs drawn with a different seed (no labels: random weights
            make accuracy meaningless, top-1 agreement with the float32 model is the measure).

Each model is exported once and audited under the ``fp16`` and ``htp`` profiles
(``bnfold.audit`` folds it with ``bnfold.fold`` and emulates both programs
next to a float64 reference).  Reported per model, profile and program:
top-1 agreement with the float32 model, end-to-end output SQNR against
float64, NaN / inf counts; single-threaded.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import fmt_db, fmt_pct, load_now, log, machine, median, quiet, table, write_json, write_text  # noqa: E402

PROFILES = ("fp16", "htp")
ARCH_MODELS = ("efficientnet", "resnet", "audio")


def _audit_fn():
    try:
        import bnfold

        return bnfold.audit
    except (AttributeError, ImportError) as e:
        raise SystemExit(
            "part C needs bnfold.audit (bnfold.numerics), which this checkout does not provide "
            f"({type(e).__name__}: {e}); install bnfold with its 'numerics' extra"
        ) from e


def _demo():
    try:
        from bnfold.demo.data import load_split
        from bnfold.demo.run import CHECKPOINT, load_model
    except ImportError as e:
        raise SystemExit(f"part C needs bnfold.demo (model + checkpoint) and scikit-learn for its data: {e}") from e
    model, meta = load_model()
    _, _, x_test, y_test = load_split()
    return model, meta, x_test, y_test, CHECKPOINT


def _rows_of(rep, label: str) -> list[dict]:
    rows = []
    for which in ("unfolded", "folded"):
        e = getattr(rep, which)
        if e is None:
            continue
        rows.append(
            {
                "model": label,
                "profile": rep.profile,
                "program": which,
                "samples": rep.samples,
                "top1_agreement": e.top1_agreement,
                "accuracy": e.accuracy,
                "output_sqnr_db": e.output.sqnr_db,
                "nan": e.output.nan,
                "inf": e.output.inf,
            }
        )
    return rows


def audit_model(name: str, quick: bool, samples: int, batch: int, out_dir) -> dict:
    import torch

    audit = _audit_fn()
    t0 = time.perf_counter()
    labels = None
    if name == "demo":
        model, meta, x, y, ckpt = _demo()
        if quick:
            x, y = x[:64], y[:64]
        size = 32 if quick else 150
        batches = [(b,) for b in x.split(size)]
        labels = y
        info = {
            "description": "DigitNet (bnfold.demo): EfficientNet-style 8x8 digits classifier, trained "
            f"({meta.get('epochs', '?')} epochs, seed {meta.get('seed', '?')}; checkpoint "
            f"{ckpt.name}); held-out split of scikit-learn digits",
            "bn_stats_source": "training (the checkpoint's running statistics)",
            "input_shape": list(x.shape[1:]),
        }
        dynamic = ({0: torch.export.Dim("batch")},) if len({b[0].shape[0] for b in batches}) > 1 else None
        ep = torch.export.export(model, batches[0], dynamic_shapes=dynamic)
    else:
        from models import DESCRIPTIONS, QUICK_SHAPES, build, structured_inputs

        b = build(name, QUICK_SHAPES[name] if quick else None, calib_batches=2 if quick else 8)
        shape = (batch, *b["shape"][1:])
        batches = [(t,) for t in structured_inputs(shape, max(1, samples // batch), seed=12345)]
        info = {
            "description": DESCRIPTIONS[name],
            "bn_stats_source": "calibrated: train mode, momentum=None (cumulative), "
            f"{2 if quick else 8} batches of 16 structured random inputs, then eval; "
            "gamma ~ U(0.5, 1.5), beta ~ U(-0.3, 0.3)",
            "input_shape": list(b["shape"][1:]),
        }
        ep = torch.export.export(b["model"], batches[0])
    reports = {}
    for prof in PROFILES:
        tp = time.perf_counter()
        reports[prof] = audit(ep, batches, profile=prof, labels=labels)
        log(f"  {name} {prof}: {time.perf_counter() - tp:.1f}s; load {load_now()}")
    rows = [r for prof in PROFILES for r in _rows_of(reports[prof], name)]
    rep = reports["htp"]
    norms = rep.norms
    out = {
        "model": name,
        **info,
        "samples": rep.samples,
        "batches": rep.batches,
        "rows": rows,
        "batchnorms": len(norms),
        "folded": len(rep.fold_report.folded) if rep.fold_report else None,
        "skipped": len(rep.fold_report.skipped) if rep.fold_report else None,
        "max_kappa": max((n.kappa for n in norms), default=None),
        "median_kappa": median([n.kappa for n in norms]) if norms else None,
        "min_headroom": min((n.headroom for n in norms), default=None),
        "fp32_accuracy": rep.fp32_accuracy,
        "seconds": time.perf_counter() - t0,
    }
    detail_dir = os.path.join(str(out_dir), "audits") if out_dir else None
    out["audit_json"] = {
        p: str(
            write_json(
                f"audit_{name}_{p}{'_quick' if quick else ''}", reports[p].to_dict(), detail_dir or _default_audits()
            )
        )
        for p in PROFILES
    }
    return out


def _default_audits():
    from common import RESULTS

    return RESULTS / "audits"


def run(models=("demo", *ARCH_MODELS), quick=False, samples=256, batch=32, out_dir=None) -> dict:
    quiet()
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    log("C. fp16 fidelity")
    try:
        results = [audit_model(m, quick, 64 if quick else samples, 16 if quick else batch, out_dir) for m in models]
    finally:
        torch.set_num_threads(threads)
    doc = {
        "benchmark": "fp16_fidelity",
        "quick": quick,
        "machine": machine(),
        "models": results,
        "load_end": load_now(),
    }
    doc["summary"] = summary(results)
    text = render(doc)
    suffix = "_quick" if quick else ""
    doc["json"] = str(write_json("fp16_fidelity" + suffix, doc, out_dir))
    write_text("fp16_fidelity" + suffix, text, out_dir)
    print(text, flush=True)
    return doc


def summary(results) -> dict:
    out = {}
    for prof in PROFILES:
        agree = {
            w: [r["top1_agreement"] for m in results for r in m["rows"] if r["profile"] == prof and r["program"] == w]
            for w in ("unfolded", "folded")
        }
        sq = {
            w: [r["output_sqnr_db"] for m in results for r in m["rows"] if r["profile"] == prof and r["program"] == w]
            for w in ("unfolded", "folded")
        }
        nan = {
            w: sum(
                r["nan"] + r["inf"] for m in results for r in m["rows"] if r["profile"] == prof and r["program"] == w
            )
            for w in ("unfolded", "folded")
        }
        per_model = {
            m["model"]: {r["program"]: r["top1_agreement"] for r in m["rows"] if r["profile"] == prof} for m in results
        }
        out[prof] = {
            "min_agreement": {w: min(v) if v else None for w, v in agree.items()},
            "agreement_per_model": per_model,
            "median_sqnr_db": {w: median(v) for w, v in sq.items()},
            "sqnr_gain_db": [f - u for f, u in zip(sq["folded"], sq["unfolded"])],
            "nonfinite": nan,
        }
    return out


def render(doc: dict) -> str:
    head = [
        "model",
        "profile",
        "program",
        "samples",
        "top-1 agreement w/ fp32",
        "accuracy",
        "output SQNR dB",
        "NaN",
        "inf",
    ]
    body = []
    for m in doc["models"]:
        for r in m["rows"]:
            body.append(
                [
                    m["model"],
                    r["profile"],
                    r["program"],
                    r["samples"],
                    fmt_pct(r["top1_agreement"], 2),
                    fmt_pct(r["accuracy"], 2),
                    fmt_db(r["output_sqnr_db"]),
                    r["nan"],
                    r["inf"],
                ]
            )
    notes = []
    for m in doc["models"]:
        notes.append(
            f"- **{m['model']}**: {m['description']}; input {'x'.join(map(str, m['input_shape']))}; "
            f"{m['batchnorms']} BatchNorms ({m['folded']} folded, {m['skipped']} skipped); BN statistics: "
            f"{m['bn_stats_source']}; max kappa {m['max_kappa']:.3g}, min fp16 headroom "
            f"{m['min_headroom']:.3g}x"
            + (f"; fp32 accuracy {fmt_pct(m['fp32_accuracy'], 2)}" if m["fp32_accuracy"] is not None else "")
        )
    s = doc["summary"]
    lines = [
        "### C. fp16 fidelity (bnfold.audit; SQNR of the end-to-end output against float64)",
        "",
        table(head, body, "lllrrrrrr"),
        "",
        *notes,
        "",
    ]
    for prof, v in s.items():
        gains = ", ".join(f"{g:+.1f}" for g in v["sqnr_gain_db"])
        lines.append(
            f"- {prof}: lowest top-1 agreement unfolded {fmt_pct(v['min_agreement']['unfolded'], 2)}, "
            f"folded {fmt_pct(v['min_agreement']['folded'], 2)}; SQNR change from folding per model "
            f"({', '.join(m['model'] for m in doc['models'])}): {gains} dB; NaN+inf unfolded "
            f"{v['nonfinite']['unfolded']}, folded {v['nonfinite']['folded']}."
        )
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="demo," + ",".join(ARCH_MODELS))
    ap.add_argument("--samples", type=int, default=256, help="held-out samples per architecture (demo: all 450)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="tiny inputs, 64 samples")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    run(tuple(args.models.split(",")), args.quick, args.samples, args.batch, args.out)


if __name__ == "__main__":
    main()
