"""ONNX external data: the :class:`ExternalLayout` value, reading a model's
external data safely, and writing tensors out to a data file.

An ``ExternalLayout`` says which tensors a saved model keeps in its data file.
:func:`bnfold.io.onnx.load_onnx` returns the layout of the file it read, and
:func:`bnfold.io.onnx.save_onnx` takes one explicitly: it is a plain value,
not a mark hidden on the model, so the same model saves the same way however
it was read.

Reading refuses data that lives outside the model's folder (absolute
locations, ``..`` components, links that lead elsewhere) and data files too
short for their tensors, with one-line ``ModelFileError`` messages.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

import onnx
from onnx import TensorProto

from ..errors import ModelFileError
from .limits import MAX_BYTES_HINT
from .onnx_graph import tensor_elements

DEFAULT_THRESHOLD = 1024  # bytes; onnx's own default for external data


@dataclass(frozen=True)
class ExternalLayout:
    """Which tensors a saved ONNX model keeps in its external data file.

    ``names``: tensors stored there whatever their size (for a loaded model,
    the ones its file kept there; names the model no longer has are ignored).
    ``threshold``: initializers of at least this many bytes are stored there
    too.  The data file is always ``<model file name>.data`` beside the model,
    never the source's own data file, which the source may still need.
    """

    names: frozenset[str] = frozenset()
    threshold: int = DEFAULT_THRESHOLD

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", frozenset(self.names))
        if self.threshold < 0:
            raise ValueError(f"ExternalLayout threshold must be >= 0 bytes, not {self.threshold}")


# ----------------------------------------------------------------------------- walking tensors


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    yield from graph.initializer
    for sp in graph.sparse_initializer:
        yield sp.values
        yield sp.indices
    for node in graph.node:
        yield from _node_tensors(node)


def _node_tensors(node: onnx.NodeProto) -> Iterator[TensorProto]:
    for a in node.attribute:
        if a.HasField("t"):
            yield a.t
        yield from a.tensors
        if a.HasField("sparse_tensor"):
            yield a.sparse_tensor.values
            yield a.sparse_tensor.indices
        for sp in a.sparse_tensors:
            yield sp.values
            yield sp.indices
        if a.HasField("g"):
            yield from _graph_tensors(a.g)
        for g in a.graphs:
            yield from _graph_tensors(g)


def all_tensors(model: onnx.ModelProto) -> Iterator[TensorProto]:
    """Every tensor of the model: initializers and attribute tensors, in subgraphs, functions and
    ``training_info`` (initialization and algorithm graphs) too."""
    yield from _graph_tensors(model.graph)
    for info in model.training_info:
        yield from _graph_tensors(info.initialization)
        yield from _graph_tensors(info.algorithm)
    for f in model.functions:
        for node in f.node:
            yield from _node_tensors(node)


def initializers(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    """Initializers of ``graph`` and of all its subgraphs."""
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("g"):
                yield from initializers(a.g)
            for g in a.graphs:
                yield from initializers(g)


def is_external(t: TensorProto) -> bool:
    return t.data_location == TensorProto.EXTERNAL


# ----------------------------------------------------------------------------- reading


_DRIVE = re.compile(r"^[A-Za-z]:")


def read_external(model: onnx.ModelProto, path: str, budget: int | None = None) -> ExternalLayout | None:
    """Read the external data of ``model`` (parsed from ``path``) into its tensors.

    Returns the layout that keeps those tensors external on save (the
    threshold is the smallest of them, at most :data:`DEFAULT_THRESHOLD`), or
    None when the model had no external data.  Each byte of a data file backs
    one tensor at most, and all of them together at most ``budget`` bytes, so a
    small file cannot be read into memory many times over.
    """
    base = os.path.dirname(os.path.abspath(path))
    names: set[str] = set()
    smallest = DEFAULT_THRESHOLD
    ranges: dict[str, list[tuple[int, int, str]]] = {}
    total = 0
    files: dict[str, tuple[str, int, tuple[int, int]]] = {}
    for t in all_tensors(model):
        if is_external(t):
            real, offset, length = _locate(t, base, path, files)
            total += length
            ranges.setdefault(real, []).append((offset, length, t.name))
    _check_overlaps(ranges, path)
    if budget is not None and total > budget:
        raise ModelFileError(f"{path}: the external data adds up to {total} bytes, over {budget}; {MAX_BYTES_HINT}")
    read: dict[str, tuple[str, int, tuple[int, int]]] = {}  # checked again as they are read
    for t in all_tensors(model):
        if is_external(t):
            t.raw_data = _read_range(*_locate(t, base, path, read), path, file_ids(read))
            t.data_location = TensorProto.DEFAULT
            del t.external_data[:]
            names.add(t.name)
            smallest = min(smallest, len(t.raw_data))
    return ExternalLayout(frozenset(names), smallest) if names else None


def external_file_bytes(model: onnx.ModelProto, path: str) -> int:
    """Total size of the distinct external-data files ``model`` refers to (0 for any that cannot be used).

    Part of the base of the byte budget: a model whose weights live beside it
    may unpack to as much as the model file plus its data files.
    """
    base = os.path.dirname(os.path.abspath(path))
    seen: dict[str, int] = {}
    files: dict[str, tuple[str, int, tuple[int, int]]] = {}
    for t in all_tensors(model):
        if is_external(t):
            try:
                real = _locate(t, base, path, files)[0]
            except ModelFileError:
                continue  # reported when the data is read
            seen[real] = os.path.getsize(real)
    return sum(seen.values())


def _check_overlaps(ranges: dict[str, list[tuple[int, int, str]]], path: str) -> None:
    """A byte range of a data file may back one tensor only."""
    for real, spans in ranges.items():
        spans.sort()
        end, owner = -1, ""
        for offset, length, name in spans:
            if length == 0:
                continue
            if offset < end:
                raise ModelFileError(
                    f"{path}: tensors {owner!r} and {name!r} read the same bytes of {os.path.basename(real)!r}; "
                    "each byte of external data may back one tensor only"
                )
            end, owner = offset + length, name


def _read_range(real: str, offset: int, length: int, path: str, ids: dict[str, tuple[int, int]]) -> bytes:
    """``length`` bytes at ``offset`` of the regular file ``real``, checked on the open descriptor to be the file
    located (``ids``: :func:`file_ids`)."""
    fd = open_regular(real, path, ids[real])
    try:
        return read_exactly(fd, real, offset, length, path)
    finally:
        os.close(fd)


def read_exactly(fd: int, real: str, offset: int, length: int, path: str) -> bytes:
    """``length`` bytes at ``offset`` of the open data file ``real``, read again where a read returns fewer (Linux
    returns at most 2147479552 bytes a call); a file too short for them (a read that returns nothing) has changed."""
    data = os.pread(fd, length, offset) if length else b""
    if len(data) == length:
        return data
    parts, got = [data], len(data)
    while got < length and data:
        data = os.pread(fd, length - got, offset + got)
        parts.append(data)
        got += len(data)
    if got != length:
        raise changed(path, real)
    return b"".join(parts)


def changed(path: str, real: str, why: str = "") -> ModelFileError:
    """The one-line error for the data file ``real`` of the model ``path`` changing under bnfold."""
    return ModelFileError(f"{path}: external data {os.path.basename(real)!r} changed while it was read{why}")


def open_regular(real: str, path: str, located: tuple[int, int] | None = None) -> int:
    """A read-only descriptor of ``real``, checked to be a regular file on the descriptor (never waits on a
    FIFO) and, given ``located`` (the ``(st_dev, st_ino)`` :func:`_locate` found at ``real``), to be that file: a
    path replaced since (by a link out of the model's folder, say) is refused; a one-line ModelFileError naming the
    model ``path`` otherwise."""
    try:
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise ModelFileError(f"{path}: cannot read external data {real} ({e.strerror or e})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ModelFileError(f"{path}: external data {os.path.basename(real)!r} is not a regular file; refused")
    if located is not None and ((st.st_dev, st.st_ino) != located or _opened_path(fd) not in (None, real)):
        os.close(fd)  # another file, or this one reached through a folder made a link since the check
        raise changed(path, real, " (not the file its location was checked to be)")
    return fd


def _opened_path(fd: int) -> str | None:
    """The path the kernel opened ``fd`` by, every link resolved (Linux's ``/proc/self/fd``), or None where the
    system does not say."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def file_ids(files: dict[str, tuple[str, int, tuple[int, int]]]) -> dict[str, tuple[int, int]]:
    """The ``(st_dev, st_ino)`` of each data file :func:`_locate` checked (``files``: its memo), by real path."""
    return {real: ident for real, _, ident in files.values()}


def _locate(
    t: TensorProto, base: str, path: str, files: dict[str, tuple[str, int, tuple[int, int]]] | None = None
) -> tuple[str, int, int]:
    """``(real path, offset, length)`` of a tensor's external data, checked against the data file.  ``files``: the
    data files already checked in this pass, by location (``(real path, size, (st_dev, st_ino))``): a model's many
    tensors in one file resolve it once (each resolution walks the path's links: 0.1 s for a 1 GB model's 193
    tensors, twice); whoever opens the file then checks it is the one checked (:func:`open_regular`'s
    ``located``)."""
    info = {e.key: e.value for e in t.external_data}
    loc = info.get("location", "")
    where = f"{path}: external data of tensor {t.name!r}"
    found = files.get(loc) if files is not None else None
    if found is None:
        found = _data_file(loc, base, where)
        if files is not None:
            files[loc] = found
    real, size, _ = found
    try:
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else None
    except ValueError:
        raise ModelFileError(f"{where} has a non-integer offset or length") from None
    if offset < 0 or (length is not None and length < 0):
        raise ModelFileError(f"{where} has a negative offset or length")
    if length is None:
        length = size - offset
    if offset + length > size:
        raise ModelFileError(
            f"{where}: the data file {loc!r} is truncated (needs bytes {offset}..{offset + length}, has {size})"
        )
    expected = _expected_bytes(t, where)
    if expected is not None and expected != length:
        raise ModelFileError(f"{where} holds {length} bytes, but the tensor needs {expected}")
    return real, offset, length


def _data_file(loc: str, base: str, where: str) -> tuple[str, int, tuple[int, int]]:
    """``(real path, size, (st_dev, st_ino))`` of the data file at ``loc``: a regular file in the model's folder
    ``base``."""
    if not loc:
        raise ModelFileError(f"{where} has no location")
    if "\0" in loc:  # no file has one (and the streamed load's own tokens start with one)
        raise ModelFileError(f"{where} has a NUL byte in its location {loc!r}; refused")
    if os.path.isabs(loc) or loc.startswith(("/", "\\")) or _DRIVE.match(loc):
        raise ModelFileError(f"{where} uses the absolute path {loc!r}; only files in the model's folder are read")
    if ".." in re.split(r"[/\\]", loc):
        raise ModelFileError(f"{where} at {loc!r} escapes the model's folder; only files in it are read")
    real_base = os.path.realpath(base)
    real = os.path.realpath(os.path.join(base, loc))
    if os.path.commonpath([real, real_base]) != real_base:
        raise ModelFileError(f"{where} at {loc!r} resolves outside the model's folder (a symlink?); refused")
    if not os.path.lexists(real):
        raise ModelFileError(f"{where}: the data file {loc!r} is missing next to the model")
    try:
        st = os.lstat(real)  # the path resolved: a link made there since is no regular file
    except OSError:
        st = None
    if st is None or not stat.S_ISREG(st.st_mode):
        raise ModelFileError(f"{where}: the data file {loc!r} is not a regular file; refused")
    return real, st.st_size, (st.st_dev, st.st_ino)


def _expected_bytes(t: TensorProto, where: str) -> int | None:
    if t.data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
        return None
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except (KeyError, ValueError, TypeError):
        return None
    name = TensorProto.DataType.Name(t.data_type)
    if name in ("INT4", "UINT4", "INT2", "UINT2") or name.startswith(("FLOAT4", "FLOAT6")):
        return None  # packed sub-byte types
    return tensor_elements(list(t.dims), where) * itemsize


# ----------------------------------------------------------------------------- writing


def chosen_tensors(model: onnx.ModelProto, layout: ExternalLayout) -> list[TensorProto]:
    """The tensors ``layout`` sends to the data file, each once, in model order."""
    chosen = {id(t): t for t in initializers(model.graph) if _goes_out(t, layout.threshold)}
    for t in all_tensors(model):
        if t.name in layout.names and _goes_out(t, 0):
            chosen[id(t)] = t
    return list(chosen.values())


def serialize_external(model: onnx.ModelProto, data: BinaryIO, location: str, layout: ExternalLayout) -> bytes:
    """Write the tensors ``layout`` chooses to ``data`` and return the model bytes that refer to them.

    The tensors are moved out of ``model`` only while it is serialized and put
    back afterwards, so the caller's model is unchanged and nothing is copied.
    Raises ``ValueError`` when what stays in the model is over protobuf's 2 GB.
    """
    moved: list[tuple[TensorProto, bytes]] = []
    try:
        for t in chosen_tensors(model, layout):
            raw = t.raw_data
            offset = data.tell()
            data.write(raw)
            moved.append((t, raw))
            t.ClearField("raw_data")
            t.data_location = TensorProto.EXTERNAL
            _set_entries(t, (("location", location), ("offset", str(offset)), ("length", str(len(raw)))))
        return model.SerializeToString()
    finally:
        for t, raw in moved:
            del t.external_data[:]
            t.data_location = TensorProto.DEFAULT
            t.raw_data = raw


def _set_entries(t: TensorProto, entries: Iterable[tuple[str, str]]) -> None:
    del t.external_data[:]
    for k, v in entries:
        e = t.external_data.add()
        e.key, e.value = k, v


def _goes_out(t: TensorProto, threshold: int) -> bool:
    return not is_external(t) and t.HasField("raw_data") and len(t.raw_data) >= threshold
