"""``bnfold`` run as a command in a fresh process, for the range tests' command-line cases."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import bnfold


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m bnfold ARGS`` in ``cwd`` with this checkout's ``bnfold``: its exit code, stdout and stderr."""
    src = str(Path(bnfold.__file__).parent.parent)
    return subprocess.run(
        [sys.executable, "-m", "bnfold", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"},
        timeout=600,
    )
