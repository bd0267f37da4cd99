"""What every ONNX op implementation reads: its attributes, the values known ahead of time among its
inputs (shapes, axes, pads, as Python numbers), and the context of one call (:class:`Ctx`)."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import onnx
import torch
from onnx import numpy_helper


class Ctx(NamedTuple):
    """One call of an op: the model's default-domain opset (None: a current one), how many outputs the
    node names, and the float dtype the run computes in (float32 emulated, float64 reference)."""

    opset: int | None
    n_out: int
    float_dtype: torch.dtype


@dataclass(frozen=True)
class OpImpl:
    """One op type's row: ``fn(inputs, attributes, ctx)``; ``static``: the inputs read as Python numbers
    (shapes, axes, pads, bounds: known ahead of time); ``refuses(attributes, node)``: why ``fn`` does not
    compute this form of the op (run by the reference evaluator instead), or None."""

    fn: Callable
    static: tuple[int, ...] = ()
    refuses: Callable[[dict, onnx.NodeProto], str | None] | None = None


def opset_of(model: onnx.ModelProto) -> int | None:
    """The model's default-domain opset, or None when it declares none."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def since(c: Ctx, version: int) -> bool:
    """Whether the op follows its definition of opset ``version`` or later."""
    return c.opset is None or c.opset >= version


def _is_fake(v) -> bool:
    return type(v).__name__ in ("FakeTensor", "FunctionalTensor")


def ints(v) -> list[int]:
    """The integers of a value known ahead of time (a numpy array, a tensor or a Python sequence)."""
    if isinstance(v, torch.Tensor):
        if torch.compiler.is_compiling() or isinstance(v, torch.fx.Proxy) or _is_fake(v):
            raise NotImplementedError(
                "a shape or axes input is computed from the model's data; the ONNX audit needs static shapes"
            )
        if v.is_floating_point():
            raise NotImplementedError("a shape or axes input holds floating-point values")
        return [int(x) for x in (v if v.dim() == 1 else v.reshape(-1)).tolist()]  # no view op for a vector
    return [int(x) for x in np.asarray(v).reshape(-1).tolist()]


def floats(v) -> list[float]:
    """The numbers of a value known when the op runs (scales of a Resize), as Python floats."""
    if isinstance(v, torch.Tensor):
        return [float(x) for x in v.reshape(-1).tolist()]
    return [float(x) for x in np.asarray(v).reshape(-1).tolist()]


def scalar(v) -> float | int:
    """The one number of a scalar (or one-element) input (of a larger one, its first)."""
    if isinstance(v, torch.Tensor):
        return (v if v.numel() == 1 else v.reshape(-1)[0]).item()  # one op for a scalar, not three
    return np.asarray(v).reshape(-1)[0].item()


def given(ins: list, i: int) -> bool:
    """Whether optional input ``i`` is given (present, not the empty name, not an empty tensor)."""
    return len(ins) > i and ins[i] is not None and (not isinstance(ins[i], torch.Tensor) or ins[i].numel() > 0)


def attrs(node: onnx.NodeProto) -> dict:
    """``{name: value}`` of the node's attributes, as ``onnx.helper.get_attribute_value`` reads them (the
    common kinds read here: it tests the kinds one by one; a reference attribute is its ValueError)."""
    out = {}
    for a in node.attribute:
        read = None if a.ref_attr_name else _READ.get(a.type)
        out[a.name] = onnx.helper.get_attribute_value(a) if read is None else read(a)
    return out


_A = onnx.AttributeProto
_READ: dict[int, Callable] = {
    _A.FLOAT: lambda a: a.f,
    _A.INT: lambda a: a.i,
    _A.STRING: lambda a: a.s,
    _A.TENSOR: lambda a: a.t,
    _A.FLOATS: lambda a: list(a.floats),
    _A.INTS: lambda a: list(a.ints),
    _A.STRINGS: lambda a: list(a.strings),
}


def s(v):
    """A string attribute as ``str``."""
    return v.decode() if isinstance(v, bytes) else v


#: element type -> (the field that holds its values when not raw, its numpy dtype): the types
#: :func:`array` reads itself
_PLAIN = {
    onnx.TensorProto.FLOAT: ("float_data", np.float32),
    onnx.TensorProto.DOUBLE: ("double_data", np.float64),
    onnx.TensorProto.INT32: ("int32_data", np.int32),
    onnx.TensorProto.INT64: ("int64_data", np.int64),
}


def array(t: onnx.TensorProto) -> np.ndarray:
    """``numpy_helper.to_array(t)``: the same array, read here for a float32 / float64 / int32 / int64
    tensor that holds its data (a third of the time, the per-tensor overhead of ``to_array``, which a
    model of hundreds of small ``Constant`` nodes pays hundreds of times); any other to ``to_array``."""
    plain = _PLAIN.get(t.data_type)
    if t.data_location == onnx.TensorProto.EXTERNAL:
        from ..tensors import to_numpy

        return to_numpy(t)  # through the streamed load's reader, never a file the tensor names
    if plain is None or t.HasField("segment") or _BIG_ENDIAN:
        return numpy_helper.to_array(t)
    field, dtype = plain
    if t.HasField("raw_data"):
        return np.frombuffer(t.raw_data, dtype=dtype).reshape(t.dims[:])
    values = getattr(t, field)
    if len(values) <= 64:  # numpy reads a few values faster from a list than from the protobuf field
        values = values[:]
    return np.array(values, dtype=dtype).reshape(t.dims[:])


_BIG_ENDIAN = sys.byteorder == "big"


def constant(a: dict) -> np.ndarray:
    """A ``Constant`` node's value as a numpy array (known ahead of time)."""
    k, v = next(iter(a.items()))
    if k == "value":
        return array(v)
    if k == "sparse_value":
        raise NotImplementedError("a sparse Constant is not supported")
    if k.startswith("value_string"):
        return np.array(v, dtype=object)
    return np.array(v, dtype=np.float32 if k.startswith("value_float") else np.int64)


def is_float_dtype(dtype: np.dtype) -> bool:
    """A numpy float dtype, ml_dtypes' bfloat16 included (its kind is ``V``; a dtype's name costs ~1.4 us, its kind
    0.05, so the name is read only for that kind)."""
    return dtype.kind == "f" or dtype.kind == "V" and dtype.name == "bfloat16"


def tensor(v, float_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``v`` (a numpy array, a number) as a tensor: floats in ``float_dtype``, integers int64."""
    if isinstance(v, torch.Tensor):
        return v
    a = np.asarray(v)
    if is_float_dtype(a.dtype):
        return torch.from_numpy(a.astype(np.float64)).to(float_dtype)
    if a.dtype == np.bool_:
        return torch.from_numpy(a.copy())
    return torch.from_numpy(a.astype(np.int64))


def axis(ax: int, rank: int) -> int:
    """``ax`` (negative counts from the end) in ``[0, rank)``."""
    if not -rank <= ax < max(rank, 1):
        raise ValueError(f"axis {ax} is out of range for rank {rank}")
    return ax % max(rank, 1)


def pads_same(in_sz: int, k: int, st: int, d: int, mode: str) -> tuple[int, int]:
    """The (begin, end) pads of ``auto_pad`` SAME_UPPER / SAME_LOWER along one axis."""
    out = math.ceil(in_sz / st)
    total = max(0, (out - 1) * st + (k - 1) * d + 1 - in_sz)
    begin = total // 2 if mode == "SAME_UPPER" else total - total // 2
    return begin, total - begin
