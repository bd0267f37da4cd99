"""The ONNX constant evaluator: a value that a chain of ``CONST_OPS`` nodes (:mod:`.consts`) computes from
constants.  One step evaluates a node (:func:`evaluate_node`: the run-time check records the op, the meter
(:class:`bnfold.io.meter.WorkMeter`) is charged with what it makes before anything is made, and keeps its
bytes until it is dropped); two drivers walk a graph with it: :class:`ConstantEvaluator`, lazily, for the fold
(a value when the fold asks for it, each node once), and :func:`graph_constants`, eagerly, for the audit's
programs (every constant of the main graph in graph order); each drops a computed value once nothing will read
it."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import NodeProto, TensorProto

from ..fold_math import FoldError
from ..io.budget import Budget
from ..io.meter import WorkMeter
from ..io.run_checks import before_op
from . import tensors
from .consts import CONST_OPS, evaluate, inputs_needed, shape_carrier, shape_slice
from .nodes import is_onnx_op, label
from .semantics import attrs, constant, opset_of
from .semantics.values import array

if TYPE_CHECKING:
    from .index import GraphInfo, ModelIndex, Use


def work_meter(held: int) -> WorkMeter:
    """The running check of constant evaluation, its budget from the ``held`` bytes of the weights."""
    return WorkMeter(Budget.for_content(held), "constant evaluation")


def evaluate_node(node: NodeProto, values: list, meter: WorkMeter, opset: int | None, key: Any) -> np.ndarray | None:
    """The one step of constant evaluation: ``node``'s first output from its constant inputs ``values``
    (:func:`.consts.evaluate`), or None when it is no constant here.  The run-time check records the op first
    (:func:`bnfold.io.run_checks.before_op`: an allocator failure names it, the CPU-time bound stops it), then
    ``meter`` is charged with what it makes (refused past the budget before anything is made) and keeps the
    value's bytes under ``key`` until it is dropped (``meter.free(key)``)."""
    before_op(f"{node.op_type} '{node.name or node.output[0]}'")
    before = meter.bytes
    try:
        value = evaluate(node, values, meter, opset)
    except (ValueError, TypeError, KeyError, IndexError, OverflowError):
        value = None
    meter.keep(key, meter.bytes - before, 0 if value is None else int(value.nbytes))
    return value


@dataclass
class Const:
    """A constant's value and where it is stored.  A streamed initializer (its data left on disk by
    ``load_onnx(path, stream=True)``) is read when ``value`` is asked for, each time, and never held:
    finding a constant, its shape and where it is stored read no data."""

    stored: np.ndarray | None  # the value, or None for a streamed initializer (``tensor``)
    elem_type: int
    gi: GraphInfo
    node: NodeProto | None  # the Constant node, or None for an initializer
    tensor: TensorProto | None = None  # the streamed initializer

    @property
    def value(self) -> np.ndarray:
        return tensors.to_numpy(self.tensor) if self.stored is None else self.stored

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.tensor.dims) if self.stored is None else self.stored.shape


class ConstantEvaluator:
    """The constants of ``index``'s graphs: stored ones read, computed ones evaluated on demand."""

    def __init__(self, index: ModelIndex):
        self.index = index
        self._meter = None
        self._values: dict[int, np.ndarray | None] = {}  # id(node) -> its computed value (see constant)

    def forget(self) -> None:
        """The graph was edited: drop every computed value."""
        self._values.clear()
        if self._meter is not None:
            self._meter.free_all()

    def constant(self, gi: GraphInfo, name: str, what: str) -> Const | str:
        """The constant ``name`` as seen from ``gi``, or a reason it is not one.

        A value computed by a chain of ``CONST_OPS`` nodes is evaluated
        iteratively (an explicit stack: a chain of any length, no recursion),
        each node once, and metered (:meth:`meter`).
        """
        found = self._find(gi, name, what)
        if not isinstance(found, tuple):
            return found
        g, node = found
        value = self._evaluate_chain(g, node)
        if value is None:
            return f"{what} '{name}' is computed by {node.op_type} '{label(node)}', not a constant"
        return Const(value, onnx.helper.np_dtype_to_tensor_dtype(value.dtype), g, node)

    def _find(self, gi: GraphInfo, name: str, what: str) -> Const | str | tuple[GraphInfo, NodeProto]:
        """Where ``name`` comes from: a stored constant, a reason it is none, or the node that computes it."""
        if not name:
            return f"{what} is missing"
        for g in gi.chain():
            if name in g.inits:
                if name in g.inputs and self.index.ir_version >= 4:
                    return f"{what} '{name}' is also a graph input, so a caller can override it"
                return _const(g.inits[name], g, None)
            if name in g.producer:
                node = g.producer[name][0]
                if is_onnx_op(node, "Constant"):
                    t = tensors.constant_attr_tensor(node)
                    if t is not None:
                        return _const(t, g, node)
                elif is_onnx_op(node, *CONST_OPS) and node.output[0] == name:
                    return g, node
                return f"{what} '{name}' is computed by {node.op_type} '{label(node)}', not a constant"
            if name in g.inputs:
                return f"{what} '{name}' is a graph input, not a constant"
        return f"{what} '{name}' is not defined in scope"

    def _evaluate_chain(self, gi: GraphInfo, node: NodeProto) -> np.ndarray | None:
        """The value of ``node`` (a ``CONST_OPS`` node), evaluating the ones it reads first, without
        recursion.  A node that reads a value known not to be a constant is no constant: that is
        looked for first, breadth-first (:meth:`_reads_non_constant`), so a node on a data path is
        decided by its nearest data input, not by walking its whole constant-typed past."""
        memo = self._values
        if id(node) not in memo and self._reads_non_constant(gi, node):
            memo[id(node)] = None
        frames = [[gi, node, inputs_needed(node), 0]]
        on_path = {id(node)}
        while frames:
            frame = frames[-1]
            g, n, needed, pos = frame
            if id(n) not in memo:
                pending, frame[3] = self._next_input(g, n, needed, pos, on_path)
                if pending is not None:
                    frames.append([pending[0], pending[1], inputs_needed(pending[1]), 0])
                    on_path.add(id(pending[1]))
                    continue
                memo[id(n)] = self._evaluate(g, n, memo) if frame[3] == len(needed) else None
            on_path.discard(id(n))
            frames.pop()
        return memo[id(node)]

    def _next_input(
        self, gi: GraphInfo, node: NodeProto, needed: list[int], pos: int, on_path: set[int]
    ) -> tuple[tuple[GraphInfo, NodeProto] | None, int]:
        """From input ``needed[pos]`` on: the first computed input still to evaluate and where it is;
        or ``(None, pos)`` with ``pos`` the input that is no constant (``len(needed)``: all are)."""
        memo = self._values
        while pos < len(needed):
            found = self._find(gi, node.input[needed[pos]], "input")
            if isinstance(found, str):
                return None, pos
            if isinstance(found, tuple):
                key = id(found[1])
                if key not in memo:
                    return (None, pos) if key in on_path else (found, pos)  # on the path: a cycle
                if memo[key] is None:
                    return None, pos
            pos += 1
        return None, pos

    def _reads_non_constant(self, gi: GraphInfo, node: NodeProto) -> bool:
        """Whether a value ``node`` needs, directly or through the ``CONST_OPS`` nodes it reads, is known
        not to be a constant (a graph input, the output of another op, a node already evaluated to
        nothing).  Breadth-first, each node once, no arrays made."""
        memo = self._values
        queue, seen = deque([(gi, node)]), {id(node)}
        while queue:
            g, n = queue.popleft()
            for i in inputs_needed(n):
                found = self._find(g, n.input[i], "input")
                if isinstance(found, str):
                    return True
                if not isinstance(found, tuple):
                    continue
                key = id(found[1])
                if key in memo:
                    if memo[key] is None:
                        return True
                elif key not in seen:
                    seen.add(key)
                    queue.append(found)
        return False

    def _evaluate(self, gi: GraphInfo, node: NodeProto, memo: dict) -> np.ndarray | None:
        """The value an exporter's Identity/Cast/Expand/Shape/... node computes from constants.
        Omitted trailing inputs (empty names) are absent; an omitted one before a given one is None."""
        values: list[np.ndarray | None] = []
        needed = inputs_needed(node)
        given = list(node.input)
        while given and not given[-1]:
            given.pop()
        for i, name in enumerate(given):
            if i in needed:
                f = self._find(gi, name, "input")
                v = memo.get(id(f[1])) if isinstance(f, tuple) else None if isinstance(f, str) else f.value
                if v is None:
                    return None
                values.append(v)
            elif node.op_type == "CastLike" and i == 1:
                dtype = self.index.declared_dtype(gi, name)
                if dtype is None:
                    return None
                values.append(np.empty(0, dtype=dtype))
            elif node.op_type == "Shape" and i == 0:
                dims = self._known_dims(gi, node, name)
                if dims is None:
                    return None
                values.append(shape_carrier(dims))
            else:
                values.append(None)
        value = evaluate_node(node, values, self.meter(), self.index.opset, id(node))
        if value is not None:
            self._free_read(gi, node, needed, memo)
        return value

    def _free_read(self, gi: GraphInfo, node: NodeProto, needed: list[int], memo: dict) -> None:
        """Drop the computed values ``node`` read whose every reader is a constant op computed by now:
        nothing will read them again unless they are computed anew (and metered anew).  Values under
        ``FREE_MIN_BYTES`` stay (still counted): a long chain of small ones, walked back by the clean-up,
        is not computed again for each of its nodes."""
        from ..io.meter import FREE_MIN_BYTES

        def computed(u: Use) -> bool:  # a constant op computed by now (``node`` is being memoized)
            return u.node is not None and is_onnx_op(u.node, *CONST_OPS) and (u.node is node or id(u.node) in memo)

        for i in needed:
            found = self._find(gi, node.input[i], "input")
            if not isinstance(found, tuple) or memo.get(id(found[1])) is None:
                continue
            g, source = found
            if memo[id(source)].nbytes < FREE_MIN_BYTES:
                continue
            if all(computed(u) for o in source.output if o for u in self.index.visible_uses(g, o)):
                del memo[id(source)]
                self.meter().free(id(source))

    def _known_dims(self, gi: GraphInfo, node: NodeProto, name: str) -> list[int] | None:
        """The dims of ``name`` as far as the ``Shape`` node ``node`` reads them (the dims outside its
        slice may be unknown: 1 stands for them), or None when one it returns is not a fixed number:
        a stored or computed constant's own shape, else what shape inference gives a computed value."""
        found = self._find(gi, name, "input")
        if isinstance(found, Const):
            dims = list(found.shape)
        elif isinstance(found, tuple) and self._values.get(id(found[1])) is not None:
            dims = list(self._values[id(found[1])].shape)
        else:
            dims = self.index.inferred_dims(name)
        if dims is None:
            return None
        start, end = shape_slice(node, len(dims))
        if not all(isinstance(d, int) and d >= 0 for d in dims[start:end]):
            return None
        return [d if start <= k < end else 1 for k, d in enumerate(dims)]

    def meter(self):
        """The running check of constant evaluation (``bnfold.io.meter.WorkMeter``), its budget from the weights:
        the values held in the memo of computed constants count until they are dropped."""
        if self._meter is None:
            self._meter = work_meter(sum(tensors.nbytes(t) for g in self.index.graphs for t in g.inits.values()))
        return self._meter


def _const(t: TensorProto, gi: GraphInfo, node: NodeProto | None) -> Const | str:
    try:
        if tensors.streamed(t):
            return Const(None, t.data_type, gi, node, t)
        return Const(tensors.to_numpy(t), t.data_type, gi, node)
    except FoldError as e:
        return str(e)


def node_fields(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, str, list[str], list[str], str]]:
    """``(node, op type, inputs, outputs, name)`` of each node (an unnamed node is ``op_type_index``), read once
    (reading a protobuf field is slow)."""
    out = []
    for i, node in enumerate(model.graph.node):
        op = node.op_type
        out.append((node, op, list(node.input), list(node.output), node.name or f"{op}_{i}"))
    return out


def graph_constants(
    model: onnx.ModelProto, nodes: list | None = None, read: dict | None = None
) -> dict[str, np.ndarray]:
    """The graph's initializers and ``Constant`` outputs, and what the fold's constant evaluator
    (:func:`evaluate_node`) computes from them (``Identity`` copies, a ``ConstantOfShape`` fill,
    a Reshape of statistics, a standardized weight), by value name.  Metered as the fold's evaluation is
    (over the budget is a WorkError, before anything is made), counting what is alive: a computed value
    that only constant ops read is dropped once they are computed (the runner computes it again if a batch
    needs it; what the emulator reads as a constant, such as a layer's weight or a norm's statistics, is
    read by a node that is no constant op and stays).  ``nodes``: the node fields :func:`_node_fields` read, when
    they are at hand; ``read``: initializers' arrays already read, by name, or stand-ins of those left unread
    (objects with ``nbytes`` and ``array()``, returned as they are: a constant op that reads one reads it).  The
    eager twin of :class:`ConstantEvaluator` (the audit needs every constant of the main graph), through the same
    step."""
    nodes = node_fields(model) if nodes is None else nodes
    read = read or {}
    out = {t.name: read[t.name] if t.name in read else array(t) for t in model.graph.initializer}
    opset = opset_of(model)
    meter = work_meter(sum(v.nbytes for v in out.values()))
    readers: dict[str, int] = {}
    for _, _, ins, _, _ in nodes:
        for n in set(ins):
            readers[n] = readers.get(n, 0) + 1
    keep = {o.name for o in model.graph.output} | set(out)
    computed: set[str] = set()
    for node, op, ins, outs, _ in nodes:
        if op == "Constant" and outs:
            out[outs[0]] = constant_value(node)
            keep.add(outs[0])
        elif op == "Identity" and ins and ins[0] in out:
            out[outs[0]] = out[ins[0]]
            keep.add(outs[0])  # an alias: no bytes of its own
        elif op in CONST_OPS and node.domain in ("", "ai.onnx") and outs and outs[0]:
            if all(ins[i] in out for i in inputs_needed(node)) and all(n in out for n in ins if n):
                value = evaluate_node(node, [_array(out[n]) for n in ins if n], meter, opset, outs[0])
                if value is None:
                    continue
                out[outs[0]] = value
                computed.add(outs[0])
                for n in set(ins):  # read by one more computed constant op: dropped after its last
                    readers[n] -= 1
                    if n in computed and n not in keep and readers[n] == 0:
                        del out[n]
                        meter.free(n)
    return out


def _array(v: Any) -> np.ndarray:
    """A value :func:`graph_constants` holds as an array (a stand-in of an unread initializer read now)."""
    return v if isinstance(v, np.ndarray) else v.array()


def constant_value(node: onnx.NodeProto) -> np.ndarray:
    """A ``Constant`` node's value (:func:`bnfold.onnx.semantics.constant`), its one tensor read directly."""
    if len(node.attribute) == 1:
        a = node.attribute[0]
        if a.name == "value" and a.type == onnx.AttributeProto.TENSOR and not a.ref_attr_name:
            return array(a.t)
    return constant(attrs(node))
