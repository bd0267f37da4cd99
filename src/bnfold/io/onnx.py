"""ONNX model files: the safe loader and the atomic saver.

The external-data layout travels as a value, from the loader to the saver::

    model, layout = load_onnx("model.onnx")        # layout is None when nothing was external
    result = bnfold.fold(model)
    save_onnx(result.model, "folded.onnx", layout=layout)

``save_onnx`` without a layout writes one file (or, for a model over
protobuf's 2 GB, uses the default layout).  Nothing is remembered about a
model between calls: a model read with plain ``onnx.load`` and saved with
the same layout gives the same files.  The command line carries the layout
from :func:`bnfold.io.models.load_model` to :func:`bnfold.io.models.save_model`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

import onnx
from google.protobuf.message import DecodeError

from ..errors import ModelFileError
from .atomic import atomic_paths, file_mode
from .files import onnx_data_path, read_model_bytes
from .limits import Limits
from .onnx_external import (
    DEFAULT_THRESHOLD,
    ExternalLayout,
    all_tensors,
    external_file_bytes,
    is_external,
    read_external,
    serialize_external,
)
from .onnx_graph import check_onnx_graph

__all__ = ["DEFAULT_THRESHOLD", "ExternalLayout", "OnnxModel", "check_opset", "load_onnx", "save_onnx"]

_PROTO_LIMIT = 2**31 - 1  # protobuf's serialization limit


class OnnxModel(NamedTuple):
    """What :func:`load_onnx` returns: the model, with its external data read in, and its layout."""

    model: onnx.ModelProto
    layout: ExternalLayout | None  # None: the file had no external data


def load_onnx(path: str | os.PathLike, limits: Limits | None = None, *, stream: bool = False) -> OnnxModel:
    """Read the ONNX model at ``path`` and its external data (refusing data outside the model's folder).

    The returned model refers to no file; ``layout`` records which tensors
    were external, for :func:`save_onnx`.  Before any external data is read the
    graph is checked (:mod:`bnfold.io.onnx_graph`): topological order, no
    cycles, bounded depth, tensor sizes within ``limits``' byte budget.  Every
    failure is a one-line ``ModelFileError`` that names the file.
    ``stream``: the same checks, but the external data stays on disk (:mod:`bnfold.io.onnx_stream`);
    fold and save the model inside ``layout.reading()``.
    """
    p = os.fspath(path)
    data = read_model_bytes(p)
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError):
        raise ModelFileError(f"{p}: not an ONNX model, or the file is truncated (it does not parse)") from None
    if model.ir_version <= 0 or not model.HasField("graph") or not model.opset_import:
        raise ModelFileError(f"{p}: not an ONNX model, or the file is truncated (no IR version, graph or opset import)")
    budget = (limits or Limits()).byte_budget(len(data) + external_file_bytes(model, p))
    check_onnx_graph(model, p, budget, all_tensors(model))
    if stream:
        from .onnx_stream import place_external

        return OnnxModel(model, place_external(model, p, budget))
    return OnnxModel(model, read_external(model, p, budget))


def check_opset(model: onnx.ModelProto, path: str) -> None:
    """Refuse a default-domain opset this onnx does not know: its operators' meaning is unknown."""
    newest = onnx.defs.onnx_opset_version()
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx") and not 1 <= imp.version <= newest:
            raise ModelFileError(
                f"{path}: uses ONNX opset {imp.version}, which is not supported "
                f"(onnx {onnx.__version__} knows opsets 1 to {newest})"
            )


def save_onnx(model: onnx.ModelProto, path: str | os.PathLike, layout: ExternalLayout | None = None) -> None:
    """Write ``model`` to ``path`` atomically; the caller's model is left as it was.

    With a ``layout`` the tensors it chooses go to ``<path>.data``, written
    first, and the model last (both or neither are replaced).  Without one
    the model is one file, unless it is over protobuf's 2 GB: then it gets
    ``ExternalLayout()`` (initializers of 1 KiB and more go outside).  Both
    files get the permissions of the model file being replaced.
    """
    p = os.path.abspath(os.fspath(path))
    folder = os.path.dirname(p)
    if not os.path.isdir(folder):
        raise ModelFileError(f"{p}: the folder {folder} does not exist")
    streamed = getattr(layout, "source", None) is not None  # a StreamedLayout: its source holds the data
    for t in all_tensors(model) if not streamed else ():
        if is_external(t):
            raise ModelFileError(
                f"{p}: tensor {t.name!r} still refers to external data that was never loaded; "
                "read the model with bnfold.onnx.load_onnx before saving it"
            )
    if layout is None and model.ByteSize() > _PROTO_LIMIT:
        layout = ExternalLayout()
    try:
        if layout is None:
            with atomic_paths([p], mode=file_mode(p)) as (model_tmp,):
                _write(model_tmp, _serialized(p, model.SerializeToString))
        else:
            data_path = onnx_data_path(p)
            with atomic_paths([data_path, p], mode=file_mode(p)) as (data_tmp, model_tmp):
                with open(data_tmp, "wb") as f:
                    write = _streamed_writer() if streamed else serialize_external
                    blob = _serialized(p, lambda: write(model, f, os.path.basename(data_path), layout))
                _write(model_tmp, blob)
    except OSError as e:
        raise ModelFileError(f"{p}: cannot write the model ({e.strerror or e})") from None
    except ModelFileError as e:
        e.names_file = e.names_file or streamed  # the streamed source's refusal (its data changed): it names the input
        raise


def _serialized(p: str, serialize: Callable[[], bytes]) -> bytes:
    """``serialize()``, with protobuf's 2 GB error as a one-line ModelFileError."""
    try:
        return serialize()
    except ValueError:
        raise ModelFileError(
            f"{p}: the model is over 2 GB; save it with external data (layout=ExternalLayout())"
        ) from None


def _streamed_writer() -> Callable:
    from .onnx_stream import serialize_streamed

    return serialize_streamed


def _write(path: str, blob: bytes) -> None:
    with open(path, "wb") as f:
        f.write(blob)
