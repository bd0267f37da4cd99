"""Notes on stderr while a long fold runs (``bnfold fold`` / ``check``)."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Any

#: The first note after PROGRESS_DELAY seconds, then one every PROGRESS_EVERY seconds (a line each
#: when stderr is not a terminal, one updated line when it is).
PROGRESS_DELAY = 3.0
PROGRESS_EVERY = 10.0


class Heartbeat:
    """Nothing for ``PROGRESS_DELAY`` seconds, then the elapsed time every ``PROGRESS_EVERY`` seconds."""

    def __init__(self, what: str):
        self.what = what
        self.stream = sys.stderr
        self.tty = isatty(self.stream)
        self.done = threading.Event()
        self.wrote = False
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Heartbeat:
        self.start = time.monotonic()
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.done.set()
        self.thread.join()
        if self.wrote and self.tty:
            with contextlib.suppress(OSError, ValueError):
                self.stream.write("\n")
                self.stream.flush()

    def _run(self) -> None:
        wait = PROGRESS_DELAY
        while not self.done.wait(wait):
            elapsed = time.monotonic() - self.start
            text = f"bnfold: {self.what}... {elapsed:.0f} s"
            with contextlib.suppress(OSError, ValueError):
                self.stream.write(f"\r{text}" if self.tty else f"{text}\n")
                self.stream.flush()
            self.wrote = True
            wait = 1.0 if self.tty else PROGRESS_EVERY


def isatty(stream: Any) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
