"""Part L: where the peak of ``bnfold fold MODEL --fp16-range INPUTS --low-memory`` goes, stage by stage (issue 43).

Builds ``onnx_stream.py``'s model (``--mb`` MB of 2048x2048 float32 MatMul weights in one external data file) and
its calibration batches (``--batches``, 2 by default), then runs the command in a fresh interpreter per code
version, its stages wrapped where bnfold looks them up: the peak RSS (``VmHWM``, reset through
``/proc/self/clear_refs`` where each stage starts) and the RSS where it starts and ends:

* ``load + fold``  the streamed load and fold, up to ``rescale_result``;
* ``calibration``  the float32 run on the batches (``run_plain``);
* ``rewrite``      the plan and its edits (``rescale_graph``: spans, scaled weights to the scratch file);
* ``proof, folded`` / ``proof, rewritten``  the two float64 runs on the batches and fresh ones;
* ``save``         the rest: the report and the output files.

    python -m benchmarks.range_stages --mb 256 --dir /tmp/range_stages [--before OTHER/src]

A benchmark, not a test: it prints a table and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from onnx_stream import _env, build  # noqa: E402

_CHILD = """
import functools, json, sys
def status(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key))
stages, at = [], {}
def mark(name):  # the stage before ends, ``name`` starts: its peak counts from here
    if at:
        stages.append(dict(at, peak=status("VmHWM"), end=status("VmRSS")))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    at.clear()
    at.update(name=name, start=status("VmRSS"))
import bnfold.numerics.ranges as ranges, bnfold.rescale as rescale
from bnfold.cli.main import main
def wrap(mod, attr, names):
    real = getattr(mod, attr)
    @functools.wraps(real)
    def stage(*args, **kwargs):
        mark(names.pop(0))
        try:
            return real(*args, **kwargs)
        finally:
            mark(names.pop(0))
    setattr(mod, attr, stage)
wrap(ranges, "run_plain", ["calibration", "rewrite", "proof, folded", "between", "proof, rewritten", "between"])
wrap(rescale, "rescale_graph", ["rewrite", "between"])
wrap(rescale, "rescale_result", ["calibration", "save"])
mark("load + fold")
rc = main(sys.argv[1:])
mark("")
print("STAGES", rc, json.dumps(stages), file=sys.stderr)
"""


def stages(args: list[str], src: str) -> list[dict]:
    """``bnfold ARGS`` (the package under ``src``) in a fresh interpreter: its stages, each a dict of name and
    bytes (``start``, ``peak``, ``end``), the marks between them merged into the stage before."""
    p = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True, env=_env(src))
    line = [x for x in p.stderr.splitlines() if x.startswith("STAGES")]
    if p.returncode or not line or line[0].split()[1] != "0":
        raise SystemExit(f"bnfold {' '.join(args)} failed:\n{p.stderr[-2000:]}")
    merged: list[dict] = []
    for s in json.loads(line[0].split(maxsplit=2)[2]):
        if merged and s["name"] in ("between", merged[-1]["name"]):
            merged[-1].update(peak=max(merged[-1]["peak"], s["peak"]), end=s["end"])
        else:
            merged.append(s)
    return merged


def _cell(r: dict) -> str:
    mb = 2**20
    return f"{r['start'] / mb:.1f}, {r['peak'] / mb:.1f} (+{(r['peak'] - r['start']) / mb:.1f}), {r['end'] / mb:.1f}"


def prepare(argv: list[str] | None, doc: str, mb: float, folder: str) -> tuple:
    """The command line (``--mb``, ``--dir``, ``--before``, ``--batches``) parsed, the model built in the emptied
    folder with its calibration batches (two by default): ``(arguments, the model's sizes, bnfold's arguments without
    --low-memory, [(name, src folder)])``."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--mb", type=float, default=mb, help=f"MB of weights (default {mb:.0f})")
    ap.add_argument("--dir", default=folder, help="working folder (emptied)")
    ap.add_argument("--before", metavar="SRC", help="another bnfold's src folder, run after this one")
    ap.add_argument("--batches", type=int, default=2, help="calibration batches (default 2; the proof runs 2x)")
    a = ap.parse_args(argv)
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    model = os.path.join(a.dir, "big.onnx")
    info = build(model, a.mb)
    inputs = os.path.join(a.dir, "inputs.npz")
    np.savez(inputs, x=np.random.default_rng(0).standard_normal((a.batches, 1, 3, 16, 16)).astype(np.float32) * 1e4)
    args = ["fold", model, "-o", os.path.join(a.dir, "out.onnx"), "--force", "-q", "--fp16-range", inputs]
    return a, info, args, [("this", "src")] + ([("before", a.before)] if a.before else [])


def main(argv: list[str] | None = None) -> int:
    a, info, args, codes = prepare(argv, __doc__, 256.0, "/tmp/bnfold_range_stages")
    runs = {name: stages([*args, "--low-memory"], src) for name, src in codes}
    mb, load = 2**20, os.getloadavg()[0]
    print(f"{a.mb:.0f} MB of weights, largest tensor {info['largest'] / mb:.1f} MB, load {load:.1f}; MB:\n")
    head = " | ".join(f"{n}: start, peak (+ over start), end" for n, _ in codes)
    print(f"| stage | {head} |\n|---|" + "---|" * len(codes))
    for i, s in enumerate(runs["this"]):
        cells = [_cell(runs[name][i]) if i < len(runs[name]) else "" for name, _ in codes]
        print(f"| {s['name']} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
