"""What a ``.pt2``'s JSON costs its load, and the bound on it: the JSON values of real programs against their budget,
and crafted files whose JSON holds more, refused before anything parses them.

    .venv/bin/python benchmarks/pt2_metadata.py [--dims 16000,64000,128000] [--rounds 2] [--bomb-mib 250] [--no-real]

1. Real programs (``--no-real`` leaves them out): torchvision's and timm's (``tests/library_models.py``; a timm ViT
   made here) and Llama-shaped ones (``benchmarks/fold_memory.py``'s; their JSON does not depend on the hidden size),
   exported and saved: the JSON values of the archive (``bnfold.io.limits.json_values``), per node of the graph, the
   values their file may hold (``bnfold.io.budget.json_values_allowed``) and the margin, and the time of ``load_pt2``.
2. Crafted stated dims: a small program (``x * w + 1``) whose graph states extra tensor values (a size and a stride
   per dim; no node uses them), made with ``tests/security/crafted.py``'s ``with_stated_dims``: either one value of
   ``N`` dims, or ``N / 64`` values of 64 dims each.  Timed: bnfold's refusal (default budget), then, under
   ``--max-work 1TiB``, bnfold's checks of the archive (``check_pt2_bytes``) and ``torch.export.load`` of the same
   bytes, the least of the rounds (round robin in ONE process); the peak RSS a whole ``load_pt2`` adds under that
   override, in a fresh process per file (after a load of the small program).
3. The zip bomb of JSON: a program JSON of ``--bomb-mib`` MiB of stated dims (under the 256 MiB a small file may
   unpack to), deflated just under the 200-fold the archive check allows (random text in a node's ``stack_trace``
   keeps it from deflating more): the time and the peak RSS of its refusal, in a fresh process.

Prints tables; asserts nothing.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "security"))

from common import load_now, quiet, table  # noqa: E402

#: the rank a tensor would be capped at
CAP = 64
#: the override the crafted files' loads are measured under
MAX_WORK = 1 << 40
#: library programs: tests/library_models.py's names
LIBRARY = ("tv:resnet18", "tv:mobilenet_v3_large", "tv:convnext_tiny", "tv:densenet121", "timm:efficientnet_b0")
#: Llama-shaped programs: (layers, hidden)
LLAMAS = ((16, 64), (32, 64), (80, 64))


def _program(folder: Path) -> Path:
    import torch

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(4))

        def forward(self, x):
            return x * self.w + 1

    path = folder / "base.pt2"
    torch.export.save(torch.export.export(Scaled().eval(), (torch.ones(2, 4),)), str(path))
    return path


def _held(data: bytes) -> int:
    """The JSON values of the archive ``data``, as bnfold counts them."""
    from bnfold.io.limits import json_values

    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return sum(json_values(z.read(n)) for n in z.namelist() if n.endswith(".json"))


def _rss_mib() -> float:
    """This process's peak RSS (``VmHWM``: ``ru_maxrss`` would start at the parent's, kept across fork and exec)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def _child(base: Path, path: Path, max_work: int = 0) -> tuple[float, float, str]:
    """(MiB of peak RSS, seconds) that loading ``path`` adds in a fresh process that loaded ``base`` first, and how
    it ended (``loaded`` or the refusal)."""
    cmd = [sys.executable, __file__, "--rss-of", str(path), "--base", str(base), "--max-work", str(max_work)]
    out = subprocess.run(cmd, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    rss, seconds, how = out.split(" ", 2)
    return float(rss), float(seconds), how


def _run_child(args) -> None:
    from bnfold.errors import BnfoldError
    from bnfold.io.budget import max_work
    from bnfold.io.pt2 import load_pt2

    load_pt2(args.base)
    before = _rss_mib()
    t = time.perf_counter()
    try:
        with max_work(args.max_work or None):
            load_pt2(args.rss_of)
        how = "loaded"
    except BnfoldError as e:
        how = str(e)
    print(f"{_rss_mib() - before:.0f} {time.perf_counter() - t:.3f} {how}")


def _real(folder: Path) -> list[list]:
    """Section 1's rows."""
    import torch
    from fold_memory import llama

    import library_models
    from bnfold.io.budget import json_values_allowed
    from bnfold.io.pt2 import load_pt2

    made = []
    for name in LIBRARY:
        spec = library_models.MODELS[name]
        torch.manual_seed(0)
        made.append((name, spec.make(), (torch.randn(spec.shape),)))
    timm = library_models.import_timm()
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64)
    made.append(("timm:vit_tiny_patch16_224", vit, (torch.randn(1, 3, 64, 64),)))
    for layers, hidden in LLAMAS:
        made.append((f"Llama-shaped {layers} x {hidden}", *llama(layers, hidden)))
    rows = []
    for name, model, args in made:
        path = folder / "real.pt2"
        ep = torch.export.export(model.eval(), args)
        nodes = sum(1 for n in ep.graph.nodes if n.op == "call_function")
        torch.export.save(ep, str(path))
        data = path.read_bytes()
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            json_mb = sum(i.file_size for i in z.infolist() if i.filename.endswith(".json")) / 1e6
        held, allowed = _held(data), json_values_allowed(len(data))
        t = time.perf_counter()
        load_pt2(path)
        seconds = time.perf_counter() - t
        rows.append(
            [name, f"{len(data) / 1e6:.1f}", f"{json_mb:.2f}", nodes, f"{held:,}", f"{held / nodes:.0f}"]
            + [f"{allowed:,}", f"{allowed / held:.1f}x", f"{seconds:.2f}"]
        )
        del model, ep
    return rows


def _crafted(folder: Path, base: Path, dims: list[int], rounds: int) -> list[list]:
    """Section 2's rows."""
    import crafted
    import torch

    from bnfold.errors import BnfoldError
    from bnfold.io.budget import max_work
    from bnfold.io.pt2.inspection import check_pt2_bytes

    files = {}
    for n in dims:
        files[(n, "one tensor")] = crafted.with_stated_dims(base, folder / f"one_{n}.pt2", n, 1)
        files[(n, f"{n // CAP} of {CAP}")] = crafted.with_stated_dims(base, folder / f"cap_{n}.pt2", CAP, n // CAP)
    best: dict = {}
    for _ in range(rounds):
        for key, path in files.items():
            data = path.read_bytes()
            t = time.perf_counter()
            try:
                check_pt2_bytes(data, str(path))
                refused = None
            except BnfoldError:
                refused = time.perf_counter() - t
            with max_work(MAX_WORK):
                t = time.perf_counter()
                check_pt2_bytes(data, str(path))
                checked = time.perf_counter() - t
            t = time.perf_counter()
            torch.export.load(str(path))
            loaded = time.perf_counter() - t
            old = best.get(key, (float("inf"), float("inf"), float("inf")))
            best[key] = (min(old[0], refused or float("inf")), min(old[1], checked), min(old[2], loaded))
    rows = []
    for (n, how), (refused, checked, loaded) in best.items():
        data = files[(n, how)].read_bytes()
        us = 1e6 * (checked + loaded) / n
        rss, _, _ = _child(base, files[(n, how)], MAX_WORK)
        refusal = "loads" if refused == float("inf") else f"{1e3 * refused:.0f} ms"
        rows.append(
            [n, how, f"{len(data) / 1e6:.2f}", f"{_held(data):,}", refusal, f"{checked:.2f}", f"{loaded:.2f}"]
            + [f"{us:.0f}", f"{rss:.0f}"]
        )
    return rows


def _bomb(folder: Path, base: Path, mib: int) -> tuple[Path, int, int]:
    """A copy of ``base`` whose program JSON is about ``mib`` MiB of stated dims, deflated just under 200-fold: the
    path, the JSON's bytes and its values."""
    import zlib

    import crafted

    entries = crafted.read_entries(base)
    name = f"{crafted.root_of(entries)}/models/model.json"
    doc = json.loads(entries[name])
    stated = doc["graph_module"]["graph"]["tensor_values"]
    stated["extra"] = dict(next(iter(stated.values())), sizes="@DIMS@", strides="@DIMS@")
    dim = b'{"as_int": 1}'
    dims = (mib << 20) // (2 * (len(dim) + 2))
    seq = b"[" + b", ".join([dim] * dims) + b"]"
    packed = len(zlib.compress(seq * 2, 6))
    # random bytes in base64 deflate back to about their own size: enough of them bring the entry to 195-fold
    noise = max(0, int(2 * len(seq) / 195 - packed))
    doc["graph_module"]["graph"]["nodes"][0]["metadata"]["stack_trace"] = base64.b64encode(os.urandom(noise)).decode()
    raw = json.dumps(doc).encode().replace(b'"@DIMS@"', seq)
    del seq
    entries[name] = raw
    path = crafted.write_entries(folder / "bomb.pt2", entries, deflate=(name,))
    return path, len(raw), _held(path.read_bytes())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dims", default="16000,64000,128000", help="dims in all, comma-separated")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--bomb-mib", type=int, default=250, help="the deflated program JSON's size (0: none)")
    ap.add_argument("--no-real", action="store_true", help="leave out the real programs")
    ap.add_argument("--rss-of", help=argparse.SUPPRESS)  # the child of _child
    ap.add_argument("--base", help=argparse.SUPPRESS)
    ap.add_argument("--max-work", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    quiet()
    if args.rss_of:
        _run_child(args)
        return
    from bnfold.io.pt2 import load_pt2

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        base = _program(folder)
        load_pt2(base)  # torch's op tables and the allowlist, built once
        if not args.no_real:
            heads = ["program", "file MB", "JSON MB", "nodes", "JSON values", "per node", "allowed", "margin"]
            print(table([*heads, "load_pt2 s"], _real(folder), "lrrrrrrrr"), end="\n\n")
        rows = _crafted(folder, base, [int(d) for d in args.dims.split(",")], args.rounds)
        heads = ["dims", "as", "file MB", "JSON values", "refused in", "bnfold checks s", "torch.export.load s"]
        print(table([*heads, "us per dim", "load's peak RSS MiB"], rows, "rlrrrrrrr"))
        print(f"(checks, load and RSS under --max-work {MAX_WORK >> 40}TiB; least of {args.rounds} rounds)")
        if args.bomb_mib:
            path, size, held = _bomb(folder, base, args.bomb_mib)
            rss, seconds, how = _child(base, path)
            print(
                f"\n{size / 2**20:.0f} MiB of program JSON ({held:,} values) in a {path.stat().st_size / 1e6:.2f} MB "
                f"file: {how!r} in {seconds:.2f} s, {rss:.0f} MiB of peak RSS added"
            )
    print(f"\nload {load_now()}")


if __name__ == "__main__":
    main()
