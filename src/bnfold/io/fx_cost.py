"""The cost plan of a torch program (:func:`fx_plan`): each op's bytes and FLOPs from sizes recomputed by the
ops' meta kernels (:mod:`bnfold.io.fx_shapes`), added up by :func:`bnfold.io.cost.check_plan`; and the checks the
audit makes of a program before it runs (no higher-order op, indices inside their tables)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..errors import ModelFileError
from .budget import input_flops
from .cost import (
    Budget,
    Conv,
    Plan,
    PlanStep,
    check_batches,
    check_inputs,
    check_plan,
    fx_conv,
)
from .sizes import concrete_dim, elements


def _fx_flops(
    name: str,
    args: Any,
    conv: Conv | None,
    out_dims: Sequence[int],
    in_dims: list[Sequence[int]],
    out_n: int,
    in_ns: list[int],
) -> int:
    """FLOPs of one op ``name`` (``convolution``, ``mm`` ...) called with ``args``, from its recomputed output and
    input dims and their element counts ``out_n`` and ``in_ns``: matrix and conv ops by their inner products (a
    convolution's ``conv``, :func:`bnfold.io.cost.fx_conv`, tells a transposed one; a ``conv_tbc``'s weight is
    ``[taps, C_in, C_out]``, an ``einsum`` by its equation), anything else by the elements it touches."""
    if name == "einsum" and args and isinstance(args[0], str):
        return einsum_flops(args[0], in_dims, out_dims)
    if conv is not None and len(in_dims) > 1:  # each input (transposed) or output element: one inner product
        return 2 * (in_ns[0] if conv.transposed else out_n) * elements(in_dims[1][1:])
    if name == "conv_tbc" and len(in_dims) > 1:  # weight [taps, C_in, C_out]: taps x C_in products per output
        return 2 * out_n * elements(in_dims[1][:-1])
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
    name = _target_name(target)
    ns = [elements(d) for d in in_dims]
    return _fx_flops(name, args, fx_conv(name, args), out_dims, in_dims, elements(out_dims), ns)


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


def fx_plan(
    ep: Any, batches: list | None = None, *, where: str = "the program", runs: int = 1, hold: Any = None
) -> Plan:
    """Check the cost of running ``ep`` (an ExportedProgram) on one of ``batches`` (default: its own
    example shapes), ``runs`` times per batch, against the budget its content justifies; return the
    plan (:class:`Plan`: the bytes it holds at its peak, its FLOPs).

    Without ``batches`` every size is recomputed from the ops and their arguments
    (:func:`bnfold.io.fx_shapes.recompute`, meta kernels over the real weights) and compared with the
    metadata: a file whose metadata disagrees is refused.  With ``batches``, the sizes are those of
    :func:`bnfold.io.fx_shapes.specs` (a file's metadata only where it was checked).  A value that only
    running tells (``nonzero``, a size read from a tensor) is counted as 0 here and checked when it
    runs (:func:`bnfold.io.run_checks.before_op`).  With ``hold``, the values count what the audit holds of
    them (:class:`bnfold.numerics.audit_memory.AuditHold`)."""
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
    check_inputs(inputs, weights, where)
    runs_all = runs * (len(batches) if batches else 1)
    # the work of inputs the user chose (none for a file's own shapes: bnfold.io.budget.input_flops)
    in_elements = sum(elements(s.dims) for name in inputs for s in (rec.get(name) or []))
    extra = input_flops(float_weights, in_elements, runs_all)
    budget = Budget.for_content(weights, sum(inputs.values()), flops=extra)
    if hold:  # the audit: its byte multiple
        budget = Budget.for_audit(weights, sum(inputs.values()), hold.budget_multiple, extra)
    outs = {a.name for a in ep.graph.output_node().all_input_nodes}
    if hold:  # the weights' copies (each batch's outputs are dropped after its run: they count at their step)
        live["(held by the audit)"] = hold.constants(weights, float_weights)
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
        if hold and node.name in outs:  # an output: the batch's stays until the end-to-end numbers read it
            nbytes += hold.outputs(sum(ns))
        in_dims, in_ns = [], []  # by position: x @ x reads x twice
        for a in _arg_nodes(node.args):
            if a.name in firsts:
                dims, n = firsts[a.name]
                in_dims.append(dims)
                in_ns.append(n)
        name = _target_name(target)
        conv = fx_conv(name, node.args)  # transposed or not: decided once, for the FLOPs and the im2col buffer
        flops = temp = 0
        for n, s in zip(ns, vals):
            flops += _fx_flops(name, node.args, conv, s.dims, in_dims, n, in_ns)
            if hold and s.is_float:
                temp = max(temp, hold.temp(conv, s.dims, in_dims))
        if vals:
            firsts[node.name] = (vals[0].dims, ns[0])
        steps.append(PlanStep(label, [node.name], [a.name for a in node.all_input_nodes], nbytes, flops, temp))
    plan = check_plan(steps, budget, where, live=live, runs=runs_all, inputs=inputs)
    sized = {name: sum(elements(s.dims) * s.dtype.itemsize for s in vals) for name, vals in rec.items() if vals}
    return replace(plan, sized=sized)


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
