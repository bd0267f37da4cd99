"""The one atomic writer: every file bnfold writes goes through here.

A file is written to a temporary file in its destination folder
(``.<name>.<random>.tmp``).  When the writing block ends without error, the
temporary file is synced to disk, given the permissions of the file it
replaces (or the umask's default for a new file) and moved over the
destination with ``os.replace``; the folder is synced last.  On any error the
temporary files are removed and the destinations are left as they were.

* :func:`atomic_paths` stages several files that belong together (an ONNX
  model and its external data) and moves them in the order given, so a reader
  that finds the last one finds the others already in place.
* :func:`atomic_path` stages one file, for writers that want a path
  (matplotlib, a nested ``atomic_path`` for a report written with a model).
* :func:`write_bytes` / :func:`write_text` write through an open file.
* :func:`scratch_file` is working space that never becomes a file (the streamed ONNX fold's new
  parameters): unnamed, removed when closed.
* :func:`start_writeback` lets a writer of a large temporary file have its bytes go to disk as it goes, so the
  sync at the end waits for little.

While temporary files exist, SIGTERM is turned into ``KeyboardInterrupt`` (as
SIGINT already is), so a ``kill`` during a save removes them like Ctrl-C does.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import BinaryIO

#: Set by :func:`modes_like`: the file whose permission bits new files take.
_MODE_SOURCE: contextvars.ContextVar[str | None] = contextvars.ContextVar("bnfold_mode_source", default=None)


def file_mode(path: str) -> int:
    """An existing file's permission bits; for a new file, 0o666 (or, inside :func:`modes_like`, the
    bits of the file it is made from) less the umask -- what ``cp`` gives a new file."""
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        base = 0o666
        source = _MODE_SOURCE.get()
        if source is not None:
            with contextlib.suppress(OSError):
                base = os.stat(source).st_mode & 0o777
        return base & ~umask


@contextlib.contextmanager
def modes_like(source: str | os.PathLike) -> Iterator[None]:
    """Within the block, new files take the permission bits of ``source`` (a private model's folded
    copy stays private); files that are replaced keep their own."""
    token = _MODE_SOURCE.set(os.fspath(source))
    try:
        yield
    finally:
        _MODE_SOURCE.reset(token)


@contextlib.contextmanager
def atomic_paths(paths: Sequence[str | os.PathLike], *, mode: int | None = None) -> Iterator[list[str]]:
    """Yield one temporary path per destination; on success they replace the destinations in order.

    ``mode`` gives every file these permission bits; by default each keeps
    those of the file it replaces (see :func:`file_mode`).
    """
    dests = [os.path.abspath(os.fspath(p)) for p in paths]
    pending: list[tuple[str, str]] = []  # (temporary file, destination) not moved yet
    with _sigterm_interrupts():
        yield from _stage(dests, pending, mode)
    for folder in dict.fromkeys(os.path.dirname(d) for d in dests):
        _fsync_dir(folder)


def _stage(dests: list[str], pending: list[tuple[str, str]], mode: int | None) -> Iterator[list[str]]:
    try:
        for dest in dests:
            fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(dest)}.", suffix=".tmp", dir=os.path.dirname(dest))
            os.close(fd)
            pending.append((tmp, dest))
        yield [tmp for tmp, _ in pending]
        for tmp, dest in pending:
            _fsync_file(tmp)
            os.chmod(tmp, file_mode(dest) if mode is None else mode)
        while pending:
            os.replace(*pending[0])
            pending.pop(0)
    finally:
        for tmp, _ in pending:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt while the block runs (main thread only; restored after)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    try:
        previous = signal.signal(signal.SIGTERM, _interrupt)
    except (ValueError, OSError):  # pragma: no cover - no signals here
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, mode: int | None = None) -> Iterator[str]:
    """Yield a temporary path next to ``path``; on success it replaces ``path``, on error it is removed."""
    with atomic_paths([path], mode=mode) as (tmp,):
        yield tmp


def write_bytes(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> None:
    """Write ``path`` atomically: ``write(f)`` writes the contents to an open binary file."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        write(f)


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    write_bytes(path, lambda f: f.write(text.encode("utf-8")))


@contextlib.contextmanager
def scratch_file(folder: str) -> Iterator[tuple[BinaryIO, str]]:
    """An unnamed read-write file (in ``folder``, else the temporary folder) and the folder it is in, gone
    when the block ends: working space, never a result, so nothing is left behind whatever happens."""
    try:
        f = tempfile.TemporaryFile(dir=folder)
    except OSError:
        folder = tempfile.gettempdir()
        f = tempfile.TemporaryFile(dir=folder)
    with f:
        yield f, folder


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing ``length`` bytes at ``offset`` of ``fd`` (a temporary file being written)
    to disk now, without waiting for them (``posix_fadvise(DONTNEED)``: Linux starts the writeback of the range's
    dirty pages and drops its clean ones; the writer reads none of them back).  The sync of :func:`atomic_paths`
    then waits for bytes already under way, and the file's dirty pages never pile up: a 1 GB data file written
    then synced at once took 0.4 s at its close (ext4's flush of a truncated file) or its fsync, after the writes.
    Only a hint: durability is still the sync's; nothing where the system has no such call."""
    if length > 0 and hasattr(os, "posix_fadvise"):
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(folder: str) -> None:
    with contextlib.suppress(OSError, AttributeError):
        _fsync_file(folder)
