"""Bounds on the work an untrusted model file can make bnfold do, and reading files that are files.

* :class:`Limits`: how many bytes a model may unpack to (``--max-bytes``), how
  deep its JSON may nest, how much a zip entry may inflate.
* :func:`read_regular_file`: the bytes of a regular file (never a FIFO, a
  device or a socket, which would hang or never end), opened once.
* :func:`loads_json`: ``json.loads`` that refuses documents nested deeper than
  the limit *before* parsing them (a 200k-deep ``[[[[...`` would otherwise
  exhaust the recursion limit inside the parser or in any walk after it).
* :func:`json_values`: how many values a JSON text can make a parser build, counted on its bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from ..errors import ModelFileError

MIB = 1 << 20
DEFAULT_MIN_BYTES = 256 * MIB  # small files may still unpack to this much
DEFAULT_FILE_MULTIPLE = 16  # ... or to this many times the file's size, whichever is larger
MAX_JSON_DEPTH = 100  # torch.export writes about 12 levels
MAX_ZIP_RATIO = 200  # uncompressed / compressed, for entries over RATIO_FREE_BYTES
RATIO_FREE_BYTES = MIB
MAX_BYTES_HINT = "pass --max-bytes N to allow more if you trust the file's size"


@dataclass(frozen=True)
class Limits:
    """Bounds for one model file; ``max_bytes`` None means the default for the file's size."""

    max_bytes: int | None = None
    json_depth: int = MAX_JSON_DEPTH
    zip_ratio: int = MAX_ZIP_RATIO

    def byte_budget(self, file_size: int) -> int:
        """How many bytes the file may unpack to in all (tensors, JSON, external data)."""
        if self.max_bytes is not None:
            return self.max_bytes
        return max(DEFAULT_MIN_BYTES, DEFAULT_FILE_MULTIPLE * file_size)

    def check_inflation(self, entry: str, unpacked: int, packed: int, counted: bool = False) -> None:
        """Refuse the zip entry ``entry`` (``"<file>: entry 'name'"``) when it is over :data:`RATIO_FREE_BYTES`
        and ``unpacked`` bytes from ``packed`` inflate more than ``zip_ratio``-fold; ``counted``: ``unpacked`` is
        what was inflated so far (the entry inflates "over" that), not what it states."""
        packed = max(packed, 1)
        if unpacked > RATIO_FREE_BYTES and unpacked > self.zip_ratio * packed:
            raise ModelFileError(
                f"{entry} inflates {'over ' if counted else ''}{unpacked // packed}-fold "
                f"(at most {self.zip_ratio}-fold for entries over {RATIO_FREE_BYTES >> 20} MiB); refused as a zip bomb"
            )


def read_regular_file(path: str, what: str = "model file") -> bytes:
    """The bytes of the regular file at ``path``; a one-line ``ModelFileError`` for anything else.

    The file is opened without blocking and checked with ``fstat`` on the open
    descriptor, so a FIFO or a device is refused instead of read (a FIFO with no
    writer would block forever), and the file checked is the file read.
    """
    with open_regular_file(path, what) as f:
        try:
            return f.read()
        except OSError as e:
            raise ModelFileError(f"{path}: cannot read the file ({e.strerror or e})") from None


@contextlib.contextmanager
def open_regular_file(path: str, what: str = "model file") -> Iterator[BinaryIO]:
    """The regular file at ``path`` open for reading (:func:`read_regular_file`'s checks); a one-line
    ``ModelFileError`` for anything else."""
    if not os.path.lexists(path):
        raise ModelFileError(f"{path}: no such file; check the path to the {what}")
    if os.path.isdir(path):
        raise ModelFileError(f"{path}: is a directory; pass the path of a {what}")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        raise ModelFileError(f"{path}: cannot read the file ({e.strerror or e})") from None
    try:
        try:
            regular = stat.S_ISREG(os.fstat(fd).st_mode)
        except OSError as e:
            raise ModelFileError(f"{path}: cannot read the file ({e.strerror or e})") from None
        if not regular:
            raise ModelFileError(f"{path}: not a regular file (a FIFO, device or socket?); pass a {what}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            yield f
    finally:
        os.close(fd)


_CHUNK = 1 << 22  # bytes scanned at a time by json_depth (bounds its temporary arrays)


def json_depth(raw: bytes) -> int:
    """The deepest nesting of ``[`` / ``{`` in a JSON text, strings ignored.

    Vectorised over chunks of 4 MiB (no recursion, temporary memory bounded
    whatever the size of the text); the state between chunks is the current
    depth, whether a string is open, and the run of backslashes at the end.
    """
    import numpy as np

    depth = deepest = 0
    in_string = 0
    slashes = 0  # backslashes just before the chunk
    for start in range(0, len(raw), _CHUNK):
        a = np.frombuffer(raw, dtype=np.uint8, count=min(_CHUNK, len(raw) - start), offset=start)
        pos = np.arange(a.size)
        last_plain = np.maximum.accumulate(np.where(a != ord("\\"), pos, -1))
        prev = np.maximum(pos - 1, 0)
        run = np.where(last_plain[prev] >= 0, pos - 1 - last_plain[prev], pos + slashes)
        run[0] = slashes
        quotes = (a == ord('"')) & (run % 2 == 0)  # a quote after an odd run of backslashes is escaped
        toggles = np.cumsum(quotes, dtype=np.int64)
        inside = ((toggles + in_string) % 2) == 1  # from an opening quote up to (not incl.) the closing one
        steps = np.zeros(a.size, dtype=np.int64)
        steps[((a == ord("[")) | (a == ord("{"))) & ~inside] = 1
        steps[((a == ord("]")) | (a == ord("}"))) & ~inside] = -1
        levels = np.cumsum(steps) + depth
        deepest = max(deepest, int(levels.max()))
        depth = int(levels[-1])
        in_string = int((in_string + toggles[-1]) % 2)
        slashes = slashes + a.size if last_plain[-1] < 0 else a.size - 1 - int(last_plain[-1])
    return deepest


def json_values(raw: bytes) -> int:
    """An upper bound on the values a parser makes of the JSON text ``raw``, less one: its ``{``, ``[`` and ``,``
    bytes (a value is the document, an element after a ``,`` or the first of a container).  Those inside strings
    count too, so a string that is parsed again as JSON (torch's ``from_node`` metadata) counts with its document.
    Counted with ``bytes.count``: no copy, no parse, whatever the text holds."""
    return raw.count(b"{") + raw.count(b"[") + raw.count(b",")


def loads_json(raw: bytes | str, where: str, limits: Limits | None = None) -> Any:
    """Parse JSON whose nesting is at most ``limits.json_depth``; one-line ``ModelFileError`` otherwise."""
    depth_limit = (limits or Limits()).json_depth
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    depth = json_depth(data)
    if depth > depth_limit:
        raise ModelFileError(f"{where} nests {depth} levels deep (at most {depth_limit} are read); refused")
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        detail = (str(e).splitlines() or [type(e).__name__])[0][:200]
        raise ModelFileError(f"{where} is not valid JSON ({detail})") from None
