"""Reading an ``.npz`` file of input arrays (``bnfold audit --inputs``) without pickles."""

from __future__ import annotations

import os

from ..errors import ModelFileError
from .errors import one_line


def read_npz(path: str):
    """``{name: array}`` from ``path``, read with ``allow_pickle=False``; one-line ModelFileError otherwise."""
    import numpy as np

    if not os.path.exists(path):
        raise ModelFileError(f"{path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except Exception as e:  # noqa: BLE001 - numpy raises many kinds for a bad file
        raise ModelFileError(f"{path}: cannot read the inputs as an .npz file ({one_line(e)})") from None
    if not arrays:
        raise ModelFileError(f"{path}: the .npz file holds no arrays")
    return arrays
