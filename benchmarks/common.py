"""Shared helpers for the benchmarks: timing, machine description, tables, JSON results.

Nothing here asserts on a time.  Timings are medians of repeated runs; when
several things are compared they are run in alternation (round robin: A B C
A B C ...) so that drift in machine load hits every variant alike, and ratios
are reported as the median of the per-round ratios.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def quiet() -> None:
    """Silence the deprecation chatter torch / executorch / torchao print on import and lowering."""
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    import logging

    for name in ("torch", "torch._export", "torch.export", "executorch", "torchao", "root"):
        logging.getLogger(name).setLevel(logging.ERROR)


def median(xs):
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.median(xs) if xs else math.nan


def percentile(values, q: float) -> float:
    values = sorted(values)
    if not values:
        return math.nan
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def round_robin(
    fns: dict[str, Callable[[], float]], rounds: int, budget_s: float | None = None, min_rounds: int = 1
) -> dict[str, list[float]]:
    """Call every ``fn`` once per round, in order, for ``rounds`` rounds (fewer when ``budget_s``
    runs out, but at least ``min_rounds``).  Each ``fn`` returns the seconds it measured itself
    (so set-up work such as copying the input stays out of the time)."""
    times = {k: [] for k in fns}
    start = time.perf_counter()
    for r in range(rounds):
        for k, fn in fns.items():
            times[k].append(fn())
        if budget_s is not None and r + 1 >= min_rounds and time.perf_counter() - start > budget_s:
            break
    return times


def paired_ratio(num: list[float], den: list[float]) -> float:
    """Median over rounds of num[i] / den[i] (both measured in the same round)."""
    return median([a / b for a, b in zip(num, den) if b])


# -- machine --------------------------------------------------------------------------------------


def machine() -> dict:
    info = {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads_default"] = torch.get_num_threads()
    except Exception as e:  # pragma: no cover
        info["torch"] = f"unavailable ({e})"
    try:
        from importlib.metadata import version

        info["executorch"] = version("executorch")
    except Exception:
        info["executorch"] = "not installed"
    try:
        import bnfold

        info["bnfold"] = bnfold.__version__
    except Exception:
        pass
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        keep = (
            "Architecture",
            "Model name",
            "CPU(s)",
            "Thread(s) per core",
            "Core(s) per socket",
            "Socket(s)",
            "CPU max MHz",
            "L1d cache",
            "L2 cache",
            "L3 cache",
            "Hypervisor vendor",
            "Flags",
        )
        rows = {}
        for line in out.splitlines():
            k, _, v = line.partition(":")
            if k.strip() in keep:
                v = v.strip()
                if k.strip() == "Flags":
                    v = " ".join(f for f in v.split() if f.startswith(("avx", "fma", "f16c", "amx")))
                rows[k.strip()] = v
        info["lscpu"] = rows
    except Exception:
        info["lscpu"] = {}
    try:  # read-only: which commit the numbers belong to (the working tree may differ)
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, cwd=HERE)
        info["git_head"] = out.stdout.strip() or None
    except Exception:
        info["git_head"] = None
    try:
        info["loadavg_start"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    return info


def load_now() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# -- output ---------------------------------------------------------------------------------------


def table(headers: list[str], rows: list[list], align: str | None = None) -> str:
    """A GitHub-markdown table (also readable in a terminal)."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    align = align or "l" + "r" * (len(headers) - 1)

    def fmt(r):
        return "| " + " | ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(r, widths, align)) + " |"

    sep = (
        "|"
        + "|".join(("-" * (w + 1) + ":") if a == "r" else (":" + "-" * (w + 1)) for w, a in zip(widths, align))
        + "|"
    )
    return "\n".join([fmt(headers), sep, *(fmt(r) for r in cells)])


def fmt_s(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.{digits}f}" if x >= 0.01 else f"{x:.2g}"


def fmt_x(x: float | None, digits: int = 2) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}x"


def fmt_pct(x: float | None, digits: int = 1) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.{digits}f}%"


def fmt_db(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if math.isinf(x):
        return "inf"
    return f"{x:.1f}"


def _json_safe(x):
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return x
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def write_json(name: str, doc: dict, out_dir: Path | None = None) -> Path:
    out_dir = Path(out_dir or RESULTS)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(_json_safe(doc), indent=1) + "\n")
    return path


def write_text(name: str, text: str, out_dir: Path | None = None) -> Path:
    out_dir = Path(out_dir or RESULTS)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.md"
    path.write_text(text + "\n")
    return path


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def batch_norm_nodes(program) -> int:
    """The batch norm nodes of an ExportedProgram or GraphModule (ATen or edge dialect), as the torch.export
    frontend's op table reads them (``bnfold.torch_export.ops.OPS``): the benchmarks count what bnfold folds."""
    from bnfold.torch_export.ops import op_of

    return sum(1 for n in program.graph.nodes if (row := op_of(n)) is not None and row.kind == "batch_norm")
