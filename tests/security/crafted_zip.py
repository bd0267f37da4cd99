"""Zip archives built by hand, byte by byte, where Python's ``zipfile`` and torch's reader (miniz) may see different
entries: two central directories, duplicate names, an archive appended to another, a data descriptor that lies, a
local header no directory lists.  Each builder takes a ``.pt2``'s entries (name -> bytes, as
:func:`crafted.read_entries` returns them) and writes the crafted file."""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

LOCAL = b"PK\x03\x04"
CENTRAL = b"PK\x01\x02"
END = b"PK\x05\x06"
END64 = b"PK\x06\x06"
LOCATOR64 = b"PK\x06\x07"
DESCRIPTOR = b"PK\x07\x08"
DEFLATED, STORED = 8, 0


@dataclass
class Member:
    """One entry's local record (header and data) and what its central record states."""

    name: str
    raw: bytes  # the local header, name and (compressed) data, and its data descriptor if any
    crc: int
    csize: int
    usize: int
    method: int
    flags: int = 0


def member(name: str, data: bytes, *, deflate: bool = False, descriptor: tuple[int, int] | None = None) -> Member:
    """The local record of ``name``; ``descriptor``: its sizes only in a data descriptor after the data, stating
    ``(compressed, uncompressed)`` (which may lie)."""
    crc = zlib.crc32(data)
    body = _deflate(data) if deflate else data
    method = DEFLATED if deflate else STORED
    flags = 8 if descriptor else 0
    stated = (0, 0, 0) if descriptor else (crc, len(body), len(data))
    raw = struct.pack("<4s5H3I2H", LOCAL, 20, flags, method, 0, 0, *stated, len(name.encode()), 0)
    raw += name.encode() + body
    if descriptor:
        raw += struct.pack("<4s3I", DESCRIPTOR, crc, *descriptor)
    return Member(name, raw, crc, len(body), len(data), method, flags)


def _deflate(data: bytes) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()


def deflated_zeros(name: str, size: int) -> Member:
    """``size`` spaces, deflated (about 1,000-fold), made a MiB at a time."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    chunk, crc, body = b" " * (1 << 20), 0, []
    for start in range(0, size, len(chunk)):
        part = chunk[: min(len(chunk), size - start)]
        crc = zlib.crc32(part, crc)
        body.append(c.compress(part))
    body.append(c.flush())
    comp = b"".join(body)
    raw = struct.pack("<4s5H3I2H", LOCAL, 20, 0, DEFLATED, 0, 0, crc, len(comp), size, len(name.encode()), 0)
    return Member(name, raw + name.encode() + comp, crc, len(comp), size, DEFLATED)


def central(m: Member, offset: int, comment: bytes = b"") -> bytes:
    name = m.name.encode()
    head = struct.pack(
        "<4s6H3I5H2I", CENTRAL, 20, 20, m.flags, m.method, 0, 0, m.crc, m.csize, m.usize, len(name), 0, len(comment),
        0, 0, 0, offset,
    )  # fmt: skip
    return head + name + comment


def end(count: int, size: int, offset: int) -> bytes:
    return struct.pack("<4s4H2IH", END, 0, 0, count, count, size, offset, 0)


def archive(members: list[Member], *, head: bytes = b"") -> tuple[bytes, list[int], bytes]:
    """``head``, then the members' local records: the bytes, each record's offset, and a central directory of them."""
    out, offsets = bytearray(head), []
    for m in members:
        offsets.append(len(out))
        out += m.raw
    return bytes(out), offsets, b"".join(central(m, o) for m, o in zip(members, offsets, strict=True))


def plain(members: list[Member], *, zip64: bool = False) -> bytes:
    """A well-formed archive of ``members``; ``zip64``: its directory stated in a ZIP64 end record and locator."""
    body, _, cd = archive(members)
    if not zip64:
        return body + cd + end(len(members), len(cd), len(body))
    n, at = len(members), len(body) + len(cd)
    record = struct.pack("<4sQ2H2I4Q", END64, 44, 45, 45, 0, 0, n, n, len(cd), len(body))
    locator = struct.pack("<4sIQI", LOCATOR64, 0, at, 1)
    return body + cd + record + locator + end(0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF)


def two_directories(torch_view: list[Member], zip_view: list[Member]) -> bytes:
    """An archive with two central directories over the local records of both views: torch's reader (miniz) reads
    the one at the offset the end record states, listing ``torch_view``; Python's ``zipfile`` reads the one just
    before the end record (it takes the end record's distance to it for a prepended stub's length), listing
    ``zip_view``, each entry's comment padding it to the other's size."""
    records = list({id(m): m for m in torch_view + zip_view}.values())
    _, _, first = archive(records)
    stub = LOCAL + b"\0" * (len(first) + sum(len(m.name) + 46 for m in records))  # zipfile's offsets stay >= 0
    body, offsets, _ = archive(records, head=stub)
    at = {id(m): o for m, o in zip(records, offsets, strict=True)}
    first = b"".join(central(m, at[id(m)]) for m in torch_view)
    shift = len(first)
    second = [central(m, at[id(m)] - shift) for m in zip_view]
    short = len(first) - sum(map(len, second))
    assert short >= 0, "zipfile's directory must not outweigh torch's"
    pads = [short // len(second)] * len(second)
    pads[-1] += short - sum(pads)
    directory = b"".join(central(m, at[id(m)] - shift, b" " * p) for m, p in zip(zip_view, pads, strict=True))
    assert len(directory) == len(first)
    return body + first + directory + end(len(torch_view), len(first), len(body))


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
