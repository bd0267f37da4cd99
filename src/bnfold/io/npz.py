"""Reading an ``.npz`` file of input arrays (``bnfold audit --inputs``): no pickles, regular files only,
bounded in size.  The file is a stranger's: nothing it states sizes a buffer.  Each member's ``.npy`` header
(dtype, shape) is read by numpy's header reader, and its data is then read in bounded chunks, counted as
they come (deflated ones decompressed so, never past the header's size plus one byte, and within the zip
ratio), and must be exactly the header's elements times the itemsize."""

from __future__ import annotations

import io
import math
import struct
import zipfile
from typing import Any, BinaryIO

from ..errors import ModelFileError
from .errors import one_line
from .limits import Limits, read_regular_file

#: numpy dtype kinds an input array may have: bool, signed and unsigned integers, floats, complex
NUMERIC_KINDS = "biufc"
_CHUNK = 1 << 20  # bytes of a member read (and decompressed) at a time
#: the longest ``.npy`` header read (numpy's own reader refuses longer ones, but only after reading them whole)
MAX_HEADER_BYTES = 10000
_COMPRESSIONS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)  # what np.savez / np.savez_compressed write


def read_npz(path: str, limits: Limits | None = None):
    """``{name: array}`` from ``path``; one-line ModelFileError otherwise.

    The file must be a regular file (a FIFO would block forever), its arrays
    may unpack to no more than the byte budget of ``limits``, no entry over
    1 MiB may inflate more than the ``.pt2`` bound (200-fold), every member must be an
    ``.npy`` array whose data is exactly what its header states, and every array
    must be numeric (bool, integer, float, complex: no strings, dates,
    records or objects; nothing is unpickled).
    """
    data = read_regular_file(path, ".npz file")
    limits = limits or Limits()
    arrays = _scan(path, io.BytesIO(data), limits, limits.byte_budget(len(data)))
    if not arrays:
        raise ModelFileError(f"{path}: the .npz file holds no arrays")
    return arrays


def npz_elements(arrays: dict) -> int:
    """The elements of the arrays :func:`read_npz` read: what the user chose to feed, which bounds the work a model
    file's own input shapes are granted when it is checked at load (:func:`bnfold.io.budget.inputs_chosen`).
    Counted from the arrays, whose data was read and matched their headers (a header claiming more would buy
    the model file work)."""
    return sum(a.size for a in arrays.values())


def _scan(path: str, f: BinaryIO, limits: Limits, budget: int) -> dict[str, Any]:
    """``{name: array}`` of the ``.npz`` in ``f``, checked as :func:`read_npz` says; one-line ModelFileError
    otherwise."""
    try:
        size = f.seek(0, io.SEEK_END)  # the compressed bytes there are, whatever the members state
        f.seek(0)
        with zipfile.ZipFile(f) as zf:
            infos = zf.infolist()
            total = sum(i.file_size for i in infos)  # as stated: refuses early, decides nothing else
            if total > budget:
                raise ModelFileError(f"{path}: the arrays unpack to {total} bytes, over the limit of {budget}; refused")
            out: dict[str, Any] = {}
            for info in infos:  # an entry stating it inflates over the bound is refused before any of it is read;
                # its compressed bytes are at most the file's size, whatever it states (counted again in _member)
                limits.check_inflation(
                    f"{path}: entry {info.filename!r}", info.file_size, min(info.compress_size, size)
                )
            for info in infos:
                name = _name(path, info, out)
                with zf.open(info) as entry:
                    out[name], used = _member(path, info, entry, limits, (budget, size))
                budget -= used
            return out
    except MemoryError:
        raise ModelFileError(f"{path}: out of memory while reading the inputs") from None
    except ModelFileError:
        raise
    except Exception as e:  # noqa: BLE001 - zipfile, zlib and numpy's header reader raise many kinds
        raise ModelFileError(f"{path}: cannot read the inputs as an .npz file ({one_line(e)})") from None


def _header(path: str, info: zipfile.ZipInfo, entry: BinaryIO, version: tuple) -> BinaryIO:
    """The member's ``.npy`` header (its length field and text) read here, at most :data:`MAX_HEADER_BYTES`:
    numpy's reader would read (and inflate) a stated length of up to 4 GiB before it refuses it."""
    form = "<H" if version == (1, 0) else "<I"
    raw = entry.read(struct.calcsize(form))
    length = struct.unpack(form, raw)[0] if len(raw) == struct.calcsize(form) else -1
    if not 0 <= length <= MAX_HEADER_BYTES:
        raise ModelFileError(
            f"{path}: array {info.filename[:-4]!r} has a header of {length} bytes (at most {MAX_HEADER_BYTES}); refused"
        )
    text = entry.read(length)
    if len(text) != length:
        raise ModelFileError(f"{path}: array {info.filename[:-4]!r} has a header cut short; refused")
    return io.BytesIO(raw + text)


def _name(path: str, info: zipfile.ZipInfo, seen: dict) -> str:
    """The array's name (the member's, less ``.npy``): a member of another kind, compression or name is refused."""
    name = info.filename[:-4] if info.filename.endswith(".npy") else None
    if name is None or name in seen or info.compress_type not in _COMPRESSIONS or info.flag_bits & 0x1:
        why = "twice" if name in seen else "not an .npy array stored or deflated"
        raise ModelFileError(f"{path}: member {info.filename!r} is {why}; refused")
    return name


def _member(path: str, info: zipfile.ZipInfo, entry: BinaryIO, limits: Limits, bounds: tuple[int, int]):
    """``(array, bytes)`` of one member: its header read, its data read in chunks and counted.
    ``bounds``: the bytes the arrays may still unpack to, and the file's size (the most compressed bytes a member
    can have, whatever it states: the inflation is counted against the smaller)."""
    import numpy as np

    budget, packed = bounds[0], min(info.compress_size, bounds[1])

    fmt = np.lib.format
    version = fmt.read_magic(entry)
    if version not in ((1, 0), (2, 0)):
        raise ModelFileError(f"{path}: array {info.filename!r} has .npy format {version}; refused")
    read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
    shape, fortran, dtype = read(_header(path, info, entry, version))
    if dtype.kind not in NUMERIC_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise ModelFileError(
            f"{path}: array {info.filename[:-4]!r} has dtype {dtype}; inputs must be numeric (bool, integer, float)"
        )
    if any(d < 0 for d in shape):  # numpy's header reader lets negative dims through; a product of two is positive
        raise ModelFileError(f"{path}: array {info.filename[:-4]!r} states the shape {shape}; refused")
    count = math.prod(shape)
    need = count * dtype.itemsize
    if need > budget:
        raise ModelFileError(
            f"{path}: array {info.filename[:-4]!r} states {need} bytes, over the limit of {budget}; refused"
        )
    buf, got = bytearray(), 0
    while got <= need:
        chunk = entry.read(min(_CHUNK, need + 1 - got))
        if not chunk:
            break
        got += len(chunk)
        limits.check_inflation(f"{path}: entry {info.filename!r}", got, packed, counted=True)
        buf += chunk
    if got != need:
        raise ModelFileError(
            f"{path}: array {info.filename[:-4]!r} states {count} elements of {dtype} ({need} bytes), "
            f"its data holds {'more' if got > need else got}; refused"
        )
    array = np.frombuffer(buf, dtype=dtype, count=count)
    return (array.reshape(shape[::-1]).transpose() if fortran else array.reshape(shape)), need
