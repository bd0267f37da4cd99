"""Evaluate the pure ops exporters put between a stored constant and the layer that reads it, so
such values count as constants: shape and cast ops (Identity aliases, a zero bias built with
Shape/Expand/CastLike, a Reshape of statistics, a ConstantOfShape fill, a Concat of shape
pieces, the Range of axes an affine is unsqueezed along) and the arithmetic of a weight computed
in the graph (weight standardization: ReduceMean, Sub, Mul, a BatchNormalization of the weight in
either mode; Add, Div, Sqrt).

What an op computes is :mod:`bnfold.onnx.semantics`' (the one copy of ONNX op semantics), run on
the numpy arrays' memory, with three exceptions: a batch norm's affine is ``fold_math``'s (the one
piece of fold arithmetic); Cast and CastLike are numpy's ``astype`` to the ONNX type; ReduceMean is
numpy's buffered float64 mean (no float64 copy of its input).  Each op is one row of :data:`RULES`: which
inputs it computes here (None otherwise), how to compute its first output and how many bytes that
allocates (:func:`result_bytes`, charged to the meter before anything is made).  Floats are computed in
float64 and cast back to the input's dtype; integers keep their integer arithmetic (Div and the
reductions take floats only).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
import torch
from onnx import NodeProto

from ..errors import FoldError
from ..fold_math import batch_norm_affine
from .nodes import attr
from .semantics import attrs, bind
from .semantics.values import is_float_dtype as _is_float

F64 = np.dtype(np.float64)


@dataclass(frozen=True)
class Rule:
    """How :func:`evaluate` computes one op type from its constant inputs.

    ``compute(node, inputs, opset)``: the first output, or None when it cannot be computed here.
    ``nbytes(node, inputs)``: the bytes ``compute`` allocates (result and float64 temporaries),
    or None to refuse.  ``reads``: whether it reads every element of its inputs (counted as FLOPs).
    """

    compute: Callable[[NodeProto, list, int | None], np.ndarray | None]
    nbytes: Callable[[NodeProto, list], int | None]
    reads: bool = True


def evaluate(
    node: NodeProto, inputs: list[np.ndarray | None], meter=None, opset: int | None = None
) -> np.ndarray | None:
    """The value of ``node``'s first output, or None when it cannot be computed here.

    ``inputs`` holds the constant inputs; for CastLike the second one may be an
    empty array that only carries the target dtype.  ``meter``
    (``bnfold.io.meter.WorkMeter``) is charged with the bytes of the result (and of the
    float64 temporaries) before they are made.  ``opset``: the model's default-domain
    opset (None: a current one), for the defaults that changed with it.
    """
    rule = RULES.get(node.op_type)
    if rule is None or not inputs or any(v is None for v in inputs):
        return None
    if meter is not None:
        nbytes = result_bytes(node, inputs)
        if nbytes is None:
            return None
        flops = sum(int(v.size) for v in inputs) if rule.reads else 0
        meter.charge(f"{node.op_type} '{node.name or node.output[0]}'", nbytes, flops)
    with np.errstate(all="ignore"):  # inf and NaN are values like any other here
        return rule.compute(node, inputs, opset)


def result_bytes(node: NodeProto, inputs: list[np.ndarray]) -> int | None:
    """The bytes ``evaluate`` allocates for ``node``'s result (0 for an alias), without making it."""
    rule = RULES.get(node.op_type)
    return None if rule is None else rule.nbytes(node, inputs)


def inputs_needed(node: NodeProto) -> list[int]:
    """Which inputs must be constant (CastLike's second input only gives a dtype; Shape reads only
    the shape of its input, which may be a computed value whose shape inference knows the dims)."""
    if node.op_type == "CastLike":
        return [0]
    if node.op_type == "Shape":
        return []
    return [i for i, n in enumerate(node.input) if n]


def shape_slice(node: NodeProto, rank: int) -> tuple[int, int]:
    """The dims ``[start, end)`` a ``Shape`` node returns of a rank-``rank`` input."""
    start = int(attr(node, "start", 0))
    end = attr(node, "end", None)
    end = rank if end is None else int(end)
    return max(0, start + rank if start < 0 else start), min(rank, end + rank if end < 0 else end)


def shape_carrier(dims) -> np.ndarray:
    """An array of shape ``dims`` that holds one byte (a broadcast view): what ``Shape`` reads."""
    return np.broadcast_to(np.zeros((), np.uint8), tuple(int(d) for d in dims))


# --------------------------------------------------------------------------- helpers


def _elements(dims) -> int:
    from ..io.sizes import elements

    return elements(dims)


def _as_f64(x: np.ndarray) -> np.ndarray:
    return x if x.dtype == F64 else x.astype(F64)


def _f64_copies(*arrays: np.ndarray) -> int:
    """The bytes of the float64 copies :func:`_as_f64` makes of ``arrays``."""
    return sum(a.size * 8 for a in arrays if a.dtype != F64)


def _cast_back(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return np.asarray(y) if dtype == F64 else np.asarray(y).astype(dtype)


def _cast_bytes(n: int, dtype: np.dtype) -> int:
    """A float64 result of ``n`` elements, plus its cast to ``dtype``."""
    return n * 8 + (0 if dtype == F64 else n * dtype.itemsize)


def _axis(axis: int, rank: int) -> int | None:
    """``axis`` in ``[0, rank)``, or None when out of range."""
    return axis % rank if -rank <= axis < rank else None


def _same_size(node: NodeProto, inputs: list) -> int:
    return inputs[0].size * inputs[0].dtype.itemsize


def _torch(v: np.ndarray, f64: bool = False) -> torch.Tensor:
    """``v``'s memory as a tensor (floats as :func:`_as_f64`'s copy when ``f64``)."""
    if f64 and _is_float(v.dtype):
        v = _as_f64(v)
    bf16 = v.dtype.kind == "V" and v.dtype.name == "bfloat16"
    if bf16:
        v = v.view(np.int16)  # torch reads its bits as int16, then views them as bfloat16
    if v.flags.writeable:  # a catch_warnings costs ~1.3 us: only where torch warns (read-only memory)
        t = torch.from_numpy(v)
    else:
        with warnings.catch_warnings():  # a read-only initializer is only read here
            warnings.simplefilter("ignore", UserWarning)
            t = torch.from_numpy(v)
    return t.view(torch.bfloat16) if bf16 else t


def _numpy(t: torch.Tensor, dtype: np.dtype) -> np.ndarray:
    """A result tensor's memory as a numpy array (``dtype`` for a bfloat16 one)."""
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(dtype)
    return t.numpy()


def _semantics(
    node: NodeProto, inputs: list, opset, f64: bool = False, float_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``node``'s first output as :mod:`.semantics` computes it, from ``inputs`` (floats in float64
    when ``f64``, else in their own dtype or ``float_dtype``)."""
    ins = [_torch(v, f64) for v in inputs]
    if float_dtype is None:
        float_dtype = next((v.dtype for v in ins if v.is_floating_point()), torch.float64)
    return bind(node, opset)(ins, attrs(node), float_dtype)[0]


def _computed(node: NodeProto, inputs: list, opset) -> np.ndarray:
    """``node``'s first output in its input's dtype, for the ops that only move or select values."""
    return _numpy(_semantics(node, inputs, opset), inputs[0].dtype)


# --------------------------------------------------------------------------- shape and cast ops


def _shape(node: NodeProto, inputs: list, opset) -> np.ndarray:
    start, end = shape_slice(node, inputs[0].ndim)
    return np.array(inputs[0].shape[start:end], dtype=np.int64)


def _transpose(node: NodeProto, inputs: list, opset) -> np.ndarray:
    # torch's copy of the permuted view, not numpy's ascontiguousarray: the same bytes, 2-3x faster on a weight (a
    # 3072x768 float32 matrix: 5.7 ms against 11.2 ms; a model's weight transposes are its constant evaluation)
    return _numpy(_semantics(node, inputs, opset).contiguous(), inputs[0].dtype)


def _fill(node: NodeProto) -> np.ndarray:
    v = attr(node, "value")
    return np.zeros(1, np.float32) if v is None else onnx.numpy_helper.to_array(v).reshape(-1)


def _constant_of_shape(node: NodeProto, inputs: list, opset) -> np.ndarray:
    fill = _fill(node)
    float_dtype = _torch(fill).dtype if _is_float(fill.dtype) else None
    return _numpy(_semantics(node, inputs, opset, float_dtype=float_dtype), fill.dtype).astype(fill.dtype, copy=False)


def _constant_of_shape_bytes(node: NodeProto, inputs: list) -> int:
    v = attr(node, "value")
    size = 4 if v is None else onnx.helper.tensor_dtype_to_np_dtype(v.data_type).itemsize
    return _elements(int(d) for d in inputs[0].reshape(-1)) * size


def _expand_shape(inputs: list) -> tuple[int, ...] | None:
    shape = tuple(int(s) for s in inputs[1].reshape(-1))
    return None if len(shape) > 64 or any(s < 0 for s in shape) else shape


def _expand(node: NodeProto, inputs: list, opset) -> np.ndarray | None:
    return None if _expand_shape(inputs) is None else _computed(node, inputs, opset)


def _expand_bytes(node: NodeProto, inputs: list) -> int | None:
    shape = _expand_shape(inputs)
    if shape is None:
        return None
    return _elements(np.broadcast_shapes(inputs[0].shape, shape)) * inputs[0].dtype.itemsize


def _cast(node: NodeProto, inputs: list, opset) -> np.ndarray:
    return inputs[0].astype(onnx.helper.tensor_dtype_to_np_dtype(int(attr(node, "to"))))


def _cast_bytes_of(node: NodeProto, inputs: list) -> int:
    return inputs[0].size * onnx.helper.tensor_dtype_to_np_dtype(int(attr(node, "to"))).itemsize


def _concat(node: NodeProto, inputs: list, opset) -> np.ndarray | None:
    axis = attr(node, "axis")
    first = inputs[0]
    if axis is None or first.ndim == 0 or any(v.dtype != first.dtype or v.ndim != first.ndim for v in inputs):
        return None
    return None if _axis(int(axis), first.ndim) is None else _computed(node, inputs, opset)


def _concat_bytes(node: NodeProto, inputs: list) -> int:
    return sum(v.size for v in inputs) * inputs[0].dtype.itemsize


# --------------------------------------------------------------------------- arithmetic

#: elementwise binary ops computed here (Div of integers is not: a weight is no integer)
BINARY = ("Add", "Sub", "Mul", "Div")
#: elementwise unary ops of floats computed here
UNARY = ("Sqrt", "Reciprocal")  # Reciprocal: the exporter's rsqrt is Reciprocal(Sqrt)


def _binary_operands(node: NodeProto, inputs: list) -> tuple[np.ndarray, np.ndarray, tuple] | None:
    """The two operands and their broadcast shape, or None when this op is not computed here: other
    dtypes, integer Div, or the broadcast of opset < 7 (``broadcast`` / ``axis`` attributes)."""
    if len(inputs) != 2:
        return None
    a, b = inputs
    if a.dtype != b.dtype or not (_is_float(a.dtype) or a.dtype.kind in "iu"):
        return None
    if node.op_type == "Div" and not _is_float(a.dtype):
        return None
    legacy = attr(node, "broadcast") is not None or attr(node, "axis") is not None
    if legacy and a.shape != b.shape:
        return None
    return a, b, np.broadcast_shapes(a.shape, b.shape)


def _binary(node: NodeProto, inputs: list, opset) -> np.ndarray | None:
    found = _binary_operands(node, inputs)
    if found is None:
        return None
    a = found[0]
    if not _is_float(a.dtype) or a.dtype == np.float32:
        # float32: one IEEE op rounds its exact result once; the float64 result (exact for +, - and x, rounded to 53
        # bits for /) cast to float32 rounds to the same bits, double rounding being innocuous from 53 >= 2 x 24 + 2
        # bits (Figueroa, 1995): computed in float32, without the float64 copies (5x faster on a standardized weight)
        return _computed(node, inputs, opset)
    return _cast_back(_semantics(node, inputs, opset, f64=True).numpy(), a.dtype)


def _binary_bytes(node: NodeProto, inputs: list) -> int | None:
    found = _binary_operands(node, inputs)
    if found is None:
        return None
    a, b, shape = found
    n = _elements(shape)
    if not _is_float(a.dtype):
        return n * a.dtype.itemsize
    # float32 is computed in float32 (:func:`_binary`) but charged as the float64 arithmetic: the budget's measure
    # of a float op stays one, whichever way it computes (tests/security's crafted chains are refused by it)
    return _f64_copies(a, b) + _cast_bytes(n, a.dtype)


def _unary(node: NodeProto, inputs: list, opset) -> np.ndarray | None:
    x = inputs[0]
    return _cast_back(_semantics(node, inputs, opset, f64=True).numpy(), x.dtype) if _is_float(x.dtype) else None


def _unary_bytes(node: NodeProto, inputs: list) -> int | None:
    x = inputs[0]
    return _f64_copies(x) + _cast_bytes(x.size, x.dtype) if _is_float(x.dtype) else None


# --------------------------------------------------------------------------- reductions and normalization


def _reduce_axes(node: NodeProto, inputs: list) -> tuple[int, ...] | None:
    """The axes ReduceMean reduces (opset >= 18: its second input; before: its attribute), every axis
    when none are given (an empty tuple: none, with ``noop_with_empty_axes``); None when invalid."""
    x = inputs[0]
    given = [int(a) for a in inputs[1].reshape(-1)] if len(inputs) > 1 else attr(node, "axes")
    if not given:
        return () if int(attr(node, "noop_with_empty_axes", 0)) else tuple(range(x.ndim))
    axes = [_axis(int(a), x.ndim) for a in given]
    if None in axes or len(set(axes)) != len(axes):
        return None
    return tuple(sorted(axes))


def _reduced_shape(node: NodeProto, x: np.ndarray, axes: tuple[int, ...]) -> tuple[int, ...]:
    keep = int(attr(node, "keepdims", 1))
    return tuple(1 if i in axes else d for i, d in enumerate(x.shape) if keep or i not in axes)


def _reduce_mean_axes(node: NodeProto, inputs: list) -> tuple[int, ...] | None:
    """The axes to reduce, or None when this ReduceMean is not computed here (not a float, an
    invalid axis, or a mean over no element)."""
    x = inputs[0]
    if not _is_float(x.dtype):
        return None
    axes = _reduce_axes(node, inputs)
    if axes is None or (axes and _elements(x.shape[a] for a in axes) == 0):
        return None
    return axes


def _reduce_mean(node: NodeProto, inputs: list, opset) -> np.ndarray | None:
    x, axes = inputs[0], _reduce_mean_axes(node, inputs)
    if axes is None:
        return None
    if not axes:
        return x.copy()
    keep = bool(int(attr(node, "keepdims", 1)))
    # numpy accumulates in float64 through a fixed-size buffer: the float64 result is the only copy (torch's
    # float64 mean of float32 would copy the input first)
    return _cast_back(np.mean(x, axis=axes, dtype=F64, keepdims=keep), x.dtype)


def _reduce_mean_bytes(node: NodeProto, inputs: list) -> int | None:
    x, axes = inputs[0], _reduce_mean_axes(node, inputs)
    if axes is None:
        return None
    if not axes:
        return x.size * x.dtype.itemsize
    return _cast_bytes(_elements(_reduced_shape(node, x, axes)), x.dtype)


def batch_norm_training(node: NodeProto, opset: int | None) -> bool:
    """Whether a BatchNormalization normalizes with the statistics of its input (``training_mode=1``;
    ``is_test=0``, the default before opset 7) instead of its mean and var inputs."""
    if opset is not None and opset < 7 and int(attr(node, "is_test", 0)) == 0:
        return True
    return bool(int(attr(node, "training_mode", 0)))


def _batch_norm_inputs(node: NodeProto, inputs: list, opset) -> tuple[np.ndarray, list[np.ndarray]] | None:
    """``(x, [scale, bias, mean, var])`` of a BatchNormalization with per-channel statistics, or
    None (spatial=0, other shapes, or not floats)."""
    if not int(attr(node, "spatial", 1)) or len(inputs) != 5:
        return None
    x, stats = inputs[0], inputs[1:]
    if x.ndim < 2 or not all(_is_float(v.dtype) for v in inputs):
        return None
    if any(s.shape != (x.shape[1],) for s in stats):
        return None
    return x, stats


def _batch_norm(node: NodeProto, inputs: list, opset) -> np.ndarray | None:
    """Output 0 of a BatchNormalization.  In training mode (weight standardization written by the
    TorchScript exporter) it normalizes with its input's own mean and population variance over
    every axis but the channel's, as the operator defines, and its mean and var inputs only feed
    the running-statistics outputs, which are no constants here."""
    found = _batch_norm_inputs(node, inputs, opset)
    if found is None:
        return None
    x, (scale, bias, mean, var) = found
    y = np.array(x, dtype=F64)  # one float64 copy, updated in place
    if batch_norm_training(node, opset):
        if y.size == 0:
            return None
        others = tuple(a for a in range(y.ndim) if a != 1)
        mean, var = y.mean(axis=others), y.var(axis=others)
    try:  # the batch norm's affine is fold math's (checked: finite statistics, var + eps > 0)
        aff = batch_norm_affine(
            *(torch.from_numpy(_as_f64(v)) for v in (mean, var)),
            float(attr(node, "epsilon", 1e-5)),
            *(torch.from_numpy(_as_f64(v)) for v in (scale, bias)),
        )
    except FoldError:
        return None
    per_channel = (-1,) + (1,) * (x.ndim - 2)
    y *= aff.scale.numpy().reshape(per_channel)
    y += aff.shift.numpy().reshape(per_channel)
    return _cast_back(y, x.dtype)


def _batch_norm_bytes(node: NodeProto, inputs: list) -> int | None:
    x = inputs[0]
    if x.ndim < 2:
        return None
    # the statistics in float64 and sqrt(var + eps); the centred float64 copy np.var makes in training
    # mode (counted always: before opset 7 the mode is the default of an attribute the file may omit)
    return _cast_bytes(x.size, x.dtype) + 6 * x.shape[1] * 8 + x.size * 8


def _identity(node: NodeProto, inputs: list, opset) -> np.ndarray:
    return inputs[0]


def _range_count(inputs: list) -> int | None:
    """How many elements ``Range(start, limit, delta)`` makes, ``max(ceil((limit - start) / delta), 0)``;
    None when an input is not a scalar, delta is 0 or a bound is not finite."""
    if any(v.size != 1 for v in inputs):
        return None
    start, limit, delta = (float(v.reshape(-1)[0]) for v in inputs)
    if delta == 0 or not all(np.isfinite((start, limit, delta))):
        return None
    return max(int(np.ceil((limit - start) / delta)), 0)


def _range(node: NodeProto, inputs: list, opset) -> np.ndarray | None:
    """``Range``: the exporter's unsqueeze axes of a normalization's affine (``Range(1, rank - 1, 1)``)."""
    n = _range_count(inputs)
    if n is None:
        return None
    start, delta = (v.reshape(-1)[0] for v in (inputs[0], inputs[2]))
    return (start + np.arange(n, dtype=inputs[0].dtype) * delta).astype(inputs[0].dtype)


def _range_bytes(node: NodeProto, inputs: list) -> int | None:
    n = _range_count(inputs)
    return None if n is None else 2 * n * inputs[0].dtype.itemsize  # the steps and the result


#: Every op type evaluated here.  Supporting another is one row.
RULES: dict[str, Rule] = {
    "Identity": Rule(_identity, lambda node, inputs: 0, reads=False),
    "Cast": Rule(_cast, _cast_bytes_of),
    "CastLike": Rule(lambda node, i, opset: i[0].astype(i[1].dtype), lambda node, i: i[0].size * i[1].dtype.itemsize),
    "Expand": Rule(_expand, _expand_bytes, reads=False),
    "Shape": Rule(_shape, lambda node, inputs: 8 * inputs[0].ndim, reads=False),
    "Reshape": Rule(_computed, _same_size, reads=False),
    "Unsqueeze": Rule(_computed, _same_size, reads=False),
    "Squeeze": Rule(_computed, _same_size, reads=False),
    "ConstantOfShape": Rule(_constant_of_shape, _constant_of_shape_bytes, reads=False),
    "Transpose": Rule(_transpose, _same_size),
    "Concat": Rule(_concat, _concat_bytes),
    "Range": Rule(_range, _range_bytes, reads=False),
    **{op: Rule(_binary, _binary_bytes) for op in BINARY},
    **{op: Rule(_unary, _unary_bytes) for op in UNARY},
    "ReduceMean": Rule(_reduce_mean, _reduce_mean_bytes),
    "BatchNormalization": Rule(_batch_norm, _batch_norm_bytes),
}

#: The op types whose first output may be a constant computed from constants.
CONST_OPS = tuple(RULES)
