"""Progress of long audits on stderr: a bar on a terminal, periodic lines anywhere else.

``Progress`` is the ``progress`` callback of :func:`bnfold.numerics.audit`
(``progress(done, total)``) and also takes named stages (``stage("load")``),
so loading and folding show too.  On a terminal it redraws one line; when
stderr is a file or a pipe (CI logs) it prints at most one line every
``every`` seconds (the first after ``every`` seconds: a short run prints
nothing), and a closing line once it has printed any.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Stage and batch progress for ``bnfold audit``; ``enabled=False`` prints nothing."""

    def __init__(
        self,
        enabled: bool = True,
        stream: TextIO | None = None,
        tty: bool | None = None,
        every: float = 10.0,
        label: str = "audit",
    ):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = self.stream.isatty() if tty is None else tty
        self.every = every
        self.label = label
        self.current = ""
        self._t0 = self._last = time.monotonic()
        self._open = False  # a terminal line is being redrawn
        self._printed = False

    def _head(self) -> str:
        return f"{self.label}: {self.current}" if self.current else f"{self.label}:"

    def _elapsed(self) -> str:
        return f"{time.monotonic() - self._t0:.0f}s"

    def _write(self, text: str, final: bool) -> None:
        if self.tty:
            self.stream.write(f"\r\x1b[K{text}" + ("\n" if final else ""))
            self._open = not final
        else:
            self.stream.write(text + "\n")
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
            self._write(f"{self.label}: {name} ... [{self._elapsed()}]", final=not self.tty)

    def node(self, index: int, total: int) -> None:
        """Within a batch: node ``index`` of ``total``; shown at most every 0.5 s on a terminal (every
        ``every`` seconds elsewhere), so a long batch still shows it is moving."""
        now = time.monotonic()
        if (self.tty and now - self._last < 0.5) or not self._due():
            return
        self._last = now
        self._write(f"{self._head()}: node {index + 1}/{total} of the batch [{self._elapsed()}]", final=not self.tty)

    def __call__(self, done: int, total: int) -> None:
        last = done >= total
        if not self._due(final=last):
            return
        width = 24
        filled = int(width * done / total) if total else width
        bar = "#" * filled + "-" * (width - filled)
        self._write(f"{self._head()} [{bar}] {done}/{total} batches [{self._elapsed()}]", final=last)

    def close(self) -> None:
        if self.enabled and self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False
