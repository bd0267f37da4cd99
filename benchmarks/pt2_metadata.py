"""What a ``.pt2``'s stated tensor dims cost its load: one tensor of thousands of dims against the same dims in
tensors of 64 (a cap at 64 dims).

    .venv/bin/python benchmarks/pt2_metadata.py [--dims 16000,64000,128000] [--rounds 2]

Each file is a small program (``x * w + 1``) whose graph states extra tensor values (``tensor_values``, a size and
a stride per dim; no node uses them), crafted with ``tests/security/crafted.py``'s helpers: either one value of
``N`` dims, or ``N / 64`` values of 64 dims each (the same dims in all).  Timed: bnfold's checks of the archive
(``check_pt2_bytes``) and ``torch.export.load`` of the same bytes, the least of the rounds (round robin in ONE
process), and the load; the peak RSS a whole ``load_pt2`` adds, in a fresh process per file (after a load of the
small program).  Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "security"))

from common import load_now, quiet, table  # noqa: E402

#: the rank a tensor would be capped at
CAP = 64


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


def _craft(base: Path, dst: Path, dims: int, values: int) -> Path:
    """``base`` with ``values`` extra tensor values of ``dims`` dims each."""
    import crafted

    def change(doc: dict) -> None:
        stated = doc["graph_module"]["graph"]["tensor_values"]
        like = dict(stated["x"], sizes=[{"as_int": 1}] * dims, strides=[{"as_int": 1}] * dims)
        stated.update((f"extra_{i}", like) for i in range(values))

    return crafted.edit_program(base, dst, change)


def _rss_mib() -> float:
    """This process's peak RSS (``VmHWM``: ``ru_maxrss`` would start at the parent's, kept across fork and exec)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def _added_rss(base: Path, path: Path) -> float:
    """MiB of peak RSS that loading ``path`` adds in a fresh process that loaded ``base`` first."""
    out = subprocess.run(
        [sys.executable, __file__, "--rss-of", str(path), "--base", str(base)], capture_output=True, text=True
    )
    return float(out.stdout.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dims", default="16000,64000,128000", help="dims in all, comma-separated")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rss-of", help=argparse.SUPPRESS)  # the child of _added_rss
    ap.add_argument("--base", help=argparse.SUPPRESS)
    args = ap.parse_args()
    quiet()
    if args.rss_of:
        from bnfold.io.pt2 import load_pt2

        load_pt2(args.base)
        before = _rss_mib()
        load_pt2(args.rss_of)
        print(f"{_rss_mib() - before:.0f}")
        return
    import torch

    from bnfold.io.pt2 import load_pt2
    from bnfold.io.pt2.inspection import check_pt2_bytes

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        base = _program(folder)
        load_pt2(base)  # torch's op tables and the allowlist, built once
        files = {}
        for n in (int(d) for d in args.dims.split(",")):
            files[(n, "one tensor")] = _craft(base, folder / f"one_{n}.pt2", n, 1)
            files[(n, f"{n // CAP} of {CAP}")] = _craft(base, folder / f"cap_{n}.pt2", CAP, n // CAP)
        best: dict = {}
        for _ in range(args.rounds):
            for key, path in files.items():
                data = path.read_bytes()
                t = time.perf_counter()
                check_pt2_bytes(data, str(path))
                checked = time.perf_counter() - t
                t = time.perf_counter()
                torch.export.load(str(path))
                loaded = time.perf_counter() - t
                old = best.get(key, (float("inf"), float("inf")))
                best[key] = (min(old[0], checked), min(old[1], loaded))
        rows = []
        for (n, how), (checked, loaded) in best.items():
            size = files[(n, how)].stat().st_size
            us = 1e6 * (checked + loaded) / n
            rss = _added_rss(base, files[(n, how)])
            rows.append([n, how, f"{size / 1e6:.2f}", f"{checked:.2f}", f"{loaded:.2f}", f"{us:.0f}", f"{rss:.0f}"])
    heads = ["dims", "as", "file MB", "bnfold checks s", "torch.export.load s", "us per dim", "load's peak RSS MiB"]
    print(table(heads, rows, "rlrrrrr"))
    print(f"\nleast of {args.rounds} rounds; load {load_now()}")


if __name__ == "__main__":
    main()
