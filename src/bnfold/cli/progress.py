"""Progress notes on stderr while a long command runs, in one format: ``bnfold: <what> [<seconds> s]``.

* :class:`Progress`: the ``audit``'s stages (``stage("load")``), batches (the ``progress(done, total)`` callback of
  :func:`bnfold.numerics.audit`) and nodes within a batch.
* :class:`Heartbeat`: work that tells nothing of its own (``fold`` / ``check`` folding): the elapsed time, the first
  note after :data:`PROGRESS_DELAY` seconds, then one every :data:`PROGRESS_EVERY` seconds (each second on a
  terminal).

On a terminal one line is redrawn (and ended when the work ends); when stderr is a file or a pipe (CI logs) each note
is a line of its own, at most one every ``every`` seconds, the first after ``every`` seconds (a short run prints
nothing), and a closing one once any was printed.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Any, TextIO

PROGRESS_DELAY = 3.0
PROGRESS_EVERY = 10.0


class Progress:
    """Notes on ``stream`` (stderr) headed ``label`` and the current stage; ``enabled=False`` prints nothing."""

    def __init__(
        self,
        enabled: bool = True,
        stream: TextIO | None = None,
        tty: bool | None = None,
        every: float = PROGRESS_EVERY,
        label: str = "audit",
    ):
        self.stream = stream or sys.stderr
        self.enabled = enabled and self.stream is not None  # None: Python started with stderr closed (2>&-)
        self.tty = isatty(self.stream) if tty is None else tty
        self.every = every
        self.label = label
        self.current = ""
        self._t0 = self._last = time.monotonic()
        self._open = False  # a terminal line is being redrawn
        self._printed = False

    def _head(self) -> str:
        return f"{self.label}: {self.current}" if self.current else self.label

    def _write(self, text: str, final: bool) -> None:
        """The note ``text`` in the one format; ``final``: a line of its own (else redrawn on a terminal)."""
        line = f"bnfold: {text} [{time.monotonic() - self._t0:.0f} s]"
        with contextlib.suppress(OSError, ValueError):  # a closed or gone stderr: no note, the work goes on
            if self.tty:
                self.stream.write(f"\r\x1b[K{line}" + ("\n" if final else ""))
                self._open = not final
            else:
                self.stream.write(line + "\n")
            self.stream.flush()

    def _due(self, final: bool = False) -> bool:
        """Whether to print now: always on a terminal; elsewhere every ``every`` seconds (and a final
        line once anything was printed)."""
        if not self.enabled:
            return False
        if self.tty:
            return True
        now = time.monotonic()
        if (final and self._printed) or now - self._last >= self.every:
            self._last, self._printed = now, True
            return True
        return False

    def stage(self, name: str) -> None:
        """A new stage begins (``load``, ``fold``, ``emulate unfolded``, ...)."""
        self.current = name
        if self._due():
            self._write(f"{self._head()} ...", final=not self.tty)

    def node(self, index: int, total: int) -> None:
        """Within a batch: node ``index`` of ``total``; shown at most every 0.5 s on a terminal (every
        ``every`` seconds elsewhere), so a long batch still shows it is moving."""
        now = time.monotonic()
        if (self.tty and now - self._last < 0.5) or not self._due():
            return
        self._last = now
        self._write(f"{self._head()}: node {index + 1}/{total} of the batch", final=not self.tty)

    def __call__(self, done: int, total: int) -> None:
        last = done >= total
        if not self._due(final=last):
            return
        width = 24
        filled = int(width * done / total) if total else width
        bar = "#" * filled + "-" * (width - filled)
        self._write(f"{self._head()} [{bar}] {done}/{total} batches", final=last)

    def tick(self) -> None:
        """The elapsed time now, whenever the caller (a :class:`Heartbeat`) says."""
        if self.enabled:
            self._write(f"{self._head()} ...", final=not self.tty)

    def close(self) -> None:
        if self.enabled and self._open:
            with contextlib.suppress(OSError, ValueError):
                self.stream.write("\n")
                self.stream.flush()
            self._open = False


class Heartbeat:
    """``with Heartbeat("folding m.pt2"):`` nothing for :data:`PROGRESS_DELAY` seconds, then the elapsed time every
    :data:`PROGRESS_EVERY` seconds (each second, one line redrawn, on a terminal), from a thread of its own."""

    def __init__(self, what: str, stream: TextIO | None = None):
        self.progress = Progress(stream=stream, label=what)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.done.set()
        self.thread.join()
        self.progress.close()

    def _run(self) -> None:
        wait = PROGRESS_DELAY
        while not self.done.wait(wait):
            self.progress.tick()
            wait = 1.0 if self.progress.tty else PROGRESS_EVERY


def isatty(stream: Any) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
