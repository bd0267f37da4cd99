"""Reading an ``.npz`` file of input arrays (``bnfold audit --inputs``): no pickles, regular files only,
bounded in size."""

from __future__ import annotations

import io
import zipfile

from ..errors import ModelFileError
from .errors import one_line
from .limits import RATIO_FREE_BYTES, Limits, open_regular_file, read_regular_file

#: numpy dtype kinds an input array may have: bool, signed and unsigned integers, floats, complex
NUMERIC_KINDS = "biufc"


def read_npz(path: str, limits: Limits | None = None):
    """``{name: array}`` from ``path``, read with ``allow_pickle=False``; one-line ModelFileError otherwise.

    The file must be a regular file (a FIFO would block forever), its arrays
    may unpack to no more than the byte budget of ``limits``, no entry over
    1 MiB may inflate more than the ``.pt2`` bound (200-fold), and every array
    must be numeric (bool, integer, float, complex: no strings, dates,
    records or objects).
    """
    import numpy as np

    data = read_regular_file(path, ".npz file")
    budget = (limits or Limits()).byte_budget(len(data))
    limits = limits or Limits()
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            infos = zf.infolist()
    except (zipfile.BadZipFile, EOFError, ValueError, OSError) as e:
        raise ModelFileError(f"{path}: cannot read the inputs as an .npz file ({one_line(e)})") from None
    total = sum(i.file_size for i in infos)
    if total > budget:
        raise ModelFileError(f"{path}: the arrays unpack to {total} bytes, over the limit of {budget}; refused")
    for i in infos:
        if i.file_size > RATIO_FREE_BYTES and i.file_size > limits.zip_ratio * max(i.compress_size, 1):
            raise ModelFileError(
                f"{path}: entry {i.filename!r} inflates {i.file_size // max(i.compress_size, 1)}-fold "
                f"(at most {limits.zip_ratio}-fold for entries over 1 MiB); refused"
            )
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except MemoryError:
        raise ModelFileError(f"{path}: out of memory while reading the inputs") from None
    except Exception as e:  # noqa: BLE001 - numpy raises many kinds for a bad file
        raise ModelFileError(f"{path}: cannot read the inputs as an .npz file ({one_line(e)})") from None
    if not arrays:
        raise ModelFileError(f"{path}: the .npz file holds no arrays")
    for name, a in arrays.items():
        if a.dtype.kind not in NUMERIC_KINDS or a.dtype.fields is not None:
            raise ModelFileError(
                f"{path}: array {name!r} has dtype {a.dtype}; inputs must be numeric (bool, integer, float)"
            )
    return arrays


def npz_elements(path: str) -> int:
    """The elements of all the arrays of the ``.npz`` file at ``path``, from their headers (no array is read):
    what the user chose to feed, which bounds the work a model file's own input shapes are granted when it is
    checked at load (:func:`bnfold.io.budget.inputs_chosen`).  0 for a file that cannot be read so (the audit's
    reader, :func:`read_npz`, then says why)."""
    import numpy as np

    from .sizes import elements

    fmt = np.lib.format
    total = 0
    try:
        with open_regular_file(path, ".npz file") as f, zipfile.ZipFile(f) as zf:
            for info in zf.infolist():
                with zf.open(info) as entry:
                    version = fmt.read_magic(entry)
                    read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
                    total += elements(read(entry)[0])
    except Exception:  # noqa: BLE001 - any unreadable file: no allowance here, read_npz's error later
        return 0
    return total
