"""``.pt2`` archives (``torch.export.save``): the safe loader and the atomic saver.

:func:`load_pt2` reads the file once into memory, checks those bytes with
:mod:`bnfold.io.pt2.inspection` (unless ``trust``) and hands the *same* bytes to
``torch.export.load``, so the file cannot change between the check and the
load.  :func:`save_pt2` serializes into memory first and then writes through
:mod:`bnfold.io.atomic`, so a full disk is a one-line error, never torch's zip
writer aborting the process.
"""

from __future__ import annotations

import io
import os

from ...errors import BnfoldError, ModelFileError
from .. import atomic
from ..errors import one_line
from ..files import read_model_bytes
from ..limits import Limits
from ..quiet import quiet
from .archive import sniff
from .inspection import check_pt2_bytes
from .layout import ZIP_MAGIC


def load_pt2(path: str | os.PathLike, *, trust: bool = False, debug: bool = False, limits: Limits | None = None):
    """Load a ``torch.export.save`` archive, refusing ones that would run code unless ``trust``.

    Every failure is a one-line ``ModelFileError`` that names the file
    (``debug`` lets torch's own exceptions through instead).  ``limits``
    bounds what an untrusted file may unpack to (:class:`bnfold.io.limits.Limits`).
    """
    path = os.fspath(path)
    data = read_model_bytes(path)
    if trust:
        if data[:4] != ZIP_MAGIC:
            raise ModelFileError(f"{path}: not a .pt2 archive (not a zip file; {sniff(data)})")
    else:
        with quiet(not debug):
            check_pt2_bytes(data, path, limits)

    import torch

    try:
        with quiet(not debug):
            ep = torch.export.load(io.BytesIO(data))
    except BnfoldError:
        raise
    except MemoryError:
        raise ModelFileError(f"{path}: out of memory while loading the exported program") from None
    except Exception as e:
        if debug:
            raise
        raise ModelFileError(f"{path}: cannot load the exported program ({one_line(e)})") from None
    if not isinstance(ep, torch.export.ExportedProgram):
        raise ModelFileError(f"{path}: the archive does not hold an exported program")
    return ep


def save_pt2(ep, path: str | os.PathLike) -> None:
    """``torch.export.save(ep, path)``, written atomically (the file is complete or untouched)."""
    import torch

    buf = io.BytesIO()
    torch.export.save(ep, buf)
    blob = buf.getbuffer()
    atomic.write_bytes(path, lambda f: f.write(blob))
