"""Part L, ONNX: the streamed fold (``--low-memory``) of a float64 weight: its peak over the floor against the tensor.
``--dtype float32 --pruned``: a float32 weight whose scales have a zero channel beside scales <= 1/2 (a pruned
BatchNorm's gamma 0: the fold's float64 route, the float64 product rounded once).

Builds ``x @ W * s`` with ``W`` float64 ``[n, n]`` (random; ``--mb`` MiB) in an external data file, and the floor: the
same graph with ``W`` cut to 5 rows (80 KiB at n = 2048: still left on disk, read, checked and folded the same way).
Each fold runs in a fresh interpreter (``onnx_stream.measure``: the peak RSS, ``VmHWM``); ``--before`` runs another
checkout's code in the same rounds, interleaved.  Prints a table and whether the outputs are byte-identical; asserts
nothing.

    python benchmarks/onnx_stream_float64.py --dir /tmp/f64 [--mb 32] [--rounds 3] [--before OTHER/src]
        [--dtype float64|float32|float16] [--pruned]
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import sys

import numpy as np
import onnx
from onnx import helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from onnx_stream import measure  # noqa: E402


def build(path: str, rows: int, n: int, dtype: str = "float64", pruned: bool = False) -> None:
    rng = np.random.default_rng(0)
    s = rng.uniform(0.25 if pruned else 0.5, 2.0, n)
    if pruned:
        s[5] = 0.0
    inits = [
        numpy_helper.from_array((rng.standard_normal((rows, n)) / 16).astype(dtype), "w"),
        numpy_helper.from_array(s.astype(dtype), "s"),
    ]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"), helper.make_node("Mul", ["m", "s"], ["y"])]
    kind = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    io = [helper.make_tensor_value_info(v, kind, [1, k]) for v, k in (("x", rows), ("y", n))]
    graph = helper.make_graph(nodes, "g", io[:1], io[1:], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path, save_as_external_data=True, location=os.path.basename(path) + ".data", size_threshold=0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/bnfold_f64", help="working folder (emptied)")
    ap.add_argument("--mb", type=float, default=32.0, help="MiB of the weight (default 32)")
    ap.add_argument("--dtype", default="float64", choices=["float64", "float32", "float16"])
    ap.add_argument("--pruned", action="store_true", help="a zero scale beside scales <= 1/2 (the float64 route)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", metavar="SRC", help="another bnfold's src folder, interleaved")
    args = ap.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    size = np.dtype(args.dtype).itemsize
    n = int((args.mb * 2**20 / size) ** 0.5)
    big, floor = os.path.join(args.dir, "big.onnx"), os.path.join(args.dir, "floor.onnx")
    build(big, n, n, args.dtype, args.pruned)
    build(floor, 5, n, args.dtype, args.pruned)
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    codes = [("this", here)] + ([("before", args.before)] if args.before else [])
    tensor = n * n * size
    print(f"W {args.dtype} [{n}, {n}]{', a zero scale' if args.pruned else ''}: {tensor / 1e6:.1f} MB")
    print("| round | code | peak MB | floor MB | peak - floor MB | / the tensor |")
    print("|------:|:-----|--------:|---------:|----------------:|-------------:|")
    for r in range(args.rounds):
        for name, src in codes:
            outs = [os.path.join(args.dir, f"{name}_{k}", "out.onnx") for k in ("big", "floor")]
            for out in outs:
                shutil.rmtree(os.path.dirname(out), ignore_errors=True)
                os.makedirs(os.path.dirname(out))
            peak = measure(["fold", big, "-o", outs[0], "-q", "--low-memory"], src)[1]
            base = measure(["fold", floor, "-o", outs[1], "-q", "--low-memory"], src)[1]
            print(
                f"| {r} | {name} | {peak / 1e6:.1f} | {base / 1e6:.1f} | {(peak - base) / 1e6:.1f} | "
                f"{(peak - base) / tensor:.2f}x |",
                flush=True,
            )
    if args.before:
        same = all(
            filecmp.cmp(os.path.join(args.dir, "this_big", f), os.path.join(args.dir, "before_big", f), shallow=False)
            for f in ("out.onnx", "out.onnx.data")
        )
        print(f"outputs byte-identical: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
