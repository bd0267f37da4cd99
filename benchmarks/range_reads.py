"""Part L: how often ``bnfold fold MODEL --fp16-range INPUTS --low-memory`` reads each streamed weight, and where
(issue 43: for a model larger than memory every read is a disk read).

Builds ``onnx_stream.py``'s model (``--mb`` MB of 2048x2048 float32 MatMul weights in one external data file) and
its calibration batches (``--batches``, 2 by default; the proof runs them and as many fresh ones, on the folded and
on the rewritten model), then runs the command in a fresh interpreter per code version, counting
``ExternalSource.read`` (a read of a
tensor's bytes from a data file or the scratch file, the save's read of a folded weight to make its product again
included), ``ExternalSource.refer`` (a tensor written to the scratch file) and ``ExternalSource.copy`` (the save's
copy in the kernel, or its write of a product made again) per tensor and stage:

* ``load + fold``  the streamed load and fold, up to ``rescale_result``;
* ``calibration``  the float32 run on the batches (``run_plain``);
* ``rewrite``      the plan and its edits (``rescale_graph``), split by the planner's step that read;
* ``proof, folded`` / ``proof, rewritten``  the two float64 runs;
* ``save``         the rest.

    python -m benchmarks.range_reads --mb 64 --dir /tmp/range_reads [--before OTHER/src] [--batches 2]

A benchmark, not a test: it prints a table and asserts nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from onnx_stream import _env  # noqa: E402
from range_stages import prepare  # noqa: E402

_CHILD = """
import collections, functools, json, sys
import bnfold.numerics.ranges as ranges, bnfold.rescale as rescale
from bnfold.io import onnx_stream
from bnfold.cli.main import main
stage = ["load + fold"]
seen = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0]))  # stage -> (what, tensor) -> n, bytes
# the planner's and the rewrite's steps that read a weight, innermost first (the stack's frame names)
STEPS = ("scaled", "check", "seen", "_exps_of_layers", "constant_ranges", "hot", "_read_layers", "plan", "apply")
def where():
    if stage[0] != "rewrite":
        return stage[0]
    f = sys._getframe(2)
    while f is not None:
        if f.f_code.co_name in STEPS:
            return "rewrite: " + f.f_code.co_name
        f = f.f_back
    return "rewrite"
def count(what, size):
    def wrap(real):
        @functools.wraps(real)
        def counted(self, t, *args):
            out = real(self, t, *args)
            n = size(out, t, *args)
            if n is not None:
                cell = seen[where()][(what, t.name)]
                cell[0] += 1
                cell[1] += n
            return out
        return counted
    return wrap
S = onnx_stream.ExternalSource
def _bytes_read(out, t):  # a product made again reads its weight (counted there), not bytes of its own
    return None if any(e.key == "location" and "made:" in e.value for e in t.external_data) else out.nbytes
if hasattr(S, "_read"):  # the save reads a folded weight again inside copy: every read goes through _read
    S._read = count("read", _bytes_read)(S._read)
else:
    S.read = count("read", _bytes_read)(S.read)
S.refer = count("write", lambda out, t, spilled, n: None if out is None else n)(S.refer)
S.copy = count("copy", lambda out, t, f: out)(S.copy)
def wrap(mod, attr, names):
    real = getattr(mod, attr)
    @functools.wraps(real)
    def staged(*args, **kwargs):
        stage[0] = names.pop(0)
        try:
            return real(*args, **kwargs)
        finally:
            stage[0] = names.pop(0)
    setattr(mod, attr, staged)
wrap(ranges, "run_plain", ["calibration", "rewrite", "proof, folded", "between", "proof, rewritten", "between"])
wrap(rescale, "rescale_result", ["calibration", "save"])
rc = main(sys.argv[1:])
out = {s: [[w, n, c[0], c[1]] for (w, n), c in cells.items()] for s, cells in seen.items()}
print("READS", rc, json.dumps(out), file=sys.stderr)
"""

_ORDER = ("load + fold", "calibration", "rewrite", "proof, folded", "between", "proof, rewritten", "save")


def counts(args: list[str], src: str) -> dict:
    """``bnfold ARGS`` (the package under ``src``) in a fresh interpreter: ``{stage: [[what, tensor, calls,
    bytes], ...]}``."""
    p = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True, env=_env(src))
    line = [x for x in p.stderr.splitlines() if x.startswith("READS")]
    if p.returncode or not line or line[0].split()[1] != "0":
        raise SystemExit(f"bnfold {' '.join(args)} failed:\n{p.stderr[-2000:]}")
    return json.loads(line[0].split(maxsplit=2)[2])


def _key(stage: str) -> tuple:
    top = stage.split(":")[0]
    return (_ORDER.index(top) if top in _ORDER else len(_ORDER), stage)


def _cell(rows: list, what: str, large: set) -> str:
    """Calls per large tensor (the least and the most over them; ``-``: none) and MB in all."""
    per: dict = {}
    for w, n, c, _ in rows:
        if w == what and n in large:
            per[n] = per.get(n, 0) + c
    mb = sum(b for w, _, _, b in rows if w == what) / 2**20
    if not mb:
        return ""
    lo, hi = min(per.get(n, 0) for n in large), max(per.get(n, 0) for n in large)
    return f"{lo}{'' if lo == hi else f'-{hi}'} ({mb:.0f} MB)"


def main(argv: list[str] | None = None) -> int:
    a, info, args, codes = prepare(argv, __doc__, 64.0, "/tmp/bnfold_range_reads")
    runs = {name: counts([*args, "--low-memory"], src) for name, src in codes}
    large = {"proj"} | {f"l{i}.w" for i in range(info["layers"])}  # the weights of 1 MiB or more
    print(
        f"{a.mb:.0f} MB of weights, {len(large)} weights of 1 MiB or more (largest {info['largest'] / 2**20:.1f} MB), "
        f"{a.batches} calibration batches (the proof: {2 * a.batches} on each model); per weight of 1 MiB or more, "
        f"the least-most calls, "
        f"and MB of every tensor:\n"
    )
    cols = [f"{name}: {what}" for name, _ in codes for what in ("read", "write", "copy")]
    print(f"| stage | {' | '.join(cols)} |\n|---|" + "---|" * len(cols))
    stages = sorted({s for r in runs.values() for s in r}, key=_key)
    total = {name: [] for name, _ in codes}
    for s in stages:
        cells = []
        for name, _ in codes:
            rows = runs[name].get(s, [])
            total[name] += rows
            cells += [_cell(rows, what, large) for what in ("read", "write", "copy")]
        print(f"| {s} | " + " | ".join(cells) + " |")
    cells = [_cell(total[name], what, large) for name, _ in codes for what in ("read", "write", "copy")]
    print("| **all** | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
