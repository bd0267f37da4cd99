"""Part L, ONNX: the fold of a model with external data, plain and streamed (``--low-memory``).

Builds a stack of MatMul + per-channel Mul/Add (a folded BatchNorm's spelling) and Conv + BatchNormalization
layers with random float32 weights, saved with its weights in one external data file, then runs
``bnfold fold`` on it in a fresh subprocess per measurement and reads the peak RSS (``VmHWM``) and the time.
The baseline is ``shutil.copyfile`` of the data file.  Prints a table; asserts nothing.

Two floors of the peak, each the same streamed fold in a fresh subprocess: a 2-layer model of 64 KiB tensors (the
interpreter, the imports, the code) and "with this graph": this model with every tensor over 64 KiB cut to its
first 64 KiB of rows (the same nodes, names and per-channel vectors, read inline as here; the cut tensors still
streamed, checked and spilled), so "peak - floor with this graph" is what the large tensors add.  With
``--fp16-range``, the rows that rewrite read it against the same layers with 64 KiB tensors folded with
``--fp16-range --low-memory`` (a model the calibration can run: the rewrite's code, statistics and programs).

    python -m benchmarks.onnx_stream --mb 1024 --dir /tmp/stream [--before OTHER/src] [--rounds 2] [--plain-once]
        [--fp16-range]

``--before`` runs another checkout's streamed fold in the same rounds (its ``src`` folder first on the path; with
``--fp16-range``, its streamed fold with ``--fp16-range`` too).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np
import onnx
from onnx import numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # common (--save)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "onnx"))
from stream_models import largest_tensor, linear_stack  # noqa: E402

FLOOR_BYTES = 64 << 10  # a large tensor's size in the floor's graph: the smallest the streamed load leaves on disk


def build(path: str, total_mb: float, width: int = 2048) -> dict:
    """A model of about ``total_mb`` MB of weights (linear layers of ``width``² float32 each, a conv and a
    BatchNormalization first), its weights in ``<name>.data``; returns sizes for the table."""
    n_layers = max(1, int(total_mb * 2**20 // (width * width * 4)))
    model = linear_stack(n_layers, width, channels=8, size=16)
    largest, (small, cut) = largest_tensor(model), shrunk(model)
    onnx.save(model, path, save_as_external_data=True, location=os.path.basename(path) + ".data")
    return {"layers": n_layers, "largest": largest, "small": small, "cut": cut}


def shrunk(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """The floor's graph: ``model`` with every tensor over :data:`FLOOR_BYTES` cut to its first rows (64 KiB, so
    the streamed load still leaves it on disk and the fold reads, checks and spills it the same way); the nodes,
    names and every smaller tensor (the per-channel vectors) as they are.  Returns it and the tensors cut."""
    small = onnx.ModelProto()
    small.CopyFrom(model)
    cut = 0
    for t in small.graph.initializer:
        a = numpy_helper.to_array(t)
        if a.nbytes > FLOOR_BYTES:
            rows = max(1, FLOOR_BYTES // (a[0].nbytes or 1))
            t.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(a[:rows]), t.name))
            cut += 1
    return small, cut


_CHILD = """
import resource, sys, time
import onnx  # the interpreter's fixed cost (onnx imports ml_dtypes), timed apart from the command
sys.argv = ["bnfold"] + sys.argv[1:]
from bnfold.cli.main import main
t = time.perf_counter()
rc = main(sys.argv[1:])
dt = time.perf_counter() - t
with open("/proc/self/status") as f:
    hwm = next(int(l.split()[1]) for l in f if l.startswith("VmHWM"))
print("RESULT", rc, dt, hwm * 1024, file=sys.stderr)
"""


def _env(src: str) -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [src, os.environ.get("PYTHONPATH", "")] if p))


def measure(args: list[str], src: str = "src") -> tuple[float, int]:
    """``bnfold ARGS`` (the package under ``src``) in a fresh interpreter: (seconds of the command, peak RSS bytes).
    Dirty pages of what ran before are written out first (``os.sync()``), so no command pays for another's."""
    os.sync()
    p = subprocess.run(
        [sys.executable, "-c", _CHILD, *args], capture_output=True, text=True, env=_env(src), check=False
    )
    line = [x for x in p.stderr.splitlines() if x.startswith("RESULT")]
    if p.returncode or not line or line[0].split()[1] != "0":
        raise SystemExit(f"bnfold {' '.join(args)} failed:\n{p.stderr[-2000:]}")
    _, _, dt, hwm = line[0].split()
    return float(dt), int(hwm)


def import_time(src: str = "src") -> float:
    """Seconds to import onnx in an interpreter that imported bnfold (not in the times: a fixed cost)."""
    code = "import time, bnfold.cli\nt = time.perf_counter()\nimport onnx\nprint(time.perf_counter() - t)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(src), check=True)
    return float(out.stdout)


def copies(data: str, folder: str) -> tuple[float, float, float]:
    """Seconds to copy the data file once: ``shutil.copyfile`` (in the kernel), the same then ``fsync`` (as the
    fold's atomic writer syncs its output) and a read/write loop of 64 MiB; each after ``os.sync()``."""
    dest = os.path.join(folder, "copy.data")
    os.sync()
    t = time.perf_counter()
    shutil.copyfile(data, dest)
    kernel = time.perf_counter() - t
    os.remove(dest)
    os.sync()
    t = time.perf_counter()
    shutil.copyfile(data, dest)
    fd = os.open(dest, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    synced = time.perf_counter() - t  # "copyfile + fsync"
    os.remove(dest)
    os.sync()
    t = time.perf_counter()
    with open(data, "rb") as f, open(dest, "wb") as g:
        while chunk := f.read(64 << 20):
            g.write(chunk)
    loop = time.perf_counter() - t
    os.remove(dest)
    return kernel, synced, loop


def split_bytes(src: str, out: str) -> tuple[int, int]:
    """Bytes of ``out``'s external data that the fold wrote new (a tensor whose bytes differ from the input's
    tensor of that name) and that it copied unchanged."""

    def tensors(path: str) -> dict[str, bytes]:
        model = onnx.load(path, load_external_data=False)
        found = {}
        with open(os.path.join(os.path.dirname(path), os.path.basename(path) + ".data"), "rb") as f:
            for t in model.graph.initializer:
                info = {e.key: e.value for e in t.external_data}
                if "offset" in info:
                    f.seek(int(info["offset"]))
                    found[t.name] = f.read(int(info["length"]))
        return found

    before, after = tensors(src), tensors(out)
    same = sum(len(b) for name, b in after.items() if before.get(name) == b)
    return sum(len(b) for b in after.values()) - same, same


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
    ap.add_argument("--rounds", type=int, default=2, help="rounds, each command once per round, interleaved")
    ap.add_argument("--before", metavar="SRC", help="another bnfold's src folder: its streamed fold, interleaved")
    ap.add_argument("--fp16-range", action="store_true", help="also both folds with --fp16-range (2 batches)")
    ap.add_argument("--plain-once", action="store_true", help="the plain folds in the first round only (slow)")
    ap.add_argument("--save", action="store_true", help="write the table to benchmarks/results/onnx_stream.md")
    a = ap.parse_args(argv)
    load = os.getloadavg()[0]
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    src = os.path.join(a.dir, "big.onnx")
    info = build(src, a.mb)
    data = src + ".data"
    weights = os.path.getsize(data)
    graph = os.path.getsize(src)
    tiny = os.path.join(a.dir, "tiny", "tiny.onnx")  # the same code on 64 KiB tensors: the floor of the peak
    os.makedirs(os.path.dirname(tiny))
    onnx.save(linear_stack(2, 128), tiny, save_as_external_data=True, location="tiny.onnx.data", size_threshold=0)
    # the floor with this graph: the same nodes and small tensors, the large tensors cut to 64 KiB (what the graph
    # costs in memory, with one 64 KiB tensor in hand where the model has one of the largest size)
    graph_path = os.path.join(a.dir, "graph", "graph.onnx")
    os.makedirs(os.path.dirname(graph_path))
    small, cut = info.pop("small"), info["cut"]
    onnx.save(small, graph_path, save_as_external_data=True, location="graph.onnx.data")
    # --fp16-range's floor: the same layers of 64 KiB tensors, a model that runs on inputs.npz (the cut one cannot)
    range_graph = os.path.join(a.dir, "rgraph", "graph.onnx")
    if a.fp16_range:
        os.makedirs(os.path.dirname(range_graph))
        model = linear_stack(info["layers"], 128, channels=8, size=16)
        onnx.save(model, range_graph, save_as_external_data=True, location="graph.onnx.data")
    # (name, src folder, extra arguments, the run whose files it must equal)
    runs = [("plain", "src", [], 0), ("streamed (--low-memory)", "src", ["--low-memory"], 0)]
    if a.before:
        runs.append(("streamed, before", a.before, ["--low-memory"], 0))
    if a.fp16_range:
        inputs = os.path.join(a.dir, "inputs.npz")
        x = np.random.default_rng(0).standard_normal((2, 1, 3, 16, 16)).astype(np.float32) * 1e4
        np.savez(inputs, x=x)
        ranged = ["--fp16-range", inputs]
        first = len(runs)
        runs += [
            ("plain --fp16-range", "src", ranged, first),
            ("streamed --fp16-range", "src", [*ranged, "--low-memory"], first),
        ]
        if a.before:
            runs.append(("streamed --fp16-range, before", a.before, [*ranged, "--low-memory"], first))
    times: dict[str, list[float]] = {name: [] for name, *_ in runs}
    peaks: dict[str, list[int]] = {name: [] for name, *_ in runs}
    kernel, synced, loop, imports, floor, graph_floor, range_floor = [], [], [], [], [], [], []
    for round_ in range(a.rounds):
        k, ks, lp = copies(data, a.dir)
        kernel.append(k)
        synced.append(ks)
        loop.append(lp)
        imports.append(import_time())
        for path, into in ((tiny, floor), (graph_path, graph_floor)):
            out = os.path.join(os.path.dirname(path), "out.onnx")
            into.append(measure(["fold", path, "-o", out, "-q", "--force", "--low-memory"]))
        if a.fp16_range:
            out = os.path.join(os.path.dirname(range_graph), "out.onnx")
            range_floor.append(measure(["fold", range_graph, "-o", out, "-q", "--force", *ranged, "--low-memory"]))
        for i, (name, code, extra, _) in enumerate(runs):
            if round_ and a.plain_once and "--low-memory" not in extra:
                continue
            folder = os.path.join(a.dir, f"out{i}")
            shutil.rmtree(folder, ignore_errors=True)  # the last round's output goes untimed, as the copies' do
            os.makedirs(folder)
            dt, hwm = measure(["fold", src, "-o", os.path.join(folder, "out.onnx"), "--force", "-q", *extra], code)
            times[name].append(dt)
            peaks[name].append(hwm)
    same = all(
        _same(os.path.join(a.dir, f"out{ref}", f), os.path.join(a.dir, f"out{i}", f))
        for i, (*_, ref) in enumerate(runs)
        for f in ("out.onnx", "out.onnx.data")
    )
    mb = 2**20
    copy_s, synced_s, loop_s = statistics.median(kernel), statistics.median(synced), statistics.median(loop)
    new, kept = split_bytes(src, os.path.join(a.dir, "out1", "out.onnx"))
    over0, floor_s = max(hwm for _, hwm in floor), statistics.median(t for t, _ in floor)
    over_g = max(hwm for _, hwm in graph_floor)
    over_r = max((hwm for _, hwm in range_floor), default=over_g)
    lines = [
        f"weights {weights / mb:.0f} MB in {info['layers'] + 2} layers, largest tensor {info['largest'] / mb:.1f} MB, "
        f"graph file {graph / 1024:.0f} KB. The floor, the streamed fold of a 2-layer model of 64 KiB tensors "
        f"(interpreter, imports, code): peak {over0 / mb:.0f} MB, {floor_s:.2f} s; with this graph (the same "
        f"nodes and small tensors, its {cut} tensors over 64 KiB cut to their first 64 KiB of rows): {over_g / mb:.1f} "
        f"MB"
        + (
            f"; for the --fp16-range rows, the same layers of 64 KiB tensors folded with --fp16-range: "
            f"{over_r / mb:.1f} MB"
            if range_floor
            else ""
        )
        + ". Importing onnx (not in the "
        f"times): {statistics.median(imports):.2f} s. Copy of the data: shutil.copyfile {copy_s:.2f} s, "
        f"then fsync {synced_s:.2f} s, a read/write loop {loop_s:.2f} s (each after os.sync()). The streamed fold's "
        f"data file: {new / mb:.0f} MB folded (written new), {kept / mb:.0f} MB copied unchanged. Medians of "
        f"{a.rounds} rounds{' (the plain folds: 1)' if a.plain_once else ''}, load {load:.1f} -> "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs.",
        "",
        "| fold | peak RSS (MB) | peak - floor (MB) | / weights | / largest tensor | peak - floor with this graph "
        "(MB) | / largest tensor | time (s) | / copyfile | / copyfile + fsync | / loop |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, _, extra, _ in runs:
        hwm, dt = statistics.median(peaks[name]), statistics.median(times[name])
        over, over_graph = hwm - over0, hwm - (over_r if "--fp16-range" in extra else over_g)
        lines.append(
            f"| {name} | {hwm / mb:.0f} | {over / mb:.0f} | {over / weights:.2f} | {over / info['largest']:.2f} "
            f"| {over_graph / mb:.1f} | {over_graph / info['largest']:.2f} "
            f"| {dt:.2f} | {dt / copy_s:.1f} | {dt / synced_s:.1f} | {dt / loop_s:.1f} |"
        )
    lines += [
        "| goal: streamed | | <= largest tensor + graph | | | | <= 1 | | <= 1.5 | | |",
        "",
        f"outputs byte-identical (streamed to plain, each with the same options): {same}",
    ]
    text = "\n".join(lines)
    print(text)
    if a.save:
        from common import write_text

        print(f"wrote {write_text('onnx_stream', text)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
