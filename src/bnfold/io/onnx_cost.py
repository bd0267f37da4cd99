"""The cost plan of an ONNX model's main graph (:func:`onnx_plan`): sizes from ONNX shape inference over the
ops (never the file's stated shapes), each node's bytes and FLOPs added up by
:func:`bnfold.io.cost.check_plan`."""

from __future__ import annotations

from typing import Any

from .budget import input_flops
from .cost import (
    ONNX_CONV_OPS,
    Budget,
    Plan,
    PlanStep,
    check_inputs,
    check_plan,
    onnx_conv,
)
from .fx_cost import einsum_flops
from .sizes import elements


def _onnx_flops(node: Any, op: str, ins: list, out_n: int) -> int:
    """FLOPs of one output (``out_n`` elements) of ``node`` (op type ``op``), from its inputs' dims ``ins``
    (None: unknown)."""
    if op in ONNX_CONV_OPS and len(ins) > 1 and ins[1]:
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

    def __init__(self, shapes: Any, symbols: set, batch: int, hold: Any):
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
    hold: Any = None,
    batches: int = 1,
    input_dims: dict[str, tuple] | None = None,
    fields: list[tuple] | None = None,
) -> Plan:
    """Check the cost of running the main graph of ``model`` once on a batch (the inputs' symbolic dims:
    ``batch`` first, 1 elsewhere; ``input_dims`` sets whole inputs' dims) and return the plan.  Sizes come
    from ONNX shape inference over the ops (:class:`bnfold.onnx.shapes.Shapes` does not believe stated
    ``value_info`` or output shapes); a dim that inference cannot size (a Resize whose scales the graph
    computes) is not counted here but checked when the op runs (:func:`bnfold.io.run_checks.before_op`).
    With ``hold`` (:class:`bnfold.numerics.audit_memory.AuditHold`), values count what the ONNX audit holds of
    them (``batches`` batches).  ``fields``: the nodes' fields as :func:`bnfold.onnx.const_eval.node_fields` reads
    them, when the caller has them (the audit's plan reads them once for all its steps)."""
    from ..onnx.shapes import Shapes

    input_dims = input_dims or {}
    g = model.graph
    init = {t.name for t in g.initializer}
    symbols = set()  # the dim params of the graph inputs the batches do not shape: a batch's dims
    for v in g.input:
        if v.name not in init and v.name not in input_dims and v.type.HasField("tensor_type"):
            symbols |= {d.dim_param for d in v.type.tensor_type.shape.dim if d.HasField("dim_param")}
    info = _OnnxValues(Shapes(model, declared=False, inputs=input_dims), symbols, batch, hold)
    live: dict[str, int] = {}
    inputs: dict[str, int] = {}
    in_elements = 0
    for v in g.input:
        if v.name not in init:
            _, n, inputs[v.name], live[v.name] = info(v.name)
            in_elements += n
    float_weights = 0
    for t in g.initializer:
        n, data_type = elements(t.dims), t.data_type
        live[t.name] = n * info.itemsize(data_type)
        float_weights += n if data_type in _ONNX_FLOATS else 0
    weights = sum(b for n, b in live.items() if n not in inputs) if content_bytes is None else content_bytes
    if fields is None:
        fields = [(node, node.op_type, node.input, node.output, None) for node in g.node]
    nodes = [f[0] for f in fields]
    ops = [f[1] for f in fields]
    const_floats = 0  # the float elements of Constant nodes (paddle2onnx keeps weights there)
    if content_bytes is None:  # Constant nodes hold weights too
        for node, op in zip(nodes, ops):
            if op == "Constant":
                for a in node.attribute:
                    if a.HasField("t"):
                        t = a.t
                        weights += elements(t.dims) * info.itemsize(t.data_type)
                        const_floats += elements(t.dims) if t.data_type in _ONNX_FLOATS else 0
    check_inputs(inputs, weights, where)
    runs = hold.runs * batches if hold else 1
    # the work of inputs the user chose (none for a file's own shapes: bnfold.io.budget.input_flops)
    extra = input_flops(float_weights + const_floats, in_elements, runs)
    budget = Budget.for_content(weights, sum(inputs.values()), flops=extra)
    if hold:  # the audit: its byte multiple
        budget = Budget.for_audit(weights, sum(inputs.values()), hold.budget_multiple, extra)
        for name in init:
            live[name] = 0
    outs = {o.name for o in g.output}
    if hold:  # the weights' copies (each batch's outputs are dropped after its run: they count at their step)
        live["(held by the audit)"] = hold.constants(weights, float_weights)
    dims = {n: info.dims(n) for n in live}
    steps = _onnx_steps(fields, info, dims, outs, hold)
    return check_plan(steps, budget, where, live=live, runs=runs, inputs=inputs)


def _onnx_steps(fields: list[tuple], info: _OnnxValues, dims: dict, outs: set, hold: Any) -> list[PlanStep]:
    """The nodes (``fields``: node, op type, inputs, outputs, as :func:`onnx_plan` has them) as the steps of
    :func:`onnx_plan` (``dims``: the dims of the values present so far, each node's outputs added as they are
    counted)."""
    steps = []
    for node, op, inputs, outputs, _ in fields:
        if op == "Constant" and len(outputs) == 1 and outputs[0] not in outs:
            o = outputs[0]  # the runners hold its value as a constant, never run it: no FLOPs, no temporaries
            d, _, _, nb = info(o)
            dims[o] = d
            steps.append(PlanStep(f"Constant {(node.name or o)!r}", [o], [], nb, 0))
            continue
        outputs = list(outputs)
        label = f"{op} {(node.name or (outputs[0] if outputs else ''))!r}"
        reads = [i for i in inputs if i]
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
            if hold and o in outs:  # an output: the batch's stays until the end-to-end numbers read it
                out_b += hold.outputs(n)
            ins = [dims.get(i) for i in reads]
            flops += _onnx_flops(node, op, ins, n)
            if hold:
                temp = max(temp, hold.temp(onnx_conv(node, op), d, ins, n))
        steps.append(PlanStep(label, out, reads, out_b, flops, temp))
    return steps


_ONNX_FLOATS = frozenset({1, 10, 11, 16})  # FLOAT, FLOAT16, DOUBLE, BFLOAT16
