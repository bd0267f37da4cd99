"""Tensor records and pickles of a ``.pt2`` archive, checked before ``torch.export.load`` reads them.

* :func:`check_records`: every weight / constant in a payload config names a
  record of the archive whose size matches its ``tensor_meta`` (dtype, sizes,
  strides, storage offset).  torch fills a tensor whose record is *empty* with
  ``torch.zeros(sizes)``, so an empty record that declares gigabytes would
  allocate them; such a record is refused, as is one too short for its view or
  not a whole number of elements, and any size whose element count overflows.
* :func:`weights_only_problem`: a ``torch.save`` payload (sample inputs, legacy
  weights) is loaded here with ``torch.load(..., weights_only=True)``.  torch's
  own loader retries with ``weights_only=False`` when that fails; bnfold refuses
  the file instead, so the unsafe retry never happens without ``--trust``.
"""

from __future__ import annotations

import io
import re
from typing import Any

from ...errors import ModelFileError
from ..errors import one_line

MAX_ELEMENTS = 1 << 62  # no tensor of a model file may declare more elements than this
_PATH_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.]*\Z")


def element_size(code: Any, where: str) -> int:
    """Bytes per element of a serialized ``ScalarType`` code."""
    import torch
    from torch._export.serde.schema import ScalarType
    from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE

    try:
        dtype = _SERIALIZE_TO_TORCH_DTYPE[ScalarType(code)]
    except (KeyError, ValueError, TypeError):
        raise ModelFileError(f"{where} has an unknown dtype {code!r}") from None
    return torch._utils._element_size(dtype)


def _ints(values: Any, where: str) -> list[int]:
    if not isinstance(values, list):
        raise ModelFileError(f"{where} has malformed sizes or strides")
    out = []
    for v in values:
        n = v.get("as_int") if isinstance(v, dict) else None
        if type(n) is not int:
            raise ModelFileError(f"{where} has a size or stride that is not an integer")
        out.append(n)
    return out


def view_extent(meta: dict[str, Any], where: str) -> tuple[int, int]:
    """``(elements, bytes of storage the view reaches)`` for a ``tensor_meta``, checked for overflow."""
    if not isinstance(meta, dict):
        raise ModelFileError(f"{where} has no tensor_meta")
    sizes = _ints(meta.get("sizes"), where)
    strides = _ints(meta.get("strides"), where)
    offset = _ints([meta.get("storage_offset")], where)[0]
    if len(sizes) != len(strides) or any(s < 0 for s in sizes) or any(s < 0 for s in strides) or offset < 0:
        raise ModelFileError(f"{where} has negative or mismatched sizes, strides or offset")
    numel = 1
    for s in sizes:
        numel *= s
        if numel > MAX_ELEMENTS:
            raise ModelFileError(f"{where} declares more than {MAX_ELEMENTS} elements; refused")
    if numel == 0:
        return 0, 0
    last = offset + sum((s - 1) * st for s, st in zip(sizes, strides))
    return numel, (last + 1) * element_size(meta.get("dtype"), where)


def check_records(records: Any, config: dict[str, dict[str, Any]], directory: str, cfg_name: str) -> None:
    """Each non-pickled entry of a payload config must be backed by a record of the right size."""
    src = records.source
    for fqn, meta in config.items():
        if meta.get("use_pickle", False):
            continue  # refused on its own
        where = f"{src}: {cfg_name}: {fqn}"
        path_name = meta.get("path_name")
        if not isinstance(path_name, str) or not _PATH_NAME.match(path_name) or ".." in path_name:
            raise ModelFileError(f"{where} has a malformed path_name")
        if "tensor_meta" not in meta:
            continue  # not a tensor (custom / opaque objects are refused on their own)
        numel, extent = view_extent(meta["tensor_meta"], where)
        record = directory + path_name
        if record not in records.sizes:
            raise ModelFileError(f"{where}: the archive lacks its record {record}")
        have = records.sizes[record]
        itemsize = element_size(meta["tensor_meta"].get("dtype"), where)
        if have == 0 and numel > 0:
            raise ModelFileError(f"{where} declares {numel} elements but its record {record} is empty; refused")
        if have % itemsize or have < extent:
            raise ModelFileError(
                f"{where} needs {extent} bytes but its record {record} holds {have}; the file is corrupted"
            )


def weights_only_problem(blob: bytes, entry: str) -> str | None:
    """Why ``torch.load(blob, weights_only=True)`` fails (the payload is refused), or None."""
    import torch

    try:
        torch.load(io.BytesIO(blob), weights_only=True, map_location="cpu")
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure would make torch retry unsafely
        return f"{entry} is a pickle that torch.load(weights_only=True) refuses ({one_line(e)[:120]})"
    return None
