"""Small file helpers shared by the model readers and writers (no torch, no onnx)."""

from __future__ import annotations

import os

from .errors import ModelFileError


def read_model_bytes(path: str) -> bytes:
    """The file's bytes, or a one-line ModelFileError for a missing, unreadable or empty file."""
    if not os.path.lexists(path):
        raise ModelFileError(f"{path}: no such file; check the path to the model")
    if os.path.isdir(path):
        raise ModelFileError(f"{path}: is a directory; pass the path of a model file")
    if not os.path.isfile(path):
        raise ModelFileError(f"{path}: not a regular file; pass the path of a model file")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ModelFileError(f"{path}: cannot read the file ({e.strerror or e})") from None
    if not data:
        raise ModelFileError(f"{path}: the file is empty, not a model")
    return data


def file_mode(path: str) -> int:
    """An existing file's permission bits; for a new file, 0o666 less the umask."""
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
