"""The zip form of a pt2 archive: its bytes must be exactly the archive Python's ``zipfile`` lists, so that torch's
reader (miniz) cannot find entries, or other bytes under the same names, that bnfold's size checks never saw.

The two readers find the central directory differently: miniz at the offset the end record states, ``zipfile`` just
before the end record (it takes any distance between the two for a prepended stub's length and shifts every entry by
it).  A file with two directories thus shows each reader its own entries: torch inflated a 1.5 GiB entry that
``zipfile`` did not list (tests/security/test_zip_form.py).  What ``torch.export.save`` writes has one form, which is
what is accepted: the end record at the very end of the file (no comment, nothing after it), a ZIP64 end record and
locator right before it if any, the central directory right before those at the offset the end record states, listing
as many entries as it states, and before it, from byte 0 and in order, each entry's local record (its header naming
it, with its method and sizes, its data, its data descriptor stating the directory's sizes) and nothing else."""

from __future__ import annotations

import struct
import zipfile

from ...errors import ModelFileError

_END = b"PK\x05\x06"
_END64 = b"PK\x06\x06"
_LOCATOR64 = b"PK\x06\x07"
_LOCAL = b"PK\x03\x04"
_DESCRIPTOR = b"PK\x07\x08"
_END_SIZE, _LOCATOR64_SIZE, _END64_SIZE, _LOCAL_SIZE = 22, 20, 56, 30
_SPILLED = 0xFFFFFFFF  # a size or offset stated in a ZIP64 field instead
_HAS_DESCRIPTOR = 0x08
_UTF8 = 0x800


def check_zip_form(data: bytes, infos: list[zipfile.ZipInfo], start_dir: int, source: str) -> None:
    """Refuse ``data`` (one line, ``ModelFileError``) unless it is exactly the archive ``infos`` (``zipfile``'s
    listing of it, whose central directory it read at ``start_dir``) describes; see the module's docstring."""
    why = _misfit(data, infos, start_dir)
    if why:
        raise ModelFileError(
            f"{source}: not laid out as torch.export.save writes a zip archive ({why}), so zip readers may disagree "
            "about its entries; re-save it with torch.export.save"
        )


def _misfit(data: bytes, infos: list[zipfile.ZipInfo], start_dir: int) -> str | None:
    """What keeps ``data`` from being exactly the archive ``infos`` describe, or None."""
    end = len(data) - _END_SIZE
    if end < 0 or data[end : end + 4] != _END:
        return "bytes after its end record"
    _, disk, cd_disk, _, count, cd_size, cd_offset, comment = struct.unpack("<4s4H2IH", data[end:])
    if comment or disk or cd_disk:
        return "a comment after its end record" if comment else "a multi-disk archive"
    trailer = end
    if end >= _LOCATOR64_SIZE and data[end - _LOCATOR64_SIZE : end - _LOCATOR64_SIZE + 4] == _LOCATOR64:
        at = struct.unpack_from("<Q", data, end - _LOCATOR64_SIZE + 8)[0]
        trailer = end - _LOCATOR64_SIZE - _END64_SIZE
        if at != trailer or data[at : at + 4] != _END64 or struct.unpack_from("<Q", data, at + 4)[0] != 44:
            return "a ZIP64 end record that is not right before its locator"
        count, cd_size, cd_offset = struct.unpack_from("<8x3Q", data, at + 24)
    if cd_offset + cd_size != trailer or start_dir != cd_offset:
        return "its central directory is not where its end record states, right before it"
    if count != len(infos):
        return f"its end record states {count} entries, its central directory lists {len(infos)}"
    pos = 0
    for info in sorted(infos, key=lambda i: i.header_offset):
        if info.header_offset > pos:
            return f"{info.header_offset - pos:,} bytes at offset {pos:,} that no entry accounts for"
        if info.header_offset < pos:
            return f"entries overlapping at offset {info.header_offset:,}"
        pos = _local_end(data, info)
        if pos is None:
            return f"entry {info.filename!r}'s local header or data descriptor disagrees with its central directory"
    if pos != cd_offset:
        return f"bytes between its last entry and its central directory (offset {pos})"
    return None


def _local_end(data: bytes, info: zipfile.ZipInfo) -> int | None:
    """Where the local record of ``info`` ends (its header, name, extra field, data and data descriptor), or None
    when its header or descriptor disagree with ``info`` (the central directory's record)."""
    at = info.header_offset
    if at + _LOCAL_SIZE > len(data):
        return None
    sig, _, flags, method, _, _, crc, csize, usize, nlen, elen = struct.unpack_from("<4s5H3I2H", data, at)
    name = info.orig_filename.encode("utf-8" if info.flag_bits & _UTF8 else "cp437")
    stated = (crc, csize, usize)
    if sig != _LOCAL or flags != info.flag_bits or method != info.compress_type:
        return None
    if data[at + _LOCAL_SIZE : at + _LOCAL_SIZE + nlen] != name:
        return None
    whole = (info.CRC, info.compress_size, info.file_size)
    later = (0, 0, 0) if flags & _HAS_DESCRIPTOR else whole  # sizes in the data descriptor, torch's way
    if stated not in (whole, later) and stated[1:] != (_SPILLED, _SPILLED):  # or in a ZIP64 extra field
        return None
    pos = at + _LOCAL_SIZE + nlen + elen + info.compress_size
    if not flags & _HAS_DESCRIPTOR:
        return pos
    for form in ("<4sIII", "<III", "<4sIQQ", "<IQQ"):  # with and without its signature; 32- and 64-bit sizes
        size = struct.calcsize(form)
        if pos + size <= len(data):
            fields = struct.unpack_from(form, data, pos)
            if (fields[0] == _DESCRIPTOR or len(fields) == 3) and fields[-3:] == whole:
                return pos + size
    return None
