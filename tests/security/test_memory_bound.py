"""The security tests' memory bound measures what is resident (RSS), read by the parent, not the address space:
a CUDA build of torch maps gigabytes it never touches (an address-space cap of 2.5 GiB failed its import with
"libtorch_cpu.so: failed to map segment"), and the bound still stops a process that fills memory."""

from __future__ import annotations

import sys

import crafted as c

MIB = 1 << 20


def _python(code: str, limit: int, **kw):
    return c.run_resident_bounded([sys.executable, "-c", code], limit, timeout=120, **kw)


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
