"""Paths and bytes of model files (no torch, no onnx): the model kind from the
file name, reading a model file once with one-line errors, comparing paths,
checking where a side file (report, plot) may go."""

from __future__ import annotations

import os

from ..errors import ModelFileError
from .limits import read_regular_file

PT2 = "pt2"
ONNX = "onnx"
EXTENSIONS = {".pt2": PT2, ".onnx": ONNX}


def model_kind(path: str | os.PathLike) -> str:
    """``"pt2"`` or ``"onnx"`` from the file name; anything else is an error."""
    ext = os.path.splitext(os.fspath(path))[1].lower()
    kind = EXTENSIONS.get(ext)
    if kind is None:
        shown = f"extension {ext!r}" if ext else "no extension"
        raise ModelFileError(f"{os.fspath(path)}: unsupported model file ({shown}); use a .pt2 or .onnx file")
    return kind


def onnx_data_path(model_path: str) -> str:
    """Where :func:`bnfold.io.onnx.save_onnx` puts the external data of ``model_path``."""
    return model_path + ".data"


def read_model_bytes(path: str) -> bytes:
    """The file's bytes, or a one-line ModelFileError for a missing, unreadable, empty or non-regular file."""
    data = read_regular_file(path)
    if not data:
        raise ModelFileError(f"{path}: the file is empty, not a model")
    return data


def same_file(a: str, b: str) -> bool:
    """True when ``a`` and ``b`` name the same file (also through links)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def onnx_external_files(path: str) -> set[str]:
    """Real paths of an ONNX model's external data files; empty for a file that cannot be read (that is
    reported when it is loaded).  The file is read with the safe reader (regular files only) and parsed,
    nothing more."""
    try:
        import onnx

        from .onnx_external import all_tensors, is_external

        model = onnx.ModelProto()
        model.ParseFromString(read_model_bytes(path))
    except Exception:  # noqa: BLE001 - an unreadable input is reported when it is loaded
        return set()
    base = os.path.dirname(os.path.abspath(path))
    found = set()
    for t in all_tensors(model):
        if is_external(t):
            loc = {e.key: e.value for e in t.external_data}.get("location")
            if loc and "\0" not in loc:  # a location no file can have is refused when the model is loaded
                found.add(os.path.realpath(os.path.join(base, loc)))
    return found
