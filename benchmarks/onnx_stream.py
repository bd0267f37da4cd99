"""Part L, ONNX: the fold of a model with external data, plain and streamed (``--low-memory``).

Builds a stack of MatMul + per-channel Mul/Add (a folded BatchNorm's spelling) and Conv + BatchNormalization
layers with random float32 weights, saved with its weights in one external data file, then runs
``bnfold fold`` on it in a fresh subprocess per measurement and reads the peak RSS (``VmHWM``) and the time.
The baseline is ``shutil.copyfile`` of the data file.  Prints a table; asserts nothing.

    python -m benchmarks.onnx_stream --mb 1024 --dir /tmp/stream
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

import onnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "onnx"))
from stream_models import largest_tensor, linear_stack  # noqa: E402


def build(path: str, total_mb: float, width: int = 2048) -> dict:
    """A model of about ``total_mb`` MB of weights (linear layers of ``width``² float32 each, a conv and a
    BatchNormalization first), its weights in ``<name>.data``; returns sizes for the table."""
    n_layers = max(1, int(total_mb * 2**20 // (width * width * 4)))
    model = linear_stack(n_layers, width, channels=8, size=16)
    largest = largest_tensor(model)
    onnx.save(model, path, save_as_external_data=True, location=os.path.basename(path) + ".data")
    return {"layers": n_layers, "largest": largest}


_CHILD = """
import resource, sys, time
sys.argv = ["bnfold"] + sys.argv[1:]
from bnfold.cli.main import main
t = time.perf_counter()
rc = main(sys.argv[1:])
dt = time.perf_counter() - t
with open("/proc/self/status") as f:
    hwm = next(int(l.split()[1]) for l in f if l.startswith("VmHWM"))
print("RESULT", rc, dt, hwm * 1024, file=sys.stderr)
"""


def measure(args: list[str]) -> tuple[float, int]:
    """``bnfold ARGS`` in a fresh interpreter: (seconds of the command, peak RSS bytes)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [os.environ.get("PYTHONPATH", ""), "src"] if p))
    p = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True, env=env, check=False)
    line = [x for x in p.stderr.splitlines() if x.startswith("RESULT")]
    if p.returncode or not line or line[0].split()[1] != "0":
        raise SystemExit(f"bnfold {' '.join(args)} failed:\n{p.stderr[-2000:]}")
    _, _, dt, hwm = line[0].split()
    return float(dt), int(hwm)


def baseline(folder: str) -> tuple[float, int]:
    """The interpreter with bnfold and onnx imported and nothing loaded: (0, peak RSS)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [os.environ.get("PYTHONPATH", ""), "src"] if p))
    code = (
        "import bnfold, bnfold.cli, onnx, torch\n"
        "with open('/proc/self/status') as f:\n"
        "    print(next(int(l.split()[1]) for l in f if l.startswith('VmHWM')) * 1024)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return 0.0, int(out.stdout.strip())


def _same(a: str, b: str) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(1 << 24), fb.read(1 << 24)
            if x != y:
                return False
            if not x:
                return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=1024.0, help="MB of weights (default 1024)")
    ap.add_argument("--dir", default="/tmp/bnfold_stream", help="working folder (emptied)")
    a = ap.parse_args(argv)
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    src = os.path.join(a.dir, "big.onnx")
    info = build(src, a.mb)
    data = src + ".data"
    weights = os.path.getsize(data)
    graph = os.path.getsize(src)
    t = time.perf_counter()
    shutil.copyfile(data, os.path.join(a.dir, "copy.data"))
    copy_s = time.perf_counter() - t
    os.remove(os.path.join(a.dir, "copy.data"))
    _, base = baseline(a.dir)
    rows = []
    for name, extra in (("plain", []), ("streamed (--low-memory)", ["--low-memory"])):
        folder = os.path.join(a.dir, "stream" if extra else "plain")
        os.makedirs(folder)
        out = os.path.join(folder, "out.onnx")
        dt, hwm = measure(["fold", src, "-o", out, "--force", "-q", *extra])
        rows.append((name, dt, hwm))
    same = all(
        _same(os.path.join(a.dir, "plain", f), os.path.join(a.dir, "stream", f)) for f in ("out.onnx", "out.onnx.data")
    )
    mb = 2**20
    print(
        f"weights {weights / mb:.0f} MB in {info['layers'] + 2} layers, largest tensor {info['largest'] / mb:.1f} MB, "
        f"graph file {graph / 1024:.0f} KB; interpreter with bnfold imported: {base / mb:.0f} MB; "
        f"shutil.copyfile of the data: {copy_s:.2f} s"
    )
    print("| fold | peak RSS (MB) | peak - interpreter (MB) | / weights | / largest tensor | time (s) | / copy |")
    print("|---|---|---|---|---|---|---|")
    for name, dt, hwm in rows:
        over = hwm - base
        print(
            f"| {name} | {hwm / mb:.0f} | {over / mb:.0f} | {over / weights:.2f} | {over / info['largest']:.1f} "
            f"| {dt:.2f} | {dt / copy_s:.2f} |"
        )
    print(f"outputs byte-identical: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
