"""Paths and bytes of model files (no torch, no onnx): the model kind from the
file name, reading a model file once with one-line errors, comparing paths,
checking where a side file (report, plot) may go."""

from __future__ import annotations

import os

from ..errors import BnfoldError, ModelFileError
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


def check_side_file(path: str, *, not_same_as: list[str], what: str, force: bool | None = None) -> None:
    """Where a report / plot may go: never a model file or a file the input model reads (its
    external data), never an existing file without ``force``, and its folder must exist.

    ``force=None`` is for a command without ``--force``: an existing file is refused.
    """
    for other in not_same_as:
        if other and same_file(path, other):
            raise BnfoldError(f"{path}: the {what} would overwrite a model file; write it elsewhere")
        if other and os.path.realpath(path) in input_files(other):
            raise BnfoldError(f"{path}: the {what} would overwrite the model's external data; write it elsewhere")
    if os.path.isdir(path):
        raise ModelFileError(f"{path}: is a directory; give a file name for the {what}")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ModelFileError(f"{path}: the folder {parent} does not exist")
    if os.path.lexists(path) and not force:
        hint = "remove it or choose another name" if force is None else "pass --force to replace it"
        raise BnfoldError(f"{path}: already exists; {hint}")


def input_files(path: str) -> set[str]:
    """Real paths of the files a model reads besides itself: an ONNX model's external data files.

    Empty for a ``.pt2`` and for a file that cannot be read (that is reported
    when it is loaded).  The file is read with the safe reader (regular files
    only) and parsed, nothing more.
    """
    try:
        if model_kind(path) != ONNX:
            return set()
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
            if loc:
                found.add(os.path.realpath(os.path.join(base, loc)))
    return found
