"""The cost model: what running a graph will allocate and compute, added up before it runs.

Every tensor the audit (or a constant evaluator) creates has a shape known
beforehand: a ``torch.export`` node's ``meta["val"]``, ONNX shape inference.
:func:`fx_plan` / :func:`onnx_plan` add up, in graph order, the bytes live at
once (a value is freed after its last reader) and the FLOPs of the plan, and
refuse with one line naming the op and its size (:class:`WorkError`, exit 2)
when they exceed the :class:`Budget`:

* bytes: ``max(256 MiB, 16 x the weights) + 4 x one batch of inputs`` (an
  activation of a real model is of that order: a layer's output is its
  input's size times a few channels, or the weights' size times a few); one
  batch of inputs may itself take at most a quarter of the weights' part;
* FLOPs: ``256 x`` the byte budget, for all the runs the audit makes;
* at most :data:`MAX_BATCHES` batches.

``--max-work N`` (:func:`max_work`, a context, or ``load_model(max_work=)``)
sets the byte budget to N (and the FLOPs to 256 N) for a model that is really
that big.  :class:`Meter` is the running check for constant evaluators: the
bytes of the values they hold (each freed when they drop it) and the FLOPs of
all they computed; past the budget they stop.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import ModelFileError

MIB = 1 << 20
FLOOR_BYTES = 256 * MIB
CONTENT_MULTIPLE = 16
INPUT_MULTIPLE = 4
FLOPS_PER_BYTE = 256
NODE_FLOPS = 10_000  # the fixed cost of running one node (dispatch), counted as FLOPs
MAX_BATCHES = 10_000
MAX_ELEMENTS = 1 << 62
#: A constant evaluator drops a computed value this big or bigger once its last reader is computed; a
#: smaller one stays (counted) so that a long chain of small values is never computed again per node.
FREE_MIN_BYTES = 64 << 10
MAX_WORK_HINT = "pass --max-work N (bytes) to allow more if the model really is that big"


class WorkError(ModelFileError):
    """Running the model would allocate or compute more than its content justifies."""


@dataclass(frozen=True)
class Budget:
    """Bytes live at once and FLOPs in all that one model may make bnfold use."""

    bytes: int
    flops: int

    @classmethod
    def for_content(cls, weights: int, inputs: int = 0, override: int | None = None) -> Budget:
        """The budget of a model whose weights hold ``weights`` bytes, run on ``inputs`` bytes of one batch."""
        override = current_override() if override is None else override
        b = (
            override
            if override
            else max(FLOOR_BYTES, CONTENT_MULTIPLE * max(0, int(weights))) + INPUT_MULTIPLE * inputs
        )
        return cls(b, FLOPS_PER_BYTE * b)

    @classmethod
    def for_inputs(cls, weights: int, override: int | None = None) -> int:
        """The most bytes one batch of inputs may take for a model with ``weights`` bytes of weights."""
        return cls.for_content(weights, 0, override).bytes // INPUT_MULTIPLE


_OVERRIDE: contextvars.ContextVar[int | None] = contextvars.ContextVar("bnfold_max_work", default=None)


def current_override() -> int | None:
    return _OVERRIDE.get()


@contextlib.contextmanager
def max_work(n: int | None) -> Iterator[None]:
    """Within the block, every budget is ``n`` bytes (and ``256 n`` FLOPs); None keeps the default."""
    token = _OVERRIDE.set(n or None)
    try:
        yield
    finally:
        _OVERRIDE.reset(token)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"


def elements(dims: Iterable[int]) -> int:
    """The element count of ``dims`` in Python integers (capped just over 2**62, never wrapping)."""
    n = 1
    for d in dims:
        n *= max(int(d), 0)
        if n > MAX_ELEMENTS:
            return MAX_ELEMENTS + 1
    return n


# ----------------------------------------------------------------------------- running check


class Meter:
    """The running check of a constant evaluator: the bytes of the values it holds now and the FLOPs of
    all it computed.

    :meth:`charge` counts what an op is about to create (its result and temporaries) on top of what is
    alive and refuses past the budget; :meth:`keep` then says how much of that the kept value holds (the
    temporaries are gone), and :meth:`free` / :meth:`free_all` drop the values the evaluator no longer
    holds (a value is freed once its last constant reader is computed; all of them when the graph is
    edited).  FLOPs are never freed: recomputing a dropped value costs again.
    """

    def __init__(self, budget: Budget, where: str = ""):
        self.budget, self.where = budget, where
        self.bytes = self.flops = self.peak = 0
        self._held: dict[Any, int] = {}

    def charge(self, op: str, nbytes: int, flops: int = 0) -> None:
        """Count what ``op`` is about to create and compute; :class:`WorkError` past the budget."""
        self.bytes += nbytes
        self.peak = max(self.peak, self.bytes)
        self.flops += flops + NODE_FLOPS
        prefix = f"{self.where}: " if self.where else ""
        if nbytes > self.budget.bytes or self.bytes > self.budget.bytes:
            raise WorkError(
                f"{prefix}computing the constant {op} would create {_size(nbytes)} (constants alive with it: "
                f"{_size(self.bytes)}), over the budget of {_size(self.budget.bytes)}; {MAX_WORK_HINT}"
            )
        if self.flops > self.budget.flops:
            raise WorkError(
                f"{prefix}computing the constant {op} takes the constants over {self.flops:.3g} FLOPs, over the "
                f"budget of {self.budget.flops:.3g}; {MAX_WORK_HINT}"
            )

    def keep(self, key: Any, charged: int, nbytes: int) -> None:
        """Of the ``charged`` bytes just charged, the value kept under ``key`` holds ``nbytes``; the rest is freed."""
        self.bytes += nbytes - charged
        self._held[key] = self._held.get(key, 0) + nbytes

    def free(self, key: Any) -> None:
        """The value kept under ``key`` is dropped."""
        self.bytes -= self._held.pop(key, 0)

    def free_all(self) -> None:
        """Every value kept is dropped."""
        self.bytes -= sum(self._held.values())
        self._held.clear()


# ----------------------------------------------------------------------------- plans


@dataclass
class Step:
    """One op of a plan: what it creates and computes, and the values it reads."""

    op: str
    out: list[str]
    reads: list[str]
    nbytes: int
    flops: int


def check_plan(steps: list[Step], budget: Budget, where: str, *, live: dict[str, int], runs: int = 1) -> None:
    """Refuse the plan when one value, the bytes live at once, or the FLOPs of ``runs`` runs exceed ``budget``.

    ``live`` holds the values present before the first step (weights, inputs) and their bytes.
    """
    last: dict[str, int] = {}
    for i, s in enumerate(steps):
        for r in s.reads:
            last[r] = i
    live = dict(live)
    held = sum(live.values())
    flops = 0
    for i, s in enumerate(steps):
        if s.nbytes > budget.bytes:
            raise WorkError(
                f"{where}: {s.op} would create {_size(s.nbytes)}, over the budget of "
                f"{_size(budget.bytes)}; {MAX_WORK_HINT}"
            )
        for name in s.out:
            live[name] = s.nbytes // max(len(s.out), 1)
        held += s.nbytes
        if held > budget.bytes:
            raise WorkError(
                f"{where}: at {s.op} the values alive at once would take {_size(held)}, over the "
                f"budget of {_size(budget.bytes)}; {MAX_WORK_HINT}"
            )
        flops += runs * (s.flops + NODE_FLOPS)
        if flops > budget.flops:
            raise WorkError(
                f"{where}: at {s.op} the run would take over {flops:.3g} FLOPs ({runs} run(s)), over "
                f"the budget of {budget.flops:.3g}; {MAX_WORK_HINT}"
            )
        for r in set(s.reads):
            if last.get(r) == i and r in live:
                held -= live.pop(r)


def _check_inputs(inputs: dict[str, int], weights: int, where: str) -> None:
    cap = Budget.for_inputs(weights)
    total = sum(inputs.values())
    if total > cap:
        name = max(inputs, key=inputs.__getitem__)
        raise WorkError(
            f"{where}: one batch of inputs takes {_size(total)} (input {name!r}: {_size(inputs[name])}), over "
            f"the {_size(cap)} that weights of {_size(weights)} justify; {MAX_WORK_HINT}"
        )


def check_batches(n: int, where: str) -> None:
    """At most :data:`MAX_BATCHES` input batches."""
    if n > MAX_BATCHES:
        raise WorkError(f"{where}: {n} batches, over the limit of {MAX_BATCHES}; pass fewer (or larger) batches")


# ----------------------------------------------------------------------------- torch.export programs


def _dim(d: Any, subs: dict) -> int | None:
    """A concrete size for ``d``: an int, a symbol bound by ``subs`` or its hint, else its upper bound."""
    import torch

    if not isinstance(d, torch.SymInt):
        return int(d)
    node = d.node
    expr = getattr(node, "expr", None)
    if expr is not None and subs:
        try:
            v = expr.xreplace(subs)
            if v.is_number:
                return int(v)
        except (TypeError, ValueError, AttributeError):
            pass
    hint = getattr(node, "hint", None)
    if hint is not None:
        return int(hint)
    try:
        upper = node.shape_env.bound_sympy(expr).upper
        if upper.is_finite:
            return int(upper)
    except Exception:  # noqa: BLE001 - no shape environment: unknown
        pass
    return None


def _vals(v: Any) -> list:
    import torch

    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for x in v for t in _vals(x)]
    return []


def _tensor_bytes(t: Any, subs: dict, what: str, strict: bool = True) -> tuple[int, list[int]]:
    """Bytes and dims of a ``meta["val"]`` tensor; a size known only at run time is refused when ``strict``
    (the graph is about to run), else counted as 0 (load: fold and check never run it)."""
    dims = [_dim(d, subs) for d in t.shape]
    if any(d is None for d in dims):
        if not strict:
            return 0, [0 if d is None else d for d in dims]
        raise WorkError(f"{what} has a size known only when it runs; the audit cannot bound it; refused")
    n = elements(dims)
    return n * t.element_size(), dims


def _fx_flops(node: Any, out_dims: list[int], subs: dict) -> int:
    """FLOPs of one op: matrix and conv ops by their inner products, anything else by the elements it touches."""

    name = getattr(node.target, "__name__", str(node.target)).split(".")[0]
    out = elements(out_dims)
    ins = [t for a in node.all_input_nodes for t in _vals(a.meta.get("val"))]
    shapes = []
    for t in ins:
        try:
            shapes.append([_dim(d, subs) or 0 for d in t.shape])
        except Exception:  # noqa: BLE001
            shapes.append([])
    if name in ("convolution", "conv1d", "conv2d", "conv3d", "_convolution") and len(shapes) > 1:
        transposed = node.args[6] if name in ("convolution", "_convolution") and len(node.args) > 6 else False
        w = shapes[1]
        if transposed:
            return 2 * elements(shapes[0]) * elements(w[1:])
        return 2 * out * elements(w[1:])
    if name.startswith("conv_transpose") and len(shapes) > 1:
        return 2 * elements(shapes[0]) * elements(shapes[1][1:])
    if name in ("mm", "bmm", "matmul", "addmm", "linear", "baddbmm", "addbmm") and shapes:
        a = shapes[1] if name in ("addmm", "baddbmm", "addbmm") and len(shapes) > 1 else shapes[0]
        return 2 * out * (a[-1] if a else 1)
    return out + sum(elements(s) for s in shapes if s)


def higher_order_ops(ep: Any) -> list[tuple[str, str]]:
    """``(op name, node name)`` of every higher-order op (while_loop, cond, map, ...) in the program."""
    import torch

    found = []
    for node in ep.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator):
            found.append((node.target.name(), node.name))
    return found


def fx_plan(ep: Any, batches: list | None = None, *, where: str = "the program", runs: int = 1) -> None:
    """Check the cost of running ``ep`` (an ExportedProgram) on one of ``batches`` (default: its own shapes),
    ``runs`` times per batch, against the budget its content justifies.  With ``batches`` (the graph is
    about to run) a size known only at run time is refused; without, it is not counted."""
    strict = batches is not None
    import torch
    from torch.export.graph_signature import InputKind

    subs: dict = {}
    specs = ep.graph_signature.input_specs
    users = [s.arg.name for s in specs if s.kind == InputKind.USER_INPUT]
    nodes = {n.name: n for n in ep.graph.nodes}
    batch = None
    if batches:
        check_batches(len(batches), where)
        batch = max(batches, key=lambda b: sum(t.numel() for t in b if isinstance(t, torch.Tensor)))
    if batch is not None:
        for name, x in zip(users, batch):
            val = nodes[name].meta.get("val") if name in nodes else None
            if isinstance(val, torch.Tensor) and isinstance(x, torch.Tensor) and val.dim() == x.dim():
                for d, real in zip(val.shape, x.shape):
                    if isinstance(d, torch.SymInt) and getattr(d.node.expr, "is_Symbol", False):
                        subs[d.node.expr] = int(real)
    live: dict[str, int] = {}
    weights, inputs = 0, {}
    for node in ep.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            nbytes = _tensor_bytes(val, subs, f"{where}: input {node.name!r}", strict)[0]
            live[node.name] = nbytes
            if node.name in users:
                inputs[node.name] = nbytes
            else:
                weights += nbytes
    _check_inputs(inputs, weights, where)
    budget = Budget.for_content(weights, sum(inputs.values()))
    steps = []
    for node in ep.graph.nodes:
        if node.op != "call_function":
            continue
        label = f"{getattr(node.target, '__name__', node.target)} {node.name!r}"
        nbytes, flops = 0, 0
        for t in _vals(node.meta.get("val")):
            b, dims = _tensor_bytes(t, subs, f"{where}: {label}", strict)
            nbytes += b
            flops += _fx_flops(node, dims, subs)
        steps.append(Step(label, [node.name], [a.name for a in node.all_input_nodes], nbytes, flops))
    runs_all = runs * (len(batches) if batches else 1)
    check_plan(steps, budget, where, live=live, runs=runs_all)


def fx_content_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the tensors (weights) a program holds."""
    return sum(t.numel() * t.element_size() for t in tensors)


# ----------------------------------------------------------------------------- ONNX models


def _onnx_flops(node: Any, dims: dict, out_n: int) -> int:
    ins = [dims.get(n) for n in node.input if n]
    if node.op_type in ("Conv", "ConvTranspose", "ConvInteger", "QLinearConv") and len(ins) > 1 and ins[1]:
        w = ins[1]
        if node.op_type == "ConvTranspose":
            return 2 * elements(ins[0] or []) * elements(w[1:])
        return 2 * out_n * elements(w[1:])
    if node.op_type in ("MatMul", "Gemm", "MatMulInteger") and ins and ins[0]:
        k = ins[0][-1] if node.op_type != "Gemm" else max(ins[0])
        return 2 * out_n * max(int(k), 1)
    return out_n + sum(elements(s) for s in ins if s)


def onnx_plan(model: Any, where: str, content_bytes: int | None = None, batch: int = 1) -> None:
    """Check the cost of running the main graph of ``model`` once on a batch (symbolic dims: ``batch``
    first, 1 elsewhere), by ONNX shape inference; values whose shape inference cannot tell are not counted."""
    import onnx

    from ..onnx.shapes import Shapes
    from .onnx_graph import itemsize

    shapes = Shapes(model)
    g = model.graph
    init = {t.name for t in g.initializer}

    def concrete(name: str) -> list[int] | None:
        d = shapes.dims(name)
        if d is None:
            return None
        return [x if isinstance(x, int) else (batch if i == 0 else 1) for i, x in enumerate(d)]

    def nbytes(name: str) -> int:
        d = concrete(name)
        t = shapes.elem_type(name) or onnx.TensorProto.FLOAT
        return 0 if d is None else elements(d) * itemsize(t)

    live: dict[str, int] = {}
    inputs: dict[str, int] = {}
    for v in g.input:
        if v.name not in init:
            inputs[v.name] = live[v.name] = nbytes(v.name)
    for t in g.initializer:
        live[t.name] = elements(t.dims) * itemsize(t.data_type)
    weights = sum(b for n, b in live.items() if n not in inputs) if content_bytes is None else content_bytes
    for node in g.node:  # Constant nodes hold weights too
        if node.op_type == "Constant" and content_bytes is None:
            weights += sum(elements(a.t.dims) * itemsize(a.t.data_type) for a in node.attribute if a.HasField("t"))
    _check_inputs(inputs, weights, where)
    budget = Budget.for_content(weights, sum(inputs.values()))
    dims = {n: concrete(n) for n in live}
    steps = []
    for node in g.node:
        label = f"{node.op_type} {(node.name or (node.output[0] if node.output else ''))!r}"
        out_b, flops = 0, 0
        for o in node.output:
            if not o:
                continue
            dims[o] = concrete(o)
            b = nbytes(o)
            out_b += b
            if dims[o] is not None:
                flops += _onnx_flops(node, dims, elements(dims[o]))
        steps.append(Step(label, [o for o in node.output if o], [i for i in node.input if i], out_b, flops))
    check_plan(steps, budget, where, live=live)


def onnx_run_plan(model: Any, batches: list, where: str) -> None:
    """:func:`onnx_plan` with the graph inputs shaped like the largest of ``batches`` (the ONNX audit's
    check before it runs: dims the file leaves open are then those of the real inputs)."""
    import onnx

    inputs = [v for v in model.graph.input if v.name not in {t.name for t in model.graph.initializer}]
    largest: dict[str, tuple] = {}
    for batch in batches:
        for v, x in zip(inputs, batch):
            shape = tuple(int(d) for d in getattr(x, "shape", ()))
            if elements(shape) >= elements(largest.get(v.name, ())):
                largest[v.name] = shape
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for v in m.graph.input:
        if v.name in largest and v.type.HasField("tensor_type"):
            dims = v.type.tensor_type.shape.dim
            del dims[:]
            for d in largest[v.name]:
                dims.add().dim_value = d
    onnx_plan(m, where)


# ----------------------------------------------------------------------------- the audit


#: ops that index a table with an input: (table argument, index argument, axis argument or a fixed axis)
_INDEXING = {"embedding": (0, 1, 0), "index_select": (0, 2, 1), "gather": (0, 2, 1)}


def _index_bounds(ep: Any) -> dict[str, list[tuple[str, int, bool]]]:
    """``{user input: [(op node, table size along the indexed axis, negatives allowed)]}``."""
    import torch

    bounds: dict[str, list] = {}
    for node in ep.graph.nodes:
        if node.op != "call_function":
            continue
        name = getattr(node.target, "__name__", "").split(".")[0]
        rule = _INDEXING.get(name)
        if rule is None or len(node.args) <= max(rule[0], rule[1]):
            continue
        table, index = node.args[rule[0]], node.args[rule[1]]
        axis = rule[2] if name == "embedding" else (node.args[rule[2]] if len(node.args) > rule[2] else 0)
        val = table.meta.get("val") if isinstance(table, torch.fx.Node) else None
        if not isinstance(index, torch.fx.Node) or index.op != "placeholder" or not isinstance(val, torch.Tensor):
            continue
        if not isinstance(axis, int) or not -val.dim() <= axis < max(val.dim(), 1):
            continue
        size = _dim(val.shape[axis], {}) if val.dim() else 1
        if size is not None:
            bounds.setdefault(index.name, []).append((node.name, size, name != "embedding"))
    return bounds


def check_indices(ep: Any, batches: list) -> None:
    """Integer inputs that index a table (embedding, index_select, gather) hold indices inside it."""
    import torch
    from torch.export.graph_signature import InputKind

    bounds = _index_bounds(ep)
    if not bounds:
        return
    users = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    for batch in batches:
        for name, x in zip(users, batch):
            if name not in bounds or not isinstance(x, torch.Tensor) or x.is_floating_point() or not x.numel():
                continue
            lo, hi = int(x.min()), int(x.max())
            for op, size, negative in bounds[name]:
                if hi >= size or lo < (-size if negative else 0):
                    bad = hi if hi >= size else lo
                    raise ModelFileError(
                        f"input {name!r} holds the index {bad}, out of range for {op!r} (size {size}); "
                        "check the input batches"
                    )


def audit_plan(model: Any, batches: list, *, runs: int = 3, name: str | None = None) -> None:
    """The check the audit makes before it runs anything: no higher-order op (the audit cannot run
    one), indices inside their tables, and the plan of ``runs`` runs per batch within the budget."""
    import torch

    where = name or "the model"
    if type(model).__name__ == "ModelProto":
        onnx_plan(model, where)
        return
    if not isinstance(model, torch.export.ExportedProgram):
        return  # an nn.Module of the caller's: exported by the audit itself
    hops = higher_order_ops(model)
    if hops:
        op, node = hops[0]
        raise ModelFileError(
            f"{where}: the audit cannot run the higher-order op {op} (node {node!r}); "
            "fold and check handle it, audit a program without it"
        )
    check_indices(model, batches)
    fx_plan(model, batches, where=where, runs=runs)
