"""The security tests' bounds on a child.  The memory bound measures what is resident (RSS), read by the parent,
not the address space: a CUDA build of torch maps gigabytes it never touches (an address-space cap of 2.5 GiB failed
its import with "libtorch_cpu.so: failed to map segment"), and the bound still stops a process that fills memory.
Its work is bounded by its CPU time (a loaded machine stretches the wall clock, not the CPU time); a hang, which may
use no CPU, by the wall clock: no CPU time used for a while, or far longer than the CPU limit in all."""

from __future__ import annotations

import signal
import sys

import crafted as c

MIB = 1 << 20


def _python(code: str, limit: int, **kw):
    return c.run_resident_bounded([sys.executable, "-c", code], limit, **kw)


def test_address_space_that_is_never_touched_is_allowed():
    """8 GiB mapped and untouched (what a CUDA build's libraries look like to RLIMIT_AS) runs under the limits."""
    code = "import mmap; m = mmap.mmap(-1, 8 << 30, prot=mmap.PROT_READ); print('mapped', len(m))"
    proc = _python(code, c.MEMORY_LIMIT, preexec_fn=c._limits(None))
    assert proc.returncode == 0 and not proc.over_rss, proc.stderr
    assert proc.stdout.strip() == f"mapped {8 << 30}"


def test_the_bound_stops_a_process_that_fills_memory():
    """Touching 2 GiB page by page under a 256 MiB bound: killed before it gets far past the bound."""
    code = "import numpy as np; a = np.ones(2 << 30, dtype=np.uint8); print('survived', a.sum())"
    proc = _python(code, 256 * MIB)
    assert proc.over_rss and proc.returncode != 0 and "survived" not in proc.stdout
    assert 256 * MIB < proc.peak_rss < 1024 * MIB  # read often enough to stop it well before 2 GiB


def test_a_run_under_the_bound_is_left_alone():
    proc = _python("import numpy as np; a = np.ones(64 << 20, dtype=np.uint8); print(int(a.sum()))", 512 * MIB)
    assert proc.returncode == 0 and not proc.over_rss and proc.stdout.strip() == str(64 << 20)


def test_a_child_that_computes_forever_is_stopped_by_its_cpu_time():
    proc = _python("while True: pass", c.MEMORY_LIMIT, preexec_fn=c._limits(None, cpu=1))
    assert proc.returncode == -signal.SIGXCPU and not proc.hung and not proc.over_rss
    assert c.died(proc.returncode) == f"{-signal.SIGXCPU} (SIGXCPU)"


def test_a_child_that_waits_forever_is_killed_as_hung():
    proc = _python("import time; time.sleep(600)", c.MEMORY_LIMIT, stall=2)
    assert proc.hung == "no CPU time used for 2 s" and proc.returncode == -signal.SIGKILL  # not the wall limit's


def test_a_child_that_keeps_working_slowly_is_left_alone_until_the_wall_limit():
    """A child using a little CPU time now and then (a loaded machine's share) is not taken for a hung one; the
    wall limit still ends a hang that keeps polling."""
    slow = (
        "import time\nfor _ in range(5):\n    t = time.process_time() + 0.05\n"
        "    while time.process_time() < t: pass\n    time.sleep(0.5)\nprint('done')"
    )
    proc = _python(slow, c.MEMORY_LIMIT, stall=3)
    assert proc.returncode == 0 and not proc.hung and proc.stdout.strip() == "done", (proc.hung, proc.stderr)
    proc = _python(slow, c.MEMORY_LIMIT, stall=3, timeout=2)
    assert proc.hung == "still running after 2 s" and proc.returncode == -signal.SIGKILL and "done" not in proc.stdout
