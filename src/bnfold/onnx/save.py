"""Write an ONNX model atomically, with or without external data.

Both files are first written to temporary files in the target folder and then
moved into place with ``os.replace``: the data file first, the model last, so
a reader never sees a model whose data is not there yet.  The caller's
ModelProto is left as it was.
"""

from __future__ import annotations

import os
import tempfile

import onnx
from onnx import TensorProto

from ..errors import ModelFileError
from ..files import file_mode
from . import external

_PROTO_LIMIT = 2**31 - 1  # protobuf's serialization limit


def save_onnx(model: onnx.ModelProto, path, external_data: bool | None = None) -> None:
    """Save ``model`` to ``path``.

    ``external_data``: True stores large tensors in ``<file name>.data`` next to
    the model; False stores everything in the one file; None (default) keeps
    external data when the model was loaded (or folded from a model loaded)
    from a file that had it, and otherwise uses it only when the model is too
    large for a single protobuf.
    """
    p = os.path.abspath(os.fspath(path))
    folder = os.path.dirname(p)
    if not os.path.isdir(folder):
        raise ModelFileError(f"{p}: the folder {folder} does not exist")
    for t in external.all_tensors(model):
        if t.data_location == TensorProto.EXTERNAL:
            raise ModelFileError(
                f"{p}: tensor {t.name!r} still refers to external data that was never loaded; "
                "read the model with bnfold.onnx.load_onnx before saving it"
            )
    mark = external.recall(model)
    if external_data is None:
        external_data = mark is not None or model.ByteSize() > _PROTO_LIMIT
    threshold = mark.threshold if mark is not None else external.DEFAULT_THRESHOLD
    names = mark.names if mark is not None else frozenset()
    mode = file_mode(p)
    tmp_files: list[str] = []
    try:
        if external_data:
            location = os.path.basename(p) + ".data"
            data_tmp = _temp(folder, location, tmp_files)
            blob = _serialize_external(model, data_tmp, location, threshold, names, p)
            model_tmp = _write_temp(folder, os.path.basename(p), blob, tmp_files)
            os.chmod(data_tmp, mode)
            os.chmod(model_tmp, mode)
            os.replace(data_tmp, os.path.join(folder, location))
        else:
            blob = _serialize(model, p)
            model_tmp = _write_temp(folder, os.path.basename(p), blob, tmp_files)
            os.chmod(model_tmp, mode)
        os.replace(model_tmp, p)
        tmp_files.clear()
    except OSError as e:
        raise ModelFileError(f"{p}: cannot write the model ({e.strerror or e})") from None
    finally:
        for t in tmp_files:
            try:
                os.unlink(t)
            except OSError:
                pass


def _serialize(model: onnx.ModelProto, p: str) -> bytes:
    try:
        return model.SerializeToString()
    except ValueError:
        raise ModelFileError(f"{p}: the model is over 2 GB; save it with external_data=True") from None


def _serialize_external(model, data_path: str, location: str, threshold: int, names, p: str) -> bytes:
    """Write the large tensors to ``data_path`` and return the model bytes that refer to them.

    The tensors are moved out of ``model`` only while it is serialized and put
    back afterwards, so the caller's model is unchanged and nothing is copied.
    """
    chosen = {id(t): t for t in external.initializers(model.graph) if _goes_out(t, threshold)}
    for t in external.all_tensors(model):
        if t.name in names and _goes_out(t, 0):
            chosen[id(t)] = t
    moved: list[tuple[TensorProto, bytes]] = []
    try:
        with open(data_path, "r+b") as f:
            for t in chosen.values():
                raw = t.raw_data
                offset = f.tell()
                f.write(raw)
                moved.append((t, raw))
                t.ClearField("raw_data")
                t.data_location = TensorProto.EXTERNAL
                del t.external_data[:]
                for k, v in (("location", location), ("offset", str(offset)), ("length", str(len(raw)))):
                    e = t.external_data.add()
                    e.key, e.value = k, v
            f.flush()
            os.fsync(f.fileno())
        return _serialize(model, p)
    finally:
        for t, raw in moved:
            del t.external_data[:]
            t.data_location = TensorProto.DEFAULT
            t.raw_data = raw


def _goes_out(t: TensorProto, threshold: int) -> bool:
    return t.data_location != TensorProto.EXTERNAL and t.HasField("raw_data") and len(t.raw_data) >= threshold


def _temp(folder: str, name: str, tmp_files: list[str]) -> str:
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    os.close(fd)
    tmp_files.append(tmp)
    return tmp


def _write_temp(folder: str, name: str, blob: bytes, tmp_files: list[str]) -> str:
    tmp = _temp(folder, name, tmp_files)
    with open(tmp, "r+b") as f:
        f.write(blob)
        f.flush()
        os.fsync(f.fileno())
    return tmp


