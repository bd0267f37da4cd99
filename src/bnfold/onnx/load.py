"""Read an ONNX model file and its external data, refusing unsafe or broken files.

External data may only live inside the model's folder: absolute locations,
``..`` components and symlinks that lead elsewhere are refused, as are data
files too short for the tensors they should hold.  Every refusal is a
``ModelFileError`` with a one-line message that names the file.
"""

from __future__ import annotations

import os
import re

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto

from ..errors import ModelFileError
from ..files import read_model_bytes
from . import external


def load_onnx(path) -> onnx.ModelProto:
    """The model at ``path`` with its external data read in (none left on disk references)."""
    p = os.fspath(path)
    data = read_model_bytes(p)
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError):
        raise ModelFileError(f"{p}: not an ONNX model, or the file is truncated (it does not parse)") from None
    if model.ir_version <= 0 or not model.HasField("graph") or not model.opset_import:
        raise ModelFileError(
            f"{p}: not an ONNX model, or the file is truncated (no IR version, graph or opset import)"
        )
    names, smallest = _read_external(model, os.path.dirname(os.path.abspath(p)), p)
    if names:
        external.remember(model, external.Mark(frozenset(names), min(smallest, external.DEFAULT_THRESHOLD)))
    return model


_DRIVE = re.compile(r"^[A-Za-z]:")


def _read_external(model: onnx.ModelProto, base: str, p: str) -> tuple[set[str], int]:
    real_base = os.path.realpath(base)
    names: set[str] = set()
    smallest = external.DEFAULT_THRESHOLD
    for t in external.all_tensors(model):
        if t.data_location != TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        where = f"{p}: external data of tensor {t.name!r}"
        if not loc:
            raise ModelFileError(f"{where} has no location")
        if os.path.isabs(loc) or loc.startswith(("/", "\\")) or _DRIVE.match(loc):
            raise ModelFileError(f"{where} uses the absolute path {loc!r}; only files in the model's folder are read")
        if ".." in re.split(r"[/\\]", loc):
            raise ModelFileError(f"{where} at {loc!r} escapes the model's folder; only files in it are read")
        real = os.path.realpath(os.path.join(base, loc))
        if os.path.commonpath([real, real_base]) != real_base:
            raise ModelFileError(f"{where} at {loc!r} resolves outside the model's folder (a symlink?); refused")
        if not os.path.isfile(real):
            raise ModelFileError(f"{where}: the data file {loc!r} is missing next to the model")
        try:
            offset = int(info.get("offset", 0))
            length = int(info["length"]) if "length" in info else None
        except ValueError:
            raise ModelFileError(f"{where} has a non-integer offset or length") from None
        size = os.path.getsize(real)
        if offset < 0 or (length is not None and length < 0):
            raise ModelFileError(f"{where} has a negative offset or length")
        if length is None:
            length = size - offset
        if offset + length > size:
            raise ModelFileError(
                f"{where}: the data file {loc!r} is truncated (needs bytes {offset}..{offset + length}, has {size})"
            )
        expected = _expected_bytes(t)
        if expected is not None and expected != length:
            raise ModelFileError(f"{where} holds {length} bytes, but the tensor needs {expected}")
        with open(real, "rb") as f:
            f.seek(offset)
            t.raw_data = f.read(length)
        t.data_location = TensorProto.DEFAULT
        del t.external_data[:]
        names.add(t.name)
        smallest = min(smallest, length)
    return names, smallest


def _expected_bytes(t: TensorProto) -> int | None:
    if t.data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
        return None
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except (KeyError, ValueError, TypeError):
        return None
    name = TensorProto.DataType.Name(t.data_type)
    if name in ("INT4", "UINT4", "INT2", "UINT2") or name.startswith(("FLOAT4", "FLOAT6")):
        return None  # packed sub-byte types
    return int(np.prod(t.dims, dtype=np.int64)) * itemsize if len(t.dims) else itemsize
