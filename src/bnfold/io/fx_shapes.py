"""The shapes and dtypes of a ``torch.export`` program's values, recomputed from its ops.

A ``.pt2`` file states every value's shape in its metadata (``meta["val"]``), and the file's
author writes that metadata.  What an op really makes is decided by the op and its arguments:
``zeros([100000, 100000])`` makes 40 GB whatever ``meta["val"]`` says.  :func:`recompute` runs
every node of the program under torch's ``FakeTensorMode`` (meta kernels: shapes and dtypes,
no data, nothing allocated), fed with fakes of the program's real weights and constants and of
inputs of the given shapes.  The result is what the cost model counts.

:func:`recompute` also compares each recomputed value with the metadata the file states, and
refuses a file whose metadata disagrees (:class:`MetadataMismatch`, exit 2, naming the node and
both shapes): bnfold's fold engine and torch's own passes read that metadata, so a program whose
metadata lies cannot be folded or run faithfully (see SECURITY.md).

A value whose shape no meta kernel can tell before the op runs (``nonzero``, an ``item()``
used as a size, an op without a meta kernel) is ``None`` here: its size is checked when it
runs (:func:`bnfold.io.run_checks.before_op`).

Which program is recomputed (:func:`specs`): a program bnfold loaded from a file (:func:`from_file`) is
recomputed and compared at load, at its own example shapes; on a batch of those shapes its metadata is
then the recomputed values and is read as it is, on a batch of other shapes it is recomputed again.
A program handed to the API in memory was made by torch in the caller's process (``torch.export``):
its metadata is torch's own and is read at the batch's symbol bindings (SECURITY.md: what the
guarantees cover).
"""

from __future__ import annotations

import operator
import weakref
from typing import Any, NamedTuple

from ..errors import ModelFileError
from .sizes import concrete_dim, elements


class MetadataMismatch(ModelFileError):
    """The file states a shape or dtype for a value that its op does not compute."""


class Spec(NamedTuple):
    """A recomputed tensor: its dims and dtype (a named tuple: a program has one per value, made quickly)."""

    dims: tuple[int, ...]
    dtype: Any

    @property
    def nbytes(self) -> int:
        return elements(self.dims) * self.dtype.itemsize

    @property
    def is_float(self) -> bool:
        return self.dtype.is_floating_point or self.dtype.is_complex


def _concrete(d: Any, subs: dict) -> int | None:
    return concrete_dim(d, subs)


def _input_value(val: Any, shape: tuple | None, subs: dict, fake_mode: Any) -> Any:
    """A fake input: ``shape`` (a real batch's), else the stated example shape (bounded by the input check)."""
    import torch

    if isinstance(val, torch.Tensor):
        dims = shape if shape is not None else tuple(_concrete(d, subs) for d in val.shape)
        if any(d is None for d in dims):
            return None
        with fake_mode:  # a fake on the stated device: no memory
            return torch.empty(tuple(int(d) for d in dims), dtype=val.dtype, device=val.device)
    if isinstance(val, (torch.SymInt, int)) and not isinstance(val, bool):
        return _concrete(val, subs)
    return val


#: the programs bnfold loaded from a file -> the user-input shapes their metadata was checked at (None: not yet)
_FROM_FILE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def from_file(ep: Any) -> None:
    """Mark ``ep`` as read from a file: its metadata is believed only where :func:`recompute` checked it."""
    _FROM_FILE[ep] = None


def specs(
    ep: Any, shapes: dict[str, tuple] | None = None, *, where: str = "the program"
) -> dict[str, list[Spec] | None]:
    """What :func:`recompute` returns, for ``ep`` run on a batch of ``shapes``: recomputed for a program read
    from a file unless its metadata was checked at these shapes, else read from the metadata (see the
    module docstring)."""
    shapes = dict(shapes or {})
    if ep in _FROM_FILE and _FROM_FILE[ep] != _user_shapes(ep, shapes):
        return recompute(ep, shapes, where=where, compare=False)
    return _read_stated(ep, shapes)


def _user_shapes(ep: Any, shapes: dict[str, tuple]) -> dict[str, tuple]:
    """``shapes`` with each user input missing from it at its stated example shape."""
    import torch
    from torch.export.graph_signature import InputKind

    users = {s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT}
    out = {}
    for node in ep.graph.nodes:
        if node.op == "placeholder" and node.name in users:
            val = node.meta.get("val")
            stated = tuple(concrete_dim(d, {}) for d in val.shape) if isinstance(val, torch.Tensor) else None
            out[node.name] = tuple(shapes.get(node.name, stated) or ())
    return out


def _bind(ep: Any, shapes: dict[str, tuple]) -> dict:
    """The input symbols bound to the dims of ``shapes`` (user input name -> dims)."""
    import torch
    from torch.export.graph_signature import InputKind

    kinds = {s.arg.name: s.kind for s in ep.graph_signature.input_specs}
    shaped = {n for n, kind in kinds.items() if kind == InputKind.USER_INPUT and shapes.get(n) is not None}
    subs: dict = {}
    if not shaped:
        return subs
    for node in ep.graph.nodes:
        if node.op != "placeholder" or node.name not in shaped:
            continue
        val, real = node.meta.get("val"), shapes[node.name]
        if isinstance(val, torch.Tensor) and len(real) == val.dim():
            for d, r in zip(val.shape, real):
                if isinstance(d, torch.SymInt) and getattr(d.node.expr, "is_Symbol", False):
                    subs[d.node.expr] = int(r)
    return subs


def _read_stated(ep: Any, shapes: dict[str, tuple]) -> dict[str, list[Spec] | None]:
    """The metadata's values at the symbol bindings of ``shapes`` (a dim it cannot bind: None)."""
    import torch

    subs = _bind(ep, shapes)
    out: dict[str, list[Spec] | None] = {}
    for node in ep.graph.nodes:
        if node.op not in ("placeholder", "call_function"):
            continue
        val = node.meta.get("val")
        if node.op == "placeholder" and node.name in shapes:
            dims = tuple(shapes[node.name])
            out[node.name] = [Spec(tuple(int(d) for d in dims), val.dtype)] if hasattr(val, "dtype") else []
            continue
        if isinstance(val, torch.Tensor) and not val._has_symbolic_sizes_strides:  # most values: every size an int
            out[node.name] = [Spec(tuple(val.shape), val.dtype)]
            continue
        tensors = _stated(val)
        if val is None or (not tensors and not isinstance(val, (list, tuple))):
            out[node.name] = None if val is None or hasattr(val, "node") else []
            continue
        specs_ = []
        for t in tensors:
            dims = _stated_dims(t, subs)
            if dims is None:
                specs_ = None
                break
            specs_.append(Spec(dims, t.dtype))
        out[node.name] = specs_
    return out


def _stated_dims(t: Any, subs: dict) -> tuple[int, ...] | None:
    """The dims of the stated tensor ``t`` at the symbol bindings ``subs`` (None: a dim it cannot bind)."""
    if not t._has_symbolic_sizes_strides:  # every size a Python int
        return tuple(t.shape)
    dims = tuple(d if type(d) is int else concrete_dim(d, subs) for d in t.shape)  # an int: itself
    return None if any(d is None for d in dims) else dims


def recompute(
    ep: Any,
    shapes: dict[str, tuple] | None = None,
    *,
    where: str = "the program",
    compare: bool = True,
) -> dict[str, list[Spec] | None]:
    """``{node name: [Spec per tensor output] or None (known only when it runs)}`` for every
    placeholder and ``call_function`` node of ``ep``'s top-level graph.

    ``shapes``: ``{user input name: dims}`` (a real batch); missing inputs take the stated
    example shape (symbols at their hints).  With ``compare``, a value whose stated metadata
    disagrees with the recomputed one is refused (:class:`MetadataMismatch`).
    """
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.node import map_aggregate

    shapes = dict(shapes or {})
    fake_mode = FakeTensorMode(allow_fallback_kernels=False, allow_non_fake_inputs=False)
    specs = {s.arg.name: s for s in ep.graph_signature.input_specs}
    subs = _bind(ep, shapes)
    env: dict[Any, Any] = {}
    out: dict[str, list[Spec] | None] = {}
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            spec = specs.get(node.name)
            real = _lifted(ep, spec)
            if isinstance(real, torch.Tensor):
                env[node] = fake_mode.from_tensor(real, static_shapes=True)
            else:
                env[node] = _input_value(node.meta.get("val"), shapes.get(node.name), subs, fake_mode)
        elif node.op == "call_function":
            env[node] = _run(node, env, fake_mode, map_aggregate, where if compare else None)
        else:
            continue
        value = env[node]
        out[node.name] = None if value is _UNKNOWN else _specs(value)
        if compare and out[node.name] is not None:
            _compare(node, out[node.name], subs, where)
            _compare_layout(node, value, where)
    if compare and ep in _FROM_FILE:  # checked: at these shapes the metadata is the recomputed values
        _FROM_FILE[ep] = _user_shapes(ep, shapes)
    return out


_UNKNOWN = object()


def _lifted(ep: Any, spec: Any) -> Any:
    """The real tensor behind a parameter / buffer / constant placeholder, else None."""
    from torch.export.graph_signature import InputKind

    if spec is None or spec.kind == InputKind.USER_INPUT:
        return None
    target = spec.target
    if target in ep.state_dict:
        return ep.state_dict[target]
    return ep.constants.get(target)


def _run(node: Any, env: dict, fake_mode: Any, map_aggregate: Any, where: str | None) -> Any:
    """The node's fake value, or ``_UNKNOWN``; an op that rejects its inputs is refused when ``where``
    is given (the load's check), else unknown too."""
    import torch

    unknown = False

    def resolve(a):
        nonlocal unknown
        if isinstance(a, torch.fx.Node):
            v = env.get(a, _UNKNOWN)
            if v is _UNKNOWN or v is None and a.op == "placeholder":
                unknown = True
            return v
        return a

    args = map_aggregate(node.args, resolve)
    kwargs = map_aggregate(node.kwargs, resolve)
    if unknown:
        return _UNKNOWN
    if node.target is operator.getitem:
        try:
            return args[0][args[1]]
        except Exception:  # noqa: BLE001 - not indexable here: unknown
            return _UNKNOWN
    if isinstance(node.target, torch._ops.HigherOrderOperator):
        return _UNKNOWN  # bodies are graphs of their own; the audit refuses these, fold / check do not run them
    try:
        with fake_mode:
            value = node.target(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        if where is None or _cannot_tell(e):  # data-dependent, or no meta kernel: only running tells
            return _UNKNOWN
        shown = ", ".join(str(list(env[a].shape)) for a in node.all_input_nodes if isinstance(env.get(a), torch.Tensor))
        raise MetadataMismatch(
            f"{where}: node {node.name!r} ({getattr(node.target, '__name__', node.target)}) fails on its inputs"
            f"{' (' + shown + ')' if shown else ''} and arguments: {_first_line(e)}; the program is inconsistent; "
            "refused"
        ) from None
    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        return _UNKNOWN
    return value


def _cannot_tell(e: BaseException) -> bool:
    """A fake run that cannot know the result (data-dependent sizes, an op without a meta kernel), as
    opposed to an op that rejects its inputs' shapes or its arguments."""
    from torch._subclasses import fake_tensor as ft

    kinds = tuple(
        k
        for k in (
            getattr(ft, "DataDependentOutputException", None),
            getattr(ft, "DynamicOutputShapeException", None),
            getattr(ft, "UnsupportedOperatorException", None),
            getattr(ft, "UnsupportedFakeTensorException", None),
            getattr(ft, "MetadataMismatchError", None),
        )
        if isinstance(k, type)
    )
    if isinstance(e, kinds + (NotImplementedError,)):
        return True
    import torch

    return isinstance(e, getattr(torch.fx.experimental.symbolic_shapes, "GuardOnDataDependentSymNode", ()))


def _first_line(e: BaseException) -> str:
    from .errors import one_line

    return one_line(e)


def _specs(value: Any) -> list[Spec] | None:
    import torch

    if isinstance(value, torch.Tensor):
        try:
            return [Spec(tuple(int(d) for d in value.shape), value.dtype)]
        except Exception:  # noqa: BLE001 - a symbolic size: unknown
            return None
    if isinstance(value, (list, tuple)):
        out = []
        for v in value:
            s = _specs(v)
            if s is None:
                return None
            out.extend(s)
        return out
    return []


def _stated(val: Any) -> list:
    import torch

    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        return [t for v in val for t in _stated(v)]
    return []


#: ops that read their input's storage layout, not only its values: the fold reads the stated strides of their
#: input (``torch_export.ops.hop_is_exact``), so those strides are checked like shapes
LAYOUT_READERS = frozenset({"as_strided.default", "as_strided_copy.default"})


def _compare_layout(node: Any, value: Any, where: str) -> None:
    """Refuse a value read by a layout reader whose stated strides differ from the recomputed ones."""
    import torch

    if not any(getattr(u.target, "__name__", "") in LAYOUT_READERS for u in node.users):
        return
    stated = node.meta.get("val")
    if not isinstance(stated, torch.Tensor) or not isinstance(value, torch.Tensor):
        return
    try:
        said, real = tuple(int(d) for d in stated.stride()), tuple(int(d) for d in value.stride())
    except Exception:  # noqa: BLE001 - symbolic strides: the fold does not use them (hop_is_exact)
        return
    if said != real:
        raise MetadataMismatch(
            f"{where}: node {node.name!r} ({getattr(node.target, '__name__', node.target)}) computes strides "
            f"{list(real)} but the file states {list(said)}; the file's metadata does not match its ops; refused"
        )


def _compare(node: Any, specs: list[Spec], subs: dict, where: str) -> None:
    """Refuse a value whose stated ``meta["val"]`` differs from the recomputed one."""
    stated = _stated(node.meta.get("val"))
    if not stated:
        return
    label = f"node {node.name!r} ({getattr(node.target, '__name__', node.target)})"
    if len(stated) != len(specs):
        raise MetadataMismatch(
            f"{where}: {label} computes {len(specs)} tensor(s) but the file states {len(stated)}; "
            "the file's metadata does not match its ops; refused"
        )
    for t, s in zip(stated, specs):
        dims = [_concrete(d, subs) for d in t.shape]
        shown = [d if d is not None else "?" for d in dims]
        bad = len(dims) != len(s.dims) or any(d is not None and d != r for d, r in zip(dims, s.dims))
        if bad or t.dtype != s.dtype:
            raise MetadataMismatch(
                f"{where}: {label} computes {list(s.dims)} {_dtype(s.dtype)} but the file states {shown} "
                f"{_dtype(t.dtype)}; the file's metadata does not match its ops; refused"
            )


def _dtype(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")
