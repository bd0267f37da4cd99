"""K. The fp16 range rewrite (``bnfold.fold(model, fp16_range=batches)``): what it does to fp16 numerics, and that it
costs nothing at run time.

    .venv/bin/python benchmarks/fp16_range.py [--models attention,residual,...] [--rounds 30]

The five range-breaking models of ``tests/range_models.py`` (attention scores before ``1/sqrt(d)``, a pre-RMSNorm
residual stream, hot conv channels before ReLU and max-pool, an SE mean spelled ``sum(x) * (1/HW)``, a spelled-out
LayerNorm), each exported with ``torch.export`` and to ONNX (TorchScript, opset 14).  ``folded``: ``bnfold.fold`` of
it; ``rewritten``: ``bnfold.fold(..., fp16_range=2 calibration batches)``.

Numerics: ``bnfold.audit(..., profile="fp16", fold=False)`` of both, on 2 other batches: output SQNR against float64
(over the finite elements), the share of NaN/inf outputs, top-1 agreement with float64; and ONNX Runtime on the
onnxconverter-common float16 conversion of both ONNX models (``audit(..., runtime="onnxruntime")``).

Latency, batch as the model's shapes, one thread: torch eager (``ExportedProgram.module()``), ExecuTorch with XNNPACK
(``to_edge_transform_and_lower``) and ONNX Runtime (CPU, float32), the two variants interleaved round by round
(``common.round_robin``), a sample being ``k`` back-to-back calls (``k`` chosen for ~20 ms after 20 warm-up calls);
reported: median ms per call and the median per-round ratio rewritten / folded.  Nothing asserts: the rewrite changes
weights and constants, and inserts a multiply only where the report counts one.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
from common import fmt_db, log, machine, median, paired_ratio, round_robin, table, write_json, write_text  # noqa: E402

import bnfold  # noqa: E402
import range_models as rm  # noqa: E402


def _calls(fn, target_s: float = 0.02) -> int:
    """How many back-to-back calls make a sample of ``target_s`` (after 20 warm-up calls)."""
    for _ in range(20):
        fn()
    t = time.perf_counter()
    for _ in range(10):
        fn()
    once = max((time.perf_counter() - t) / 10, 1e-7)
    return max(1, int(target_s / once))


def _sampler(fn, k: int):
    def sample() -> float:
        t = time.perf_counter()
        for _ in range(k):
            fn()
        return (time.perf_counter() - t) / k

    return sample


def _latency(fns: dict, rounds: int) -> dict:
    k = max(_calls(f) for f in fns.values())
    times = round_robin({name: _sampler(f, k) for name, f in fns.items()}, rounds)
    return {
        "ms": {name: 1e3 * median(t) for name, t in times.items()},
        "ratio": paired_ratio(times["rewritten"], times["folded"]),
        "calls": k,
    }


def _eager(program, batch):
    module = program.module()
    return lambda: module(*batch)


def _xnnpack(program, batch, keep: list):
    """The program lowered to ExecuTorch with XNNPACK (``inference_speed.lower_xnnpack``), run by its runtime."""
    from executorch.runtime import Runtime
    from inference_speed import lower_xnnpack

    buf, _ = lower_xnnpack(program)
    loaded = Runtime.get().load_program(buf)
    method = loaded.load_method("forward")
    keep += [buf, loaded, method]  # the runtime reads the .pte bytes in place
    return lambda: method.execute(list(batch))


def _ort(model, batch):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    feed = {i.name: x.numpy() for i, x in zip(sess.get_inputs(), batch)}
    return lambda: sess.run(None, feed)


def _numbers(model, batches, runtime=None) -> dict:
    rep = bnfold.audit(model, batches, profile="fp16", fold=False, local=False, runtime=runtime).to_dict()
    e2e = (rep["runtime"] if runtime else rep["end_to_end"])["unfolded"]
    return {k: e2e[k] for k in ("output_finite_sqnr_db", "nonfinite_share", "top1_agreement")}


def run(names: list[str], rounds: int) -> dict:
    _one_thread()
    rows = []
    for name in names:
        model = rm.build(name)
        calibration, fresh = rm.batches(model, 2), rm.batches(model, 2, seed=7)
        row = {"model": name}
        for fmt, exported in (("pt2", rm.program(model)), ("onnx", rm.onnx_model(model))):
            log(f"{name} {fmt}")
            folded = bnfold.fold(exported).model
            result = bnfold.fold(exported, fp16_range=calibration)
            done = [e for e in result.report.rescaled if e.factor != 1.0]
            row[fmt] = {
                "rescaled": [(e.value, e.kind, e.factor, e.code.value, e.muls) for e in result.report.rescaled],
                "muls": sum(e.muls for e in done),
                "before": _numbers(exported, fresh),
                "after": _numbers(result.model, fresh),
            }
            if fmt == "pt2":
                fns = {"folded": _eager(folded, fresh[0]), "rewritten": _eager(result.model, fresh[0])}
                with torch.no_grad():
                    row[fmt]["eager"] = _latency(fns, rounds)
                keep: list = []
                fns = {"folded": _xnnpack(folded, fresh[0], keep), "rewritten": _xnnpack(result.model, fresh[0], keep)}
                row[fmt]["xnnpack"] = _latency(fns, rounds)
            else:
                row[fmt]["ort_fp16_before"] = _numbers(exported, fresh, "onnxruntime")
                row[fmt]["ort_fp16_after"] = _numbers(result.model, fresh, "onnxruntime")
                fns = {"folded": _ort(folded, fresh[0]), "rewritten": _ort(result.model, fresh[0])}
                row[fmt]["ort"] = _latency(fns, rounds)
        rows.append(row)
    return {"machine": machine(), "rounds": rounds, "rows": rows}


def _share(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def report(doc: dict) -> str:
    num, lat = [], []
    for row in doc["rows"]:
        for fmt in ("pt2", "onnx"):
            r = row[fmt]
            b, a = r["before"], r["after"]
            kinds = ", ".join(sorted({k for _, k, f, _, _ in r["rescaled"] if f != 1.0})) or "-"
            num.append(
                [
                    row["model"],
                    fmt,
                    kinds,
                    r["muls"],
                    fmt_db(b["output_finite_sqnr_db"]),
                    _share(b["nonfinite_share"]),
                    fmt_db(a["output_finite_sqnr_db"]),
                    _share(a["nonfinite_share"]),
                    a["top1_agreement"],
                ]
            )
            if fmt == "onnx":
                ob, oa = r["ort_fp16_before"], r["ort_fp16_after"]
                num[-1] += [fmt_db(ob["output_finite_sqnr_db"]), fmt_db(oa["output_finite_sqnr_db"])]
            else:
                num[-1] += ["", ""]
            for runtime in ("eager", "xnnpack") if fmt == "pt2" else ("ort",):
                timing = r[runtime]
                lat.append(
                    [
                        row["model"],
                        {"ort": "onnxruntime"}.get(runtime, runtime),
                        f"{timing['ms']['folded']:.4f}",
                        f"{timing['ms']['rewritten']:.4f}",
                        f"{timing['ratio']:.3f}",
                        f"{doc['rounds']} x {timing['calls']}",
                    ]
                )
    head = [
        "model",
        "format",
        "rewrite",
        "muls",
        "fp16 SQNR before",
        "NaN before",
        "fp16 SQNR after",
        "NaN after",
        "top-1 after",
        "ORT fp16 before",
        "ORT fp16 after",
    ]
    return (
        table(head, num)
        + "\n\n"
        + table(["model", "runtime", "folded ms", "rewritten ms", "rewritten/folded", "rounds x calls"], lat)
    )


def _one_thread() -> None:
    torch.set_num_threads(1)
    from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool

    _unsafe_reset_threadpool(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(rm.RANGE_MODELS))
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    doc = run(args.models.split(","), args.rounds)
    text = report(doc)
    write_json("fp16_range", doc)
    write_text("fp16_range", text)
    print(text)


if __name__ == "__main__":
    main()
