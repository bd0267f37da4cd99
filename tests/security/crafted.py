"""Crafted model files for the security tests, and a runner that feeds them to bnfold in a
subprocess under a memory, CPU-time and wall-clock limit.

Every builder writes a file that an attacker could send; the payloads leave a
marker file (``PWNED``) in the working folder, or mutate ``collections.Counter``
(the runner turns that into the marker), when they run.
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from bnfold_testutil import onnx_conv_bn  # noqa: F401 (the crafted ONNX files start from it)

MARKER = "PWNED"
RUNNER = Path(__file__).with_name("runner.py")
MEMORY_LIMIT = 2560 << 20  # resident memory of the bnfold process (its RSS: a CUDA build of torch maps more
# address space than this before it runs anything, so an address-space cap would stop torch's import there)
#: what bounds the work: seconds of CPU time (RLIMIT_CPU, all threads of the process; SIGXCPU kills it past them).
#: A loaded machine stretches the wall clock, not the CPU time (of a child on one thread: ``run_bnfold``'s), so no
#: test limit is a wall-clock one but the two below.
CPU_LIMIT = 90
#: a child whose CPU time has not moved for this long waits on something that will not come: killed as hung
STALL_S = 120.0
#: the last resort, for a hang that keeps using a little CPU (a polling loop): ten times the CPU limit, so a child
#: that gets a tenth of a core (load 20 on two cores) still reaches its CPU limit first
WALL_LIMIT_S = 10 * CPU_LIMIT
RSS_POLL_S = 0.002  # how often the parent reads the child's resident memory
CPU_POLL_S = 1.0  # how often it reads the child's CPU time


# ----------------------------------------------------------------------------- models


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.conv(x))


class DictIO(nn.Module):
    """Dict and keyword inputs, dict / list / tuple outputs (the treespecs torch writes for them), a cast."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x, d, *, k):
        y = self.bn(self.conv((x + d["p"]).half().float()))  # a cast: export adds _assert_tensor_metadata
        return {"out": y, "extra": [y * 2, (k + 1,)]}


def export(path: Path, module: nn.Module, args, kwargs=None, dynamic_shapes=None) -> Path:
    ep = torch.export.export(module.eval(), args, kwargs, dynamic_shapes=dynamic_shapes)
    torch.export.save(ep, str(path))
    return path


# ----------------------------------------------------------------------------- archive editing


def read_entries(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        return {n: z.read(n) for n in z.namelist()}


def write_entries(path: Path, entries: dict[str, bytes], deflate: tuple[str, ...] = ()) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in entries.items():
            kind = zipfile.ZIP_DEFLATED if name in deflate else zipfile.ZIP_STORED
            z.writestr(zipfile.ZipInfo(name), data, compress_type=kind)
    return path


def root_of(entries: dict[str, bytes]) -> str:
    return next(iter(entries)).split("/", 1)[0]


def edit_program(src: Path, dst: Path, change: Callable[[dict], None]) -> Path:
    """Copy ``src`` to ``dst`` with ``change`` applied to the program JSON."""
    entries = read_entries(src)
    name = f"{root_of(entries)}/models/model.json"
    doc = json.loads(entries[name])
    change(doc)
    entries[name] = json.dumps(doc).encode()
    return write_entries(dst, entries)


def with_stated_dims(src: Path, dst: Path, dims: int, values: int = 1) -> Path:
    """``src`` whose graph states ``values`` extra tensor values (no node uses them) of ``dims`` dims each, a size
    and a stride per dim: what makes a program's JSON long (4 JSON values a dim) in a few bytes of ``.pt2`` each."""

    def change(doc: dict) -> None:
        stated = doc["graph_module"]["graph"]["tensor_values"]
        like = dict(next(iter(stated.values())), sizes=[{"as_int": 1}] * dims, strides=[{"as_int": 1}] * dims)
        stated.update((f"extra_{i}", like) for i in range(values))

    return edit_program(src, dst, change)


def signature(doc: dict) -> dict:
    return doc["graph_module"]["module_call_graph"][0]["signature"]


# ----------------------------------------------------------------------------- running bnfold


def _limits(fsize: int | None, cpu: int = CPU_LIMIT) -> Callable[[], None]:
    def apply() -> None:
        # past ``cpu`` seconds SIGXCPU ends it (its own exit status; no core: RLIMIT_CORE 0), SIGKILL a second later
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        if fsize is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return apply


def run_bnfold(
    cwd: Path, *argvs: list, fsize: int | None = None, control: list | None = None, recursion_limit: int = 0
) -> list[dict]:
    """Run ``bnfold.cli.main(argv)`` for each argv in one limited subprocess in ``cwd``.

    Returns ``{"code", "stderr", "marker"}`` per argv; ``marker`` lists the
    marker files (``PWNED*``) that existed after that command.  ``control`` lists files to
    load with plain ``torch.export.load`` afterwards (to show a payload is live).  ``recursion_limit``: the
    Python stack bnfold runs with (0: the usual).
    """
    job = {"argvs": [[str(a) for a in argv] for argv in argvs], "control": control or []}
    payload = json.dumps({**job, "recursion_limit": recursion_limit})
    # one intra-op thread: RLIMIT_CPU counts every thread's time, and threads that wait for a core on a loaded
    # machine spin and count (the same 20k small matmuls: 0.25 s of CPU on one thread, 1.39 s on two, at load 2.3)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")
    proc = run_resident_bounded(
        [sys.executable, str(RUNNER), payload], MEMORY_LIMIT, cwd=cwd, preexec_fn=_limits(fsize), env=env
    )
    assert not proc.over_rss, f"the runner passed {MEMORY_LIMIT >> 20} MiB resident: {proc.stderr[-3000:]}"
    assert not proc.hung, f"the runner hung ({proc.hung}): {proc.stderr[-3000:]}"
    assert proc.returncode == 0, f"the runner died ({died(proc.returncode)}): {proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def died(returncode: int) -> str:
    """A child's exit status, with the signal's name where a signal ended it (SIGXCPU: past its CPU time)."""
    return f"{returncode} ({signal.Signals(-returncode).name})" if returncode < 0 else str(returncode)


@dataclass
class Bounded:
    """A finished :func:`run_resident_bounded`: ``over_rss`` when it was killed for its resident memory, ``hung``
    (what it was killed for) when for a hang."""

    returncode: int
    stdout: str
    stderr: str
    over_rss: bool
    peak_rss: int
    hung: str | None = None


def resident_bytes(pid: int) -> int:
    """The resident memory of process ``pid`` (``/proc/PID/statm``), 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except (OSError, IndexError, ValueError):
        return 0


def cpu_ticks(pid: int) -> int | None:
    """The CPU time process ``pid`` has used, all its threads (user + system, ``/proc/PID/stat``), in clock ticks;
    None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()  # after the command name, which may hold spaces
        return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of proc(5)
    except (OSError, IndexError, ValueError):
        return None


def run_resident_bounded(
    cmd: list, limit: int, *, timeout: float = WALL_LIMIT_S, stall: float = STALL_S, **popen
) -> Bounded:
    """Run ``cmd`` and kill it as soon as its resident memory passes ``limit`` bytes (read every
    :data:`RSS_POLL_S` by a thread of this process, so the child's own GIL or a long C call cannot delay it).
    What is resident, not the address space: a CUDA build of torch maps gigabytes it never touches.

    Its time is bounded by its CPU time (``preexec_fn``, e.g. :func:`_limits`), which a loaded machine does not
    stretch; here only hangs are caught: no CPU time used for ``stall`` seconds, or ``timeout`` seconds in all."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    state: dict = {"over": False, "peak": 0, "hung": None}

    def watch() -> None:
        ticks, moved = None, time.monotonic()
        checked = moved
        while proc.poll() is None:
            rss = resident_bytes(proc.pid)
            state["peak"] = max(state["peak"], rss)
            if rss > limit:
                state["over"] = True
                proc.kill()
                return
            now = time.monotonic()
            if now - checked >= CPU_POLL_S:
                checked, used = now, cpu_ticks(proc.pid)
                if used != ticks:
                    ticks, moved = used, now
                elif now - moved > stall:
                    state["hung"] = f"no CPU time used for {stall:g} s"
                    proc.kill()
                    return
            time.sleep(RSS_POLL_S)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        state["hung"] = f"still running after {timeout:g} s"
        proc.kill()
        out, err = proc.communicate()
    finally:
        proc.kill()
        watcher.join()
    return Bounded(proc.returncode, out, err, state["over"], state["peak"], state["hung"])


def assert_case(runs: list, peak_mib: float) -> None:
    """Each ``(argv, expected, result)`` of one case: under ``peak_mib``; ``expected`` an exit code (and no
    traceback), or the words of a one-line refusal (:func:`assert_refused`)."""
    for argv, expected, r in runs:
        where = " ".join(map(str, argv))
        assert r["peak_mib"] < peak_mib, (where, r["peak_mib"])
        if isinstance(expected, int):
            assert r["code"] == expected, (where, r)
            assert "Traceback" not in r["stderr"] and "internal error" not in r["stderr"], (where, r["stderr"])
            continue
        try:
            assert_refused(r, *expected)
        except AssertionError as e:
            raise AssertionError(f"{where}: {e}") from None


#: the notes a run past a few seconds (a loaded machine's) prints on a stderr that is no terminal, in the one format of
#: ``bnfold.cli.progress`` (the fold's ``Heartbeat``, the audit's ``Progress``); not error lines
PROGRESS = re.compile(r"bnfold: (?!error: ).+ \[\d+ s\]")


def beyond_progress(stderr: str) -> list[str]:
    """``stderr``'s non-blank lines but the progress notes."""
    return [ln for ln in stderr.splitlines() if ln.strip() and not PROGRESS.fullmatch(ln)]


def assert_refused(result: dict, *words: str) -> str:
    """Exit 2, exactly one line on stderr (no traceback; progress notes aside) naming ``words``, and no marker."""
    assert result["code"] == 2, result
    lines = beyond_progress(result["stderr"])
    assert len(lines) == 1, result["stderr"]
    line = lines[0]
    assert line.startswith("bnfold: error: "), line
    for w in words:
        assert w in line, (w, line)
    assert not result["marker"], "the payload ran"
    return line


def selected(request, param: str = "case") -> list | None:
    """The values of ``param`` that this run selected (``-k``) in the requesting module; None: all of them.

    A module-scoped fixture that runs every case in one subprocess uses it to run only those."""
    picked = [
        item.callspec.params[param]
        for item in request.session.items
        if item.module is request.module and hasattr(item, "callspec") and param in item.callspec.params
    ]
    return picked or None


def listing(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


# ----------------------------------------------------------------------------- ONNX


def set_external(t, location: str, offset: int, length: int) -> None:
    """Make tensor ``t`` refer to ``length`` bytes at ``offset`` of ``location``."""
    from onnx import TensorProto

    t.ClearField("raw_data")
    t.ClearField("float_data")
    t.data_location = TensorProto.EXTERNAL
    del t.external_data[:]
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        e = t.external_data.add()
        e.key, e.value = k, v


def save_onnx(model, path: Path) -> Path:
    path.write_bytes(model.SerializeToString())
    return path
