"""A (hostile chains). The plain fold of one conv followed by a long chain, against a baseline.

    .venv/bin/python benchmarks/long_chains.py [--sizes 500,1000,2000] [--rounds 2] [--baseline DIR] [--channels 128]

ONNX models, built here: a conv (``channels`` x ``channels`` x 3 x 3, float32), then ``N`` of

* ``mul100``  ``Mul`` by the scalar 100: 18 fold, the product of the 19th overflows float32; the rest of the
              chain (the walk reads at most ``engine.chain.MAX_CHAIN`` steps) is refused step by step, each
              ``cast_range`` with its reason;
* ``bn``      eval ``BatchNormalization`` (gamma 0.9-1.1): every one folds, ``MAX_CHAIN`` a round;
* ``bn10``    eval ``BatchNormalization`` with gamma 10: 38 fold, the rest are refused.

``bnfold.fold(model)`` of this code and, with ``--baseline DIR``, of another bnfold package folder imported
under its folder's name (as ``fold_scaling.py --baseline``), round robin in ONE process: least wall and CPU
time over the rounds, and the load.  Then each version's report as JSON (``json.dumps(report.to_dict())``): its
size and least CPU time over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fold_scaling import _baseline, _clock  # noqa: E402


def chain(kind: str, n: int, c: int):
    rng = np.random.default_rng(0)
    inits = [nh.from_array(rng.standard_normal((c, c, 3, 3)).astype(np.float32), "w")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["y0"], name="conv", pads=[1, 1, 1, 1])]
    if kind == "mul100":
        inits.append(nh.from_array(np.array(100.0, np.float32), "k"))
    for i in range(n):
        x, y = f"y{i}", f"y{i + 1}"
        if kind == "mul100":
            nodes.append(helper.make_node("Mul", [x, "k"], [y], name=f"mul{i}"))
            continue
        gamma = np.full(c, 10.0) if kind == "bn10" else rng.uniform(0.9, 1.1, c)
        for role, v in (
            ("s", gamma),
            ("b", rng.normal(0, 0.01, c)),
            ("m", rng.normal(0, 0.01, c)),
            ("v", rng.uniform(0.9, 1.1, c)),
        ):
            inits.append(nh.from_array(v.astype(np.float32), f"{role}{i}"))
        nodes.append(
            helper.make_node("BatchNormalization", [x, f"s{i}", f"b{i}", f"m{i}", f"v{i}"], [y], name=f"bn{i}")
        )
    graph = helper.make_graph(
        nodes,
        kind,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 8, 8])],
        [helper.make_tensor_value_info(f"y{n}", TensorProto.FLOAT, [1, c, 8, 8])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="500,1000,2000")
    ap.add_argument("--kinds", default="mul100,bn,bn10")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--channels", type=int, default=128)
    ap.add_argument("--baseline", default=None, help="a bnfold package folder to compare with (imported by its name)")
    args = ap.parse_args()
    from common import load_now, table

    import bnfold

    versions = {"this code": bnfold.fold}
    if args.baseline:
        versions["baseline"] = _baseline(args.baseline).fold
    rows = []
    for kind in args.kinds.split(","):
        for n in (int(s) for s in args.sizes.split(",")):
            model = chain(kind, n, args.channels)
            best: dict = {}
            for _ in range(args.rounds):
                for label, fold in versions.items():
                    out = {}
                    wall, cpu = _clock(lambda fold=fold, out=out: out.setdefault("r", fold(model)))
                    r = out["r"].report
                    _, dump = _clock(lambda r=r, out=out: out.setdefault("json", json.dumps(r.to_dict())))
                    old = best.get(label, (wall, cpu, r, dump))
                    best[label] = (min(wall, old[0]), min(cpu, old[1]), r, min(dump, old[3]), len(out["json"]))
            report = best["this code"][2]
            row = [kind, n, len(report.folded), len(report.kept_ops) + len(report.skipped)]
            row += [f"{best[v][0]:.2f} / {best[v][1]:.2f}" for v in versions]
            row += [f"{best[v][4] / 1e6:.2f} MB, {best[v][3]:.2f} s" for v in versions]
            rows.append(row)
            print(" | ".join(map(str, row)), f"load {load_now()}", flush=True)
    head = ["chain", "N", "folded entries", "refused", *(f"{v} s (wall / cpu)" for v in versions)]
    print(table(head + [f"{v} JSON report (cpu)" for v in versions], rows))
    print(f"load {load_now()}")


if __name__ == "__main__":
    main()
