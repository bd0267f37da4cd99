"""Reading an ``.npz`` file of input arrays (``bnfold audit --inputs``): no pickles, regular files only,
bounded in size."""

from __future__ import annotations

import io
import zipfile

from ..errors import ModelFileError
from .errors import one_line
from .limits import Limits, read_regular_file


def read_npz(path: str, limits: Limits | None = None):
    """``{name: array}`` from ``path``, read with ``allow_pickle=False``; one-line ModelFileError otherwise.

    The file must be a regular file (a FIFO would block forever) and its
    arrays may unpack to no more than the byte budget of ``limits``.
    """
    import numpy as np

    data = read_regular_file(path, "an .npz file")
    budget = (limits or Limits()).byte_budget(len(data))
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            total = sum(i.file_size for i in zf.infolist())
    except (zipfile.BadZipFile, EOFError, ValueError, OSError) as e:
        raise ModelFileError(f"{path}: cannot read the inputs as an .npz file ({one_line(e)})") from None
    if total > budget:
        raise ModelFileError(f"{path}: the arrays unpack to {total} bytes, over the limit of {budget}; refused")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except MemoryError:
        raise ModelFileError(f"{path}: out of memory while reading the inputs") from None
    except Exception as e:  # noqa: BLE001 - numpy raises many kinds for a bad file
        raise ModelFileError(f"{path}: cannot read the inputs as an .npz file ({one_line(e)})") from None
    if not arrays:
        raise ModelFileError(f"{path}: the .npz file holds no arrays")
    return arrays
