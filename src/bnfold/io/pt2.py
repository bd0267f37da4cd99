"""``.pt2`` archives (``torch.export.save``): the safe loader and the atomic saver.

:func:`load_pt2` reads the file once into memory, checks those bytes with
:mod:`bnfold.io.pt2_safety` (unless ``trust``) and hands the *same* bytes to
``torch.export.load``, so the file cannot change between the check and the
load.  :func:`save_pt2` writes through :mod:`bnfold.io.atomic`.
"""

from __future__ import annotations

import io
import os

from ..errors import BnfoldError, ModelFileError
from . import atomic, pt2_safety
from .errors import one_line
from .files import read_model_bytes
from .quiet import quiet


def load_pt2(path: str | os.PathLike, *, trust: bool = False, debug: bool = False):
    """Load a ``torch.export.save`` archive, refusing ones that would run code unless ``trust``.

    Every failure is a one-line ``ModelFileError`` that names the file
    (``debug`` lets torch's own exceptions through instead).
    """
    path = os.fspath(path)
    data = read_model_bytes(path)
    if trust:
        if data[:4] != pt2_safety.ZIP_MAGIC:
            raise ModelFileError(f"{path}: not a .pt2 archive (not a zip file; {pt2_safety.sniff(data)})")
    else:
        pt2_safety.check_pt2_bytes(data, path)

    import torch

    try:
        with quiet(not debug):
            ep = torch.export.load(io.BytesIO(data))
    except BnfoldError:
        raise
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

    atomic.write_bytes(path, lambda f: torch.export.save(ep, f))
