"""The cost model: what running a graph will allocate and compute, added up before it runs.

Every tensor the audit (or a constant evaluator) creates has a shape computed
beforehand from its op and arguments, never read from the file: the program's
ops run on meta kernels over its real weights (:mod:`bnfold.io.fx_shapes`; a
file whose ``meta["val"]`` disagrees is refused), ONNX shape inference without
the file's stated shapes; what only running tells is checked just before the op
runs (:mod:`bnfold.io.run_checks`).
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
that big.  :class:`WorkMeter` is the running check for constant evaluators: the
bytes of the values they hold (each freed when they drop it) and the FLOPs of
all they computed; past the budget they stop.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..errors import ModelFileError
from .budget import (  # noqa: F401 (re-exported: bnfold.io.cost is where callers find them)
    CONTENT_MULTIPLE,
    FLOOR_BYTES,
    FLOPS_PER_BYTE,
    INPUT_MULTIPLE,
    MAX_BATCHES,
    MAX_WORK_HINT,
    MIB,
    NODE_FLOPS,
    Budget,
    WorkError,
    _size,
    current_override,
    max_work,
)
from .sizes import MAX_ELEMENTS, concrete_dim, elements  # noqa: F401 (elements: bnfold.io.cost.elements callers)

#: A constant evaluator drops a computed value this big or bigger once its last reader is computed; a
#: smaller one stays (counted) so that a long chain of small values is never computed again per node.
FREE_MIN_BYTES = 64 << 10


# ----------------------------------------------------------------------------- running check


class WorkMeter:
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


@dataclass(slots=True)
class PlanStep:
    """One op of a plan: what it creates and computes, and the values it reads."""

    op: str
    out: list[str]
    reads: list[str]
    nbytes: int
    flops: int
    temp: int = 0  # bytes the op holds only while it runs (a convolution's im2col buffer)


@dataclass(frozen=True)
class Plan:
    """A plan that fits: the most bytes alive at once, its FLOPs in all, and the budget it fits; ``sized``: the
    values whose sizes the plan read from sizes the same meta kernels give (a torch program's load-checked
    metadata), whose run-time check need not run them again (:func:`bnfold.io.run_checks.before_op`)."""

    peak: int
    flops: int
    budget: Budget
    sized: frozenset = frozenset()


def check_plan(steps: list[PlanStep], budget: Budget, where: str, *, live: dict[str, int], runs: int = 1) -> Plan:
    """Refuse the plan when one value, the bytes live at once, or the FLOPs of ``runs`` runs exceed ``budget``;
    else return it (:class:`Plan`).

    ``live`` holds the values present before the first step (weights, inputs) and their bytes.
    """
    last = {r: i for i, s in enumerate(steps) for r in s.reads}  # each value's last reader
    live = dict(live)
    held = peak = sum(live.values())
    flops = 0
    for i, s in enumerate(steps):
        if s.nbytes > budget.bytes:
            raise WorkError(
                f"{where}: {s.op} would create {_size(s.nbytes)}, over the budget of "
                f"{_size(budget.bytes)}; {MAX_WORK_HINT}"
            )
        for name in s.out:
            live[name] = s.nbytes // len(s.out)
        held += s.nbytes
        alive = held + s.temp
        if alive > peak:
            peak = alive
        if alive > budget.bytes:
            raise WorkError(
                f"{where}: at {s.op} the values alive at once would take {_size(alive)}, over the "
                f"budget of {_size(budget.bytes)}; {MAX_WORK_HINT}"
            )
        flops += runs * (s.flops + NODE_FLOPS)
        if flops > budget.flops:
            raise WorkError(
                f"{where}: at {s.op} the run would take over {flops:.3g} FLOPs ({runs} run(s)), over "
                f"the budget of {budget.flops:.3g}; {MAX_WORK_HINT}"
            )
        for r in s.reads:  # a value read twice is freed once: then it is no longer live
            if last[r] == i and r in live:
                held -= live.pop(r)
    return Plan(peak, flops, budget)


def _check_kept(label: str, nbytes: int, budget: Budget, where: str) -> None:
    """An output the audit keeps for every batch: refused by name when that alone exceeds the budget
    (before the plan counts the earlier batches' outputs as held from the start)."""
    if nbytes > budget.bytes:
        raise WorkError(
            f"{where}: {label} would create {_size(nbytes)} (kept for every batch), over the budget of "
            f"{_size(budget.bytes)}; {MAX_WORK_HINT}"
        )


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


def _fx_flops(
    name: str, args: Any, out_dims: Sequence[int], in_dims: list[Sequence[int]], out_n: int, in_ns: list[int]
) -> int:
    """FLOPs of one op ``name`` (``convolution``, ``mm`` ...) called with ``args``, from its recomputed output and
    input dims and their element counts ``out_n`` and ``in_ns``: matrix and conv ops by their inner products (a
    transposed ``convolution`` is told by its 7th argument, an ``einsum`` by its equation), anything else by the
    elements it touches."""
    if name == "einsum" and args and isinstance(args[0], str):
        return einsum_flops(args[0], in_dims, out_dims)
    if name in ("convolution", "conv1d", "conv2d", "conv3d", "_convolution") and len(in_dims) > 1:
        transposed = bool(args[6]) if name in ("convolution", "_convolution") and len(args) > 6 else False
        return 2 * (in_ns[0] if transposed else out_n) * elements(in_dims[1][1:])
    if name.startswith("conv_transpose") and len(in_dims) > 1:
        return 2 * in_ns[0] * elements(in_dims[1][1:])
    if name in ("mm", "bmm", "matmul", "addmm", "linear", "baddbmm", "addbmm") and in_dims:
        a = in_dims[1] if name in ("addmm", "baddbmm", "addbmm") and len(in_dims) > 1 else in_dims[0]
        return 2 * out_n * (a[-1] if a else 1)
    if name in ("scaled_dot_product_attention", "_scaled_dot_product_flash_attention") and len(in_dims) > 2:
        k = in_dims[1]  # q @ k^T, then @ v: 2 x (L x S x E) each, per batch and head
        return 4 * in_ns[0] * (k[-2] if len(k) > 1 else 1) + out_n
    return out_n + sum(in_ns)


def op_flops(target: Any, args: Any, out_dims: list[int], in_dims: list[list[int]]) -> int:
    """FLOPs of one output (``out_dims``) of the op ``target`` called with ``args`` on inputs of ``in_dims``
    (:func:`_fx_flops`)."""
    return _fx_flops(_target_name(target), args, out_dims, in_dims, elements(out_dims), [elements(d) for d in in_dims])


def _target_name(target: Any) -> str:
    """An op target's name without its overload (``convolution`` of ``convolution.default``): its
    ``__name__``, else its string (only made when there is no ``__name__``: an op's is slow to make)."""
    name = getattr(target, "__name__", _NO_NAME)
    return (str(target) if name is _NO_NAME else name).split(".")[0]


_NO_NAME = object()


def einsum_flops(equation: str, in_dims: list[list[int]], out_dims: list[int]) -> int:
    """FLOPs of ``einsum(equation, operands of in_dims)``: 2 per output element and combination of the
    summed indices (those of the operands missing from the output), each index at its largest size; an
    equation that does not parse costs the product of every operand's size (an upper bound)."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    sizes: dict[str, int] = {}
    if len(terms) != len(in_dims):
        return 2 * elements(d for dims in in_dims for d in dims) + elements(out_dims)
    for term, dims in zip(terms, in_dims):
        head, dots, tail = term.partition("...")
        named = list(head) + [""] * (len(dims) - len(head) - len(tail)) * bool(dots) + list(tail)
        if len(named) != len(dims):
            return 2 * elements(d for dims in in_dims for d in dims) + elements(out_dims)
        for letter, d in zip(named, dims):
            if letter:
                sizes[letter] = max(sizes.get(letter, 1), int(d))
    kept = set(rhs) if arrow else {c for c in sizes if lhs.count(c) == 1}
    summed = elements(sizes[c] for c in sizes if c not in kept)
    return 2 * elements(out_dims) * max(summed, 1)


def _arg_nodes(args: Any) -> list:
    """The nodes in ``args`` (lists and tuples of them, nested), in order, each as often as it appears."""
    import torch

    found = []
    for a in args:
        if isinstance(a, torch.fx.Node):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            found += _arg_nodes(a)
    return found


def higher_order_ops(ep: Any) -> list[tuple[str, str]]:
    """``(op name, node name)`` of every higher-order op (while_loop, cond, map, ...) in the program."""
    import torch

    found = []
    for node in ep.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator):
            found.append((node.target.name(), node.name))
    return found


#: What the audit holds per element of a floating value while it runs (``numerics.fx_program``): the
#: emulated value (float32), the float64 reference, and the float64 local run of a layer's segment.
AUDIT_FLOAT_BYTES = 4 + 8 + 8
#: ... of an integer / bool value: the emulated and the reference runs compute it each.
AUDIT_OTHER_COPIES = 2
#: ... per element of an op's output while it is measured (float64 differences, a norm's probe).
AUDIT_TEMP_BYTES = 24
#: What the items above leave out (the float32 forward pass, the allocator's slack, the phases of the
#: audit), as a factor: measured peaks were 1.4-1.7x the itemized count (three conv nets, 1-4 batches;
#: see SECURITY.md, "The cost model").
AUDIT_SLACK = (3, 2)


#: The audit's byte budget is this multiple of the content's: it holds every value three times (the
#: float32 run, the float64 reference, the float64 local run: 20 bytes per float32 element, 5x) plus
#: a convolution's float64 im2col buffer, each an overhead of bnfold's, proportional to the content.
AUDIT_BUDGET_MULTIPLE = 8


def _slack(n: int) -> int:
    return n * AUDIT_SLACK[0] // AUDIT_SLACK[1]


@dataclass(frozen=True)
class AuditHold:
    """What an audit of ``runs`` runs per batch keeps besides the values of the graph: each emulator
    (unfolded and folded) holds its constants in float32 and float64, the folded program its own
    weights, and every batch's outputs stay (emulated float32 and float64 reference, per emulator)."""

    runs: int

    def value(self, s: Any) -> int:
        """What the audit holds of a value of spec ``s`` (its ``dims``, ``nbytes``, ``is_float``)."""
        return self.held(elements(s.dims), s.nbytes, s.is_float)

    @staticmethod
    def held(n: int, nbytes: int, is_float: bool) -> int:
        """What the audit holds of a value of ``n`` elements in ``nbytes`` bytes."""
        if is_float:
            return _slack(n * AUDIT_FLOAT_BYTES)
        return _slack(nbytes * AUDIT_OTHER_COPIES)

    def constants(self, weights: int, float_elements: int) -> int:
        emulators = 2 if self.runs > 2 else 1
        return _slack(weights * emulators + emulators * float_elements * (4 + 8))

    def outputs(self, out_elements: int, batches: int) -> int:
        emulators = 2 if self.runs > 2 else 1
        return _slack(emulators * batches * out_elements * (4 + 8))

    @staticmethod
    def temp(name: str, out_dims: list[int], in_dims: list[list[int] | None], out: int | None = None) -> int:
        """What one op holds while it runs (``out``: ``out_dims``' element count, when the caller has it)."""
        return _slack(AuditHold._temp(name, out_dims, in_dims, elements(out_dims) if out is None else out))

    @staticmethod
    def _temp(name: str, out_dims: list[int], in_dims: list[list[int] | None], out: int) -> int:
        """What one op holds while it runs: the float64 reference convolution's im2col buffer (CPU:
        each output position times the weight's fan-in, 8 bytes each; measured 162 MiB for a
        [4, 32, 128, 128] input and a 3x3 kernel), else the float64 temporaries of the error
        measurement (measured 18 MiB for an 8 MiB float32 value) and of a batch norm's input probe.  An input's
        dims may be None (unknown: none counted)."""
        measured = out * AUDIT_TEMP_BYTES
        conv = name in ("convolution", "conv1d", "conv2d", "conv3d", "_convolution") or name.startswith("conv_t")
        if conv and len(in_dims) > 1 and len(out_dims) > 1 and out_dims[1]:
            columns = out // out_dims[1] * elements((in_dims[1] or [])[1:]) * 8
            return max(columns, measured)
        return measured


def fx_plan(
    ep: Any, batches: list | None = None, *, where: str = "the program", runs: int = 1, audit: bool = False
) -> Plan:
    """Check the cost of running ``ep`` (an ExportedProgram) on one of ``batches`` (default: its own
    example shapes), ``runs`` times per batch, against the budget its content justifies; return the
    plan (:class:`Plan`: the bytes it holds at its peak, its FLOPs).

    Without ``batches`` every size is recomputed from the ops and their arguments
    (:func:`bnfold.io.fx_shapes.recompute`, meta kernels over the real weights) and compared with the
    metadata: a file whose metadata disagrees is refused.  With ``batches``, the sizes are those of
    :func:`bnfold.io.fx_shapes.specs` (a file's metadata only where it was checked).  A value that only
    running tells (``nonzero``, a size read from a tensor) is counted as 0 here and checked when it
    runs (:func:`bnfold.io.run_checks.before_op`).  With ``audit``, the values count what the audit holds of
    them (:class:`AuditHold`)."""
    import torch
    from torch.export.graph_signature import InputKind

    from . import fx_shapes

    specs = ep.graph_signature.input_specs
    users = [s.arg.name for s in specs if s.kind == InputKind.USER_INPUT]
    shapes: dict[str, tuple] = {}
    if batches:
        check_batches(len(batches), where)
        batch = max(batches, key=lambda b: sum(t.numel() for t in b if isinstance(t, torch.Tensor)))
        shapes = {n: tuple(x.shape) for n, x in zip(users, batch) if isinstance(x, torch.Tensor)}
    # the metadata is compared at load (the file's own example shapes); a batch of other shapes is the
    # caller's (the emulator checks it against the program's static dims), its sizes recomputed for a file
    rec = fx_shapes.specs(ep, shapes, where=where) if batches else fx_shapes.recompute(ep, shapes, where=where)
    hold = AuditHold(runs) if audit else None
    live: dict[str, int] = {}
    weights, float_weights, inputs = 0, 0, {}
    firsts: dict[str, tuple[tuple[int, ...], int]] = {}  # each value's first tensor: dims, elements (an op's input)
    for node in ep.graph.nodes:
        if node.op != "placeholder":
            continue
        vals = rec.get(node.name) or []
        nbytes = float_n = 0
        for s in vals:
            n = elements(s.dims)
            nbytes += n * s.dtype.itemsize
            float_n += n if s.is_float else 0
            firsts.setdefault(node.name, (s.dims, n))
        if node.name in users:
            inputs[node.name] = nbytes
            live[node.name] = sum(hold.value(s) for s in vals) if hold else nbytes
        else:
            weights += nbytes
            float_weights += float_n
            live[node.name] = 0 if hold else nbytes
    _check_inputs(inputs, weights, where)
    budget = Budget.for_content(weights, sum(inputs.values()))
    if hold:
        budget = Budget(budget.bytes * AUDIT_BUDGET_MULTIPLE, budget.flops)
    outs = {a.name for a in ep.graph.output_node().all_input_nodes}
    n_batches = len(batches or [1])
    if hold:  # the weights' copies, and the outputs of the batches before the last
        out_elements = sum(elements(s.dims) for n in outs for s in (rec.get(n) or []))
        live["(held by the audit)"] = hold.constants(weights, float_weights) + hold.outputs(out_elements, n_batches - 1)
    counted: dict[Any, tuple[int, int]] = {}  # a spec's elements and the bytes counted (values of one spec alike)
    steps = []
    for node in ep.graph.nodes:
        if node.op != "call_function":
            continue
        target = node.target
        label = f"{getattr(target, '__name__', target)} {node.name!r}"
        vals = rec.get(node.name) or []
        ns, nbytes = [], 0
        for s in vals:
            got = counted.get(s)
            if got is None:
                n = elements(s.dims)
                got = counted[s] = (n, hold.value(s) if hold else n * s.dtype.itemsize)
            ns.append(got[0])
            nbytes += got[1]
        if hold and node.name in outs:  # an output: every batch's stays
            nbytes += hold.outputs(sum(ns), 1)
            _check_kept(label, nbytes + hold.outputs(sum(ns), n_batches - 1), budget, where)
        in_dims, in_ns = [], []  # by position: x @ x reads x twice
        for a in _arg_nodes(node.args):
            if a.name in firsts:
                dims, n = firsts[a.name]
                in_dims.append(dims)
                in_ns.append(n)
        name = _target_name(target)
        flops = temp = 0
        for n, s in zip(ns, vals):
            flops += _fx_flops(name, node.args, s.dims, in_dims, n, in_ns)
            if hold and s.is_float:
                temp = max(temp, hold.temp(name, s.dims, in_dims))
        if vals:
            firsts[node.name] = (vals[0].dims, ns[0])
        steps.append(PlanStep(label, [node.name], [a.name for a in node.all_input_nodes], nbytes, flops, temp))
    runs_all = runs * (len(batches) if batches else 1)
    plan = check_plan(steps, budget, where, live=live, runs=runs_all)
    return replace(plan, sized=frozenset(name for name, vals in rec.items() if vals is not None))


def fx_content_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the tensors (weights) a program holds."""
    return sum(t.numel() * t.element_size() for t in tensors)


# ----------------------------------------------------------------------------- ONNX models


def _onnx_flops(node: Any, op: str, ins: list, out_n: int) -> int:
    """FLOPs of one output (``out_n`` elements) of ``node`` (op type ``op``), from its inputs' dims ``ins``
    (None: unknown)."""
    if op in _CONV_OPS and len(ins) > 1 and ins[1]:
        w = ins[1]
        if op == "ConvTranspose":
            return 2 * elements(ins[0] or []) * elements(w[1:])
        return 2 * out_n * elements(w[1:])
    if op == "Einsum" and all(ins):
        equation = next((a.s.decode("utf-8", "replace") for a in node.attribute if a.name == "equation"), "")
        return einsum_flops(equation, ins, [out_n])
    if op in _MATMUL_OPS and ins and ins[0]:
        k = ins[0][-1] if op != "Gemm" else max(ins[0])
        return 2 * out_n * max(int(k), 1)
    for s in ins:  # anything else: the elements it touches
        if s:
            out_n += elements(s)
    return out_n


_CONV_OPS = ("Conv", "ConvTranspose", "ConvInteger", "QLinearConv")
_MATMUL_OPS = ("MatMul", "Gemm", "MatMulInteger")


def _concrete(d: list | None, symbols: set, batch: int) -> list[int] | None:
    """Inferred dims ``d`` made concrete: a graph input's symbolic dim is ``batch`` first, 1 elsewhere; None
    when a dim is unknown (only running tells: checked then).  Dims that are all ints are ``d`` itself."""
    if d is None:
        return None
    for x in d:
        if type(x) is not int:
            break
    else:
        return d
    out = []
    for i, x in enumerate(d):
        if isinstance(x, int):
            out.append(x)
        elif isinstance(x, str) and x in symbols:
            out.append(batch if i == 0 else 1)
        else:
            return None
    return out


_UNKNOWN = (None, 0, 0, 0)  # what _OnnxValues says of a value whose dims inference cannot tell


class _OnnxValues:
    """What :func:`onnx_plan` counts of each value: its concrete dims (None: unknown; :meth:`dims`: all a
    weight needs), and for a value the graph computes (:meth:`__call__`) its element count, bytes and the
    bytes the plan counts for it (what the audit holds of it with ``hold``), worked out once per inferred
    type (most values share one with others)."""

    def __init__(self, shapes: Any, symbols: set, batch: int, hold: AuditHold | None):
        import onnx

        from .onnx_graph import itemsize

        self.shapes, self.symbols, self.batch, self.hold = shapes, symbols, batch, hold
        self._by_type: dict[tuple, tuple[list[int] | None, int, int, int]] = {}
        self._sizes: dict[int, int] = {}
        self._itemsize, self._float = itemsize, onnx.TensorProto.FLOAT

    def itemsize(self, t: int) -> int:
        """Bytes per element of the ONNX type ``t`` (:func:`bnfold.io.onnx_graph.itemsize`)."""
        size = self._sizes.get(t)
        if size is None:
            size = self._sizes[t] = self._itemsize(t)
        return size

    def dims(self, name: str) -> list[int] | None:
        """``name``'s concrete dims (None: unknown)."""
        return _concrete(self.shapes.dims(name), self.symbols, self.batch)

    def __call__(self, name: str) -> tuple[list[int] | None, int, int, int]:
        """``name``'s dims, element count, bytes and counted bytes (:data:`_UNKNOWN` when its dims are unknown)."""
        d = self.shapes.dims(name)
        if d is None:
            return _UNKNOWN
        key = (tuple(d), self.shapes.elem_type(name))
        got = self._by_type.get(key)
        if got is None:
            got = self._by_type[key] = self._count(d, key[1] or self._float)
        return got

    def _count(self, inferred: list, t: int) -> tuple[list[int] | None, int, int, int]:
        """:meth:`__call__` of a value of dims ``inferred`` and element type ``t``."""
        d = _concrete(inferred, self.symbols, self.batch)
        if d is None:
            return _UNKNOWN
        n = elements(d)
        nbytes = n * self.itemsize(t)
        return d, n, nbytes, self.hold.held(n, nbytes, t in _ONNX_FLOATS) if self.hold else nbytes


def onnx_plan(
    model: Any,
    where: str,
    content_bytes: int | None = None,
    batch: int = 1,
    *,
    audit: bool = False,
    batches: int = 1,
    input_dims: dict[str, tuple] | None = None,
) -> Plan:
    """Check the cost of running the main graph of ``model`` once on a batch (the inputs' symbolic dims:
    ``batch`` first, 1 elsewhere; ``input_dims`` sets whole inputs' dims) and return the plan.  Sizes come
    from ONNX shape inference over the ops (:class:`bnfold.onnx.shapes.Shapes` does not believe stated
    ``value_info`` or output shapes); a dim that inference cannot size (a Resize whose scales the graph
    computes) is not counted here but checked when the op runs (:func:`bnfold.io.run_checks.before_op`).
    With ``audit``, values count what the ONNX audit holds of them (:class:`AuditHold`, ``batches``
    batches)."""
    from ..onnx.shapes import Shapes

    input_dims = input_dims or {}
    g = model.graph
    init = {t.name for t in g.initializer}
    symbols = set()  # the dim params of the graph inputs the batches do not shape: a batch's dims
    for v in g.input:
        if v.name not in init and v.name not in input_dims and v.type.HasField("tensor_type"):
            symbols |= {d.dim_param for d in v.type.tensor_type.shape.dim if d.HasField("dim_param")}
    hold = AuditHold(3) if audit else None
    info = _OnnxValues(Shapes(model, declared=False, inputs=input_dims), symbols, batch, hold)
    live: dict[str, int] = {}
    inputs: dict[str, int] = {}
    for v in g.input:
        if v.name not in init:
            _, _, inputs[v.name], live[v.name] = info(v.name)
    float_weights = 0
    for t in g.initializer:
        n, data_type = elements(t.dims), t.data_type
        live[t.name] = n * info.itemsize(data_type)
        float_weights += n if data_type in _ONNX_FLOATS else 0
    weights = sum(b for n, b in live.items() if n not in inputs) if content_bytes is None else content_bytes
    nodes = list(g.node)
    ops = [node.op_type for node in nodes]
    if content_bytes is None:  # Constant nodes hold weights too
        for node, op in zip(nodes, ops):
            if op == "Constant":
                for a in node.attribute:
                    if a.HasField("t"):
                        t = a.t
                        weights += elements(t.dims) * info.itemsize(t.data_type)
    _check_inputs(inputs, weights, where)
    budget = Budget.for_content(weights, sum(inputs.values()))
    if hold:
        budget = Budget(budget.bytes * AUDIT_BUDGET_MULTIPLE, budget.flops)
        for name in init:
            live[name] = 0
    outs = {o.name for o in g.output}
    if hold:  # the weights' copies, and the outputs of the batches before the last
        out_elements = sum(info(o)[1] for o in outs)
        live["(held by the audit)"] = hold.constants(weights, float_weights) + hold.outputs(out_elements, batches - 1)
    dims = {n: info.dims(n) for n in live}
    steps = _onnx_steps(nodes, ops, info, dims, outs, hold, budget, where, batches)
    return check_plan(steps, budget, where, live=live, runs=3 * batches if audit else 1)


def _onnx_steps(
    nodes: list,
    ops: list[str],
    info: _OnnxValues,
    dims: dict,
    outs: set,
    hold: AuditHold | None,
    budget: Budget,
    where: str,
    batches: int,
) -> list[PlanStep]:
    """``nodes`` (op types ``ops``) as the steps of :func:`onnx_plan` (``dims``: the dims of the values present
    so far, each node's outputs added as they are counted)."""
    steps = []
    for node, op in zip(nodes, ops):
        if op == "Constant" and len(node.output) == 1 and node.output[0] not in outs:
            o = node.output[0]  # the runners hold its value as a constant, never run it: no FLOPs, no temporaries
            d, _, _, nb = info(o)
            dims[o] = d
            steps.append(PlanStep(f"Constant {(node.name or o)!r}", [o], [], nb, 0))
            continue
        outputs = list(node.output)
        label = f"{op} {(node.name or (outputs[0] if outputs else ''))!r}"
        reads = [i for i in node.input if i]
        out = []
        out_b = flops = temp = 0
        for o in outputs:
            if not o:
                continue
            out.append(o)
            d, n, _, nb = info(o)
            dims[o] = d
            out_b += nb
            if d is None:
                continue
            if hold and o in outs:  # an output: every batch's stays
                out_b += hold.outputs(n, 1)
                _check_kept(label, out_b + hold.outputs(n, batches - 1), budget, where)
            ins = [dims.get(i) for i in reads]
            flops += _onnx_flops(node, op, ins, n)
            if hold:
                temp = max(temp, hold.temp("conv2d" if op in ("Conv", "ConvTranspose") else op, d, ins, n))
        steps.append(PlanStep(label, out, reads, out_b, flops, temp))
    return steps


_ONNX_FLOATS = frozenset({1, 10, 11, 16})  # FLOAT, FLOAT16, DOUBLE, BFLOAT16


def onnx_run_plan(model: Any, batches: list, where: str) -> Plan:
    """:func:`onnx_plan` with the graph inputs shaped like the largest of ``batches`` (the ONNX audit's
    check before it runs: dims the file leaves open are then those of the real inputs), counting what
    the audit holds; then the run-time checks of the op loop are armed (:func:`bnfold.io.run_checks.expect`)."""
    from .run_checks import expect

    init = {t.name for t in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in init]
    largest: dict[str, tuple] = {}
    for batch in batches:
        for v, x in zip(inputs, batch):
            shape = tuple(int(d) for d in getattr(x, "shape", ()))
            if elements(shape) >= elements(largest.get(v.name, ())):
                largest[v.name] = shape
    plan = onnx_plan(model, where, audit=True, batches=max(len(batches), 1), input_dims=largest)
    expect(plan.budget, plan.flops, where)
    return plan


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
        size = concrete_dim(val.shape[axis], {}) if val.dim() else 1
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
    """The check the audit makes before it runs a torch program (``model``, an ExportedProgram; an ONNX
    model's is :func:`onnx_run_plan`): no higher-order op (the audit cannot run one), indices inside their
    tables, and the plan of ``runs`` runs per batch within the budget."""
    where = name or "the model"
    hops = higher_order_ops(model)
    if hops:
        op, node = hops[0]
        raise ModelFileError(
            f"{where}: the audit cannot run the higher-order op {op} (node {node!r}); "
            "fold and check handle it, audit a program without it"
        )
    check_indices(model, batches)
    plan = fx_plan(model, batches, where=where, runs=runs, audit=True)
    from .run_checks import expect

    expect(plan.budget, plan.flops, where, sized=plan.sized)  # the run-time checks of the op loop (io.run_checks)
