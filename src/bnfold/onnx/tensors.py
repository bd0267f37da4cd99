"""TensorProto <-> numpy <-> torch, and the dtype of a stored parameter.

The fold math (``bnfold.fold_math``) takes torch tensors; ONNX stores
TensorProtos.  These helpers only convert, they compute nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

import numpy as np
import onnx
import torch
from onnx import TensorProto, numpy_helper

from ..fold_math import FoldError, Product, Spill, discard

#: The ONNX element types whose parameters the fold can write back, as torch dtypes.
TORCH_DTYPES = {
    TensorProto.FLOAT: torch.float32,
    TensorProto.FLOAT16: torch.float16,
    TensorProto.DOUBLE: torch.float64,
    TensorProto.BFLOAT16: torch.bfloat16,
}


def type_name(elem_type: int) -> str:
    return TensorProto.DataType.Name(elem_type)


def torch_dtype(elem_type: int, what: str) -> torch.dtype:
    """The torch dtype a folded parameter is cast back to (``cast_checked`` checks range)."""
    if elem_type in TORCH_DTYPES:
        return TORCH_DTYPES[elem_type]
    raise FoldError(f"{what} has dtype {type_name(elem_type)}; only float16/bfloat16/float32/float64 parameters fold")


def elem_type(dtype: torch.dtype) -> int:
    """The ONNX element type a folded parameter of torch ``dtype`` is stored as."""
    for elem, t in TORCH_DTYPES.items():
        if t == dtype:
            return elem
    raise FoldError(f"a {dtype} parameter cannot be stored")


def is_external(t: TensorProto) -> bool:
    return t.data_location == TensorProto.EXTERNAL


def stored_key(t: TensorProto) -> tuple:
    """What names the stored bytes of the external tensor ``t``: its element type, dims and external-data entries
    (a streamed load's token, offset and length; a weight written since has other entries)."""
    return (t.data_type, tuple(t.dims), tuple((e.key, e.value) for e in t.external_data))


class ExternalReader(Protocol):
    """Reads the external data of tensors a streamed load left in place (``bnfold.io.onnx_stream``)."""

    def read(self, t: TensorProto) -> bytes | bytearray: ...  # the tensor's bytes, or a FoldError (unknown reference)

    def where(self, t: TensorProto) -> tuple[str, int, int]: ...  # its place, or a FoldError (unknown reference)

    def store(self, t: TensorProto, data: np.ndarray) -> TensorProto: ...  # ``t`` holding ``data``'s bytes

    def store_blocks(self, t: TensorProto, blocks: Iterable[np.ndarray], nbytes: int) -> TensorProto: ...  # in order

    def spill(self, nbytes: int) -> _NumpySpill | None: ...  # where a new parameter's bytes go as they are made

    def refer(self, t: TensorProto, spilled: object, nbytes: int) -> TensorProto | None: ...  # ``t`` holding them

    # ``t`` holding bytes made again where they are read: those read into the buffer at ``address``, then ``make``
    def again(
        self, t: TensorProto, address: int, nbytes: int, make: Callable[[np.ndarray], Iterator[np.ndarray]], keeps: int
    ) -> TensorProto | None: ...

    def origin(self, address: int, nbytes: int) -> TensorProto | None: ...  # the tensor read into that buffer


class _NumpySpill(Protocol):
    def write(self, block: np.ndarray) -> None: ...

    def done(self, ok: bool) -> object | None: ...


_READER: contextvars.ContextVar[ExternalReader | None] = contextvars.ContextVar("bnfold_external", default=None)


@contextlib.contextmanager
def reading_external(reader: ExternalReader) -> Iterator[None]:
    """Within the block, :func:`to_numpy` reads external tensors through ``reader`` and the fold's new
    parameters are handed to ``reader.store`` (a streamed fold keeps one tensor in memory at a time)."""
    token = _READER.set(reader)
    try:
        yield
    finally:
        _READER.reset(token)


def streamed(t: TensorProto) -> bool:
    """Whether ``t``'s data is left on disk for the active :func:`reading_external` reader (read it with
    :func:`to_numpy` when needed); a FoldError for external data no reader placed."""
    if not is_external(t):
        return False
    reader = _READER.get()
    if reader is None:
        raise FoldError(_NOT_LOADED.format(t.name))
    reader.where(t)
    return True


_NOT_LOADED = (
    "tensor {!r} keeps its data in an external file that was not loaded; "
    "pass the model path (or use bnfold.onnx.load_onnx) so the data is read safely"
)

#: element types whose raw bytes numpy reads as they are
_LITTLE_ENDIAN = {
    TensorProto.FLOAT: np.dtype("<f4"),
    TensorProto.FLOAT16: np.dtype("<f2"),
    TensorProto.DOUBLE: np.dtype("<f8"),
    TensorProto.BFLOAT16: onnx.helper.tensor_dtype_to_np_dtype(TensorProto.BFLOAT16),  # onnx's own (ml_dtypes')
    TensorProto.INT32: np.dtype("<i4"),
    TensorProto.INT64: np.dtype("<i8"),
    TensorProto.INT8: np.dtype("i1"),
    TensorProto.UINT8: np.dtype("u1"),
}


def to_numpy(t: TensorProto) -> np.ndarray:
    """The value of a tensor; external data only through the active :func:`reading_external` reader
    (never from a file the tensor names)."""
    if is_external(t):
        reader = _READER.get()
        if reader is not None:
            data = reader.read(t)
            if t.data_type in _LITTLE_ENDIAN:
                # a view of the bytes as they are: writable where the reader's buffer is (ExternalSource.read's is
                # a new one, the fold's own copy), and to_torch views it too, so a weight read here is that buffer,
                # which is how the reader tells it from its address (origin) and makes its product again at the save
                return np.frombuffer(data, dtype=_LITTLE_ENDIAN[t.data_type]).reshape(tuple(t.dims))
            copy = TensorProto()
            copy.CopyFrom(t)
            del copy.external_data[:]
            copy.data_location = TensorProto.DEFAULT
            copy.raw_data = bytes(data)
            return numpy_helper.to_array(copy)
        raise FoldError(_NOT_LOADED.format(t.name))
    return numpy_helper.to_array(t)


def to_torch(a: np.ndarray) -> torch.Tensor:
    """A torch view of a numpy array (bfloat16 via its bit pattern); a copy only where the array is read-only
    (numpy over a ``bytes`` object: torch's tensors are writable) or not contiguous."""
    a = np.ascontiguousarray(a)
    if not a.flags.writeable:
        a = a.copy()
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    if a.dtype == np.bool_ or a.dtype.kind not in "fiu":
        raise FoldError(f"cannot read a {a.dtype} tensor as a number")
    return torch.from_numpy(a)


def spill_to_reader(elem_type: int, weight: torch.Tensor | None = None) -> Callable[[int], Spill | None] | None:
    """For ``fold_math.scale_weight(deferred=)``: where the active reader keeps a new parameter of ``elem_type``
    as its checks make it (the product is then made once, :func:`from_torch` refers to those bytes); None
    outside :func:`reading_external`, and for a ``weight`` the reader can read again (:func:`_read_again`: the
    product is made again where it is read or saved, so its checks write nothing)."""
    reader = _READER.get()
    if reader is None or (weight is not None and _read_again(reader, weight) is not None):
        return None

    def spill(nbytes: int) -> Spill | None:
        into = reader.spill(nbytes)
        return None if into is None else _TorchSpill(into, elem_type)

    return spill


class _TorchSpill:
    """A ``fold_math.Spill`` writing torch blocks to a reader's numpy spill, in the byte order ONNX stores."""

    def __init__(self, into: _NumpySpill, elem_type: int) -> None:
        self.into, self.elem_type = into, elem_type

    def write(self, block: torch.Tensor) -> None:
        self.into.write(_little_endian(block, self.elem_type))

    def done(self, ok: bool) -> object | None:
        return self.into.done(ok)


def from_torch(t: torch.Tensor | Product, name: str, elem_type: int, shape=None) -> TensorProto:
    """A TensorProto named ``name`` holding ``t`` (already cast to ``elem_type``'s dtype); inside
    :func:`reading_external`, its bytes are handed to the reader (a large one goes to disk), not copied, and a
    deferred product (``fold_math.Product``) is made and handed over block by block (elsewhere, made whole), or,
    when its checks already handed the reader its bytes in this order (:func:`spill_to_reader`), refers to them."""
    reader = _READER.get()
    if isinstance(t, Product) and (reader is None or shape is not None):
        discard(t)  # its spilled bytes (if any) are not referred to: they go back before it is made
        t = t.materialize()
    if isinstance(t, Product):
        out = _header(name, elem_type, t.dtype, t.shape)
        again = t.weight.is_contiguous() and _small(t.s, t.nbytes) and _read_again(reader, t.weight) is not None
        if again:  # the weight's bytes in its row-major order are those of a tensor the reader holds: no bytes now
            keeps = t.s.untyped_storage().nbytes()  # its scales, held to the save
            stored = reader.again(out, t.weight.data_ptr(), t.nbytes, _make_again(t), keeps)
            if stored is not None:
                discard(t)
                return stored
        if t.spilled is not None and t.weight.is_contiguous():  # spilled in the weight's memory order: this one
            stored = reader.refer(out, t.spilled, t.nbytes)
            if stored is not None:
                return stored
        discard(t)  # spilled in another order: the bytes go back (where last) before it is written again
        return reader.store_blocks(out, (_little_endian(b, elem_type) for b in t.stages()), t.nbytes)
    t = t.detach().contiguous()
    if shape is not None:
        t = t.reshape(tuple(shape))
    out = _header(name, elem_type, t.dtype, t.shape)
    if reader is not None:
        return reader.store(out, _little_endian(t, elem_type))
    if elem_type == TensorProto.BFLOAT16:
        out.raw_data = _little_endian(t, elem_type).tobytes()
        return out
    return numpy_helper.from_array(t.numpy(), name)


def _read_again(reader: ExternalReader, weight: torch.Tensor) -> TensorProto | None:
    """The tensor whose bytes ``weight`` views (all of them, in its memory order: a buffer the reader read them
    into, the values as :func:`to_numpy` reads them on this little-endian machine), or None."""
    if sys.byteorder != "little" or weight.is_meta or weight.dtype not in _AGAIN_DTYPES:
        return None
    return reader.origin(weight.data_ptr(), weight.numel() * weight.element_size())


_AGAIN_DTYPES = {torch.float32, torch.float16, torch.float64, torch.bfloat16}  # to_numpy views their bytes as they are


def _small(s: torch.Tensor, nbytes: int) -> bool:
    """Whether the scales ``s`` keep memory small beside a product of ``nbytes`` (per-slice, broadcast)."""
    return s.untyped_storage().nbytes() * 8 <= nbytes


def _make_again(product: Product) -> Callable[[np.ndarray], Iterator[np.ndarray]]:
    """What makes ``product`` over a buffer that holds its weight's bytes again (keeping its scales, not the
    weight): the buffer's bytes in order, as pieces each made as it is asked for (a piece is written while it is
    in the cache)."""
    dtype, shape, s = product.dtype, product.shape, product.s

    def make(buf: np.ndarray) -> Iterator[np.ndarray]:
        for piece in Product(torch.from_numpy(buf).view(dtype).view(shape), s).stages(in_place=True):
            yield piece.view(torch.uint8).numpy()

    return make


def _header(name: str, elem_type: int, dtype: torch.dtype, dims) -> TensorProto:
    """An empty TensorProto of ``name``, ``elem_type`` and ``dims`` (``dtype``: that of its values, checked)."""
    if elem_type != TensorProto.BFLOAT16 and TORCH_DTYPES.get(elem_type) != dtype:
        raise AssertionError(f"internal: {name} is {dtype}, expected {type_name(elem_type)}")
    out = TensorProto()
    out.name = name
    out.data_type = elem_type
    out.dims.extend(dims)
    return out


def _little_endian(t: torch.Tensor, elem_type: int) -> np.ndarray:
    """A contiguous tensor's values as numpy, in the byte order ONNX stores (bfloat16 as its bit pattern)."""
    a = t.view(torch.int16).numpy() if elem_type == TensorProto.BFLOAT16 else t.numpy()
    return a.astype(a.dtype.newbyteorder("<"), copy=False)


def nbytes(t: TensorProto) -> int:
    n = int(np.prod(t.dims)) if len(t.dims) else 1
    return n * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize


def constant_attr_tensor(node: onnx.NodeProto) -> TensorProto | None:
    """The tensor a ``Constant`` node produces, or None when it is not numeric.

    Handles ``value``, ``value_float``, ``value_floats``, ``value_int`` and
    ``value_ints``; ``sparse_value``, strings and attribute references are
    not constants the fold reads.
    """
    if len(node.attribute) != 1:
        return None
    a = node.attribute[0]
    if a.ref_attr_name:
        return None
    name = node.output[0] if node.output else ""
    if a.name == "value":
        out = TensorProto()
        out.CopyFrom(a.t)
        out.name = name
        return out
    if a.name == "value_float":
        return numpy_helper.from_array(np.array(a.f, dtype=np.float32), name)
    if a.name == "value_floats":
        return numpy_helper.from_array(np.array(list(a.floats), dtype=np.float32), name)
    if a.name == "value_int":
        return numpy_helper.from_array(np.array(a.i, dtype=np.int64), name)
    if a.name == "value_ints":
        return numpy_helper.from_array(np.array(list(a.ints), dtype=np.int64), name)
    return None
