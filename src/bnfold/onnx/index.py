"""An index over an ONNX model's graphs (``ModelIndex``): who produces and who uses
each value, where constants live, and the few edits a fold makes.

Edits go to the protos at once and keep the index consistent; removed nodes are
only marked and leave their graph in :meth:`ModelIndex.compact`.  Names are
ONNX's identity of a value, so a fold keeps every name a downstream node, a
graph output or a subgraph refers to.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import onnx
from onnx import GraphProto, NodeProto, TensorProto

from ..fold_math import FoldError
from . import tensors
from .consts import CONST_OPS, evaluate, inputs_needed, shape_carrier, shape_slice
from .nodes import is_onnx_op, label, subgraphs


@dataclass(eq=False)
class GraphInfo:
    """One graph (the main graph or a subgraph) and what it defines."""

    graph: GraphProto
    parent: GraphInfo | None
    path: str
    nodes: list[NodeProto] = field(default_factory=list)
    producer: dict[str, tuple[NodeProto, int]] = field(default_factory=dict)
    inits: dict[str, TensorProto] = field(default_factory=dict)
    inputs: set[str] = field(default_factory=set)
    outputs: set[str] = field(default_factory=set)

    def chain(self) -> Iterator[GraphInfo]:
        g: GraphInfo | None = self
        while g is not None:
            yield g
            g = g.parent

    @property
    def depth(self) -> int:
        return sum(1 for _ in self.chain())


class Use(NamedTuple):
    """``node.input[idx]`` names the value; ``node is None`` means a graph output."""

    gi: GraphInfo
    node: NodeProto | None
    idx: int


@dataclass
class Const:
    """A constant's value and where it is stored."""

    value: np.ndarray
    elem_type: int
    gi: GraphInfo
    node: NodeProto | None  # the Constant node, or None for an initializer


@dataclass
class Tracker:
    """What the fold touched, kept across passes for the final clean-up."""

    touched: set[str] = field(default_factory=set)  # inputs of removed nodes / replaced params
    gone: set[str] = field(default_factory=set)  # value names that may no longer exist


class ModelIndex:
    def __init__(self, model: onnx.ModelProto, tracker: Tracker):
        self.model = model
        self.tracker = tracker
        self.ir_version = model.ir_version
        self.opset = 1
        for op in model.opset_import:
            if op.domain in ("", "ai.onnx"):
                self.opset = op.version
        self.graphs: list[GraphInfo] = []
        self.uses: dict[str, list[Use]] = {}
        self.names: set[str] = set()
        self.node_names: set[str] = set()
        self.dead: set[int] = set()
        #: the element type ONNX shape inference gives a value (``Shapes.elem_type``), or None
        self.inferred_type: Callable[[str], int | None] = lambda name: None
        #: the dims ONNX shape inference gives a value (``Shapes.dims``: ints, or names / None), or None
        self.inferred_dims: Callable[[str], list | None] = lambda name: None
        self.inserts: dict[int, list[NodeProto]] = {}
        self._meter = None
        self._dead: dict[int, bool] = {}  # id(node) -> a constant node nobody uses (see _dead_const)
        self._values: dict[int, np.ndarray | None] = {}  # id(node) -> its computed value (see constant)
        self._add_graph(model.graph, None, "graph")

    # ------------------------------------------------------------------ build
    def _add_graph(self, graph: GraphProto, parent: GraphInfo | None, path: str) -> None:
        gi = GraphInfo(graph, parent, path)
        self.graphs.append(gi)
        for v in graph.input:
            gi.inputs.add(v.name)
            self.names.add(v.name)
        for t in graph.initializer:
            gi.inits[t.name] = t
            self.names.add(t.name)
        for t in graph.sparse_initializer:
            self.names.add(t.values.name)
        for o in graph.output:
            gi.outputs.add(o.name)
            self._use(o.name, Use(gi, None, -1))
        for v in graph.value_info:
            self.names.add(v.name)
        gi.nodes = list(graph.node)
        for node in gi.nodes:
            self._index_node(gi, node)
            for attr_name, sub in subgraphs(node):
                self._add_graph(sub, gi, f"{path}/{label(node)}.{attr_name}")

    def _index_node(self, gi: GraphInfo, node: NodeProto) -> None:
        """Record ``node``'s name, the values it uses and the values it produces."""
        if node.name:
            self.node_names.add(node.name)
        for i, name in enumerate(node.input):
            if name:
                self._use(name, Use(gi, node, i))
        for i, name in enumerate(node.output):
            if name:
                gi.producer[name] = (node, i)
                self.names.add(name)

    def _use(self, name: str, use: Use) -> None:
        self.uses.setdefault(name, []).append(use)

    def _unuse(self, name: str, node: NodeProto, idx: int) -> None:
        self.uses[name] = [u for u in self.uses.get(name, []) if not (u.node is node and u.idx == idx)]

    # ----------------------------------------------------------------- queries
    def is_dead(self, node: NodeProto) -> bool:
        return id(node) in self.dead

    def visible_uses(self, gi: GraphInfo, name: str) -> list[Use]:
        """Uses of ``name`` as defined in ``gi``: in ``gi`` and in its subgraphs."""
        return [u for u in self.uses.get(name, []) if any(g is gi for g in u.gi.chain())]

    def live_uses(self, gi: GraphInfo, name: str) -> list[Use]:
        """Visible uses, less those by constant-computing nodes whose results nobody
        uses any more (the clean-up removes those)."""
        return [u for u in self.visible_uses(gi, name) if not self._dead_const(u)]

    def unused_constant(self, gi: GraphInfo, node: NodeProto) -> bool:
        """Whether ``node`` computes a constant whose results nobody uses any more (the clean-up
        removes it): a weight computed in the graph, once the layer it fed holds the folded one."""
        return self._dead_const(Use(gi, node, -1))

    def _dead_const(self, u: Use) -> bool:
        """Whether ``u`` is by a constant-computing node whose results nobody uses (also through
        others such): iterative, each node decided once until the next edit, and decided as soon
        as one user shows it is used (a graph output, a node that computes no constant, a user
        known to be used, a cycle)."""
        memo = self._dead
        if u.node is None or id(u.node) in memo:
            return u.node is not None and memo[id(u.node)]
        frames = [(u.gi, u.node, self._const_users(u.gi, u.node))]
        on_path = {id(u.node)}
        while frames:
            g, n, users = frames[-1]
            pending = _undecided_user(users, memo, on_path)
            if pending is not None:
                frames.append((pending.gi, pending.node, self._const_users(pending.gi, pending.node)))
                on_path.add(id(pending.node))
                continue
            # a user on the walk's path (a cycle) is not in memo: it counts as used
            memo[id(n)] = users is not None and all(memo.get(id(v.node), False) for v in users)
            on_path.discard(id(n))
            frames.pop()
        return memo[id(u.node)]

    def _const_users(self, gi: GraphInfo, node: NodeProto) -> list[Use] | None:
        """The uses of ``node``'s outputs, or None when ``node`` is used for sure: it computes no
        constant, or a graph output or a node that computes no constant reads it."""
        if not _computes_constant(node):
            return None
        users = [v for o in node.output if o for v in self.visible_uses(gi, o)]
        if any(v.node is None or not _computes_constant(v.node) for v in users):
            return None
        return users

    def _edited(self) -> None:
        """Forget what was derived from the graph as it was (constants, dead constant nodes)."""
        self._dead.clear()
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
                if name in g.inputs and self.ir_version >= 4:
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
                dtype = self.declared_dtype(gi, name)
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
        from ..io.run_checks import before_op

        before_op(f"{node.op_type} '{node.name or node.output[0]}'")  # the op an allocator failure names
        meter = self.meter()
        before = meter.bytes
        try:
            value = evaluate(node, values, meter, self.opset)
        except (ValueError, TypeError, KeyError, IndexError, OverflowError):
            value = None
        meter.keep(id(node), meter.bytes - before, 0 if value is None else int(value.nbytes))
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
            if all(computed(u) for o in source.output if o for u in self.visible_uses(g, o)):
                del memo[id(source)]
                self.meter().free(id(source))

    def _known_dims(self, gi: GraphInfo, node: NodeProto, name: str) -> list[int] | None:
        """The dims of ``name`` as far as the ``Shape`` node ``node`` reads them (the dims outside its
        slice may be unknown: 1 stands for them), or None when one it returns is not a fixed number:
        a stored or computed constant's own shape, else what shape inference gives a computed value."""
        found = self._find(gi, name, "input")
        if isinstance(found, Const):
            dims = list(found.value.shape)
        elif isinstance(found, tuple) and self._values.get(id(found[1])) is not None:
            dims = list(self._values[id(found[1])].shape)
        else:
            dims = self.inferred_dims(name)
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
            from ..io.budget import Budget
            from ..io.meter import WorkMeter

            held = sum(tensors.nbytes(t) for g in self.graphs for t in g.inits.values())
            self._meter = WorkMeter(Budget.for_content(held), "constant evaluation")
        return self._meter

    def declared_dtype(self, gi: GraphInfo, name: str) -> np.dtype | None:
        """The numpy dtype a value is declared with (graph input, value_info or output), if any."""
        for g in gi.chain():
            for v in list(g.graph.input) + list(g.graph.value_info) + list(g.graph.output):
                if v.name == name and v.type.HasField("tensor_type") and v.type.tensor_type.elem_type:
                    return onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)
            if name in g.inits:
                return onnx.helper.tensor_dtype_to_np_dtype(g.inits[name].data_type)
        inferred = self.inferred_type(name)
        return onnx.helper.tensor_dtype_to_np_dtype(inferred) if inferred else None

    def unique(self, base: str) -> str:
        """A value name not used anywhere in the model (and now reserved)."""
        return _reserve(self.names, base)

    def unique_node_name(self, base: str) -> str:
        """A node name not used anywhere in the model (and now reserved)."""
        return _reserve(self.node_names, base)

    # ------------------------------------------------------------------- edits
    def set_input(self, gi: GraphInfo, node: NodeProto, idx: int, name: str) -> None:
        self._edited()
        while len(node.input) <= idx:
            node.input.append("")
        old = node.input[idx]
        if old:
            self._unuse(old, node, idx)
            self.tracker.touched.add(old)
        node.input[idx] = name
        self._use(name, Use(gi, node, idx))

    def clear_input(self, gi: GraphInfo, node: NodeProto, idx: int) -> None:
        """Leave the optional input ``idx`` of ``node`` empty (trailing empty inputs are dropped)."""
        self._edited()
        old = node.input[idx]
        if old:
            self._unuse(old, node, idx)
            self.tracker.touched.add(old)
        node.input[idx] = ""
        while node.input and not node.input[-1]:
            del node.input[-1]

    def rename_output(self, gi: GraphInfo, node: NodeProto, idx: int, new: str) -> None:
        self._edited()
        old = node.output[idx]
        if gi.producer.get(old, (None,))[0] is node:
            del gi.producer[old]
        node.output[idx] = new
        gi.producer[new] = (node, idx)
        self.names.add(new)
        self.tracker.gone.add(old)

    def remove_node(self, gi: GraphInfo, node: NodeProto) -> None:
        self._dead.clear()  # the values of the nodes that stay do not change
        for i, name in enumerate(node.input):
            if name:
                self._unuse(name, node, i)
                self.tracker.touched.add(name)
        for name in node.output:
            if name and gi.producer.get(name, (None,))[0] is node:
                del gi.producer[name]
                self.tracker.gone.add(name)
        self.dead.add(id(node))

    def insert_after(self, gi: GraphInfo, anchor: NodeProto, node: NodeProto) -> None:
        """Add ``node`` right after ``anchor`` (placed at :meth:`compact`)."""
        self._edited()
        self.inserts.setdefault(id(anchor), []).append(node)
        self._index_node(gi, node)

    def add_initializer(self, gi: GraphInfo, t: TensorProto) -> None:
        self._edited()
        gi.graph.initializer.append(t)
        gi.inits[t.name] = gi.graph.initializer[len(gi.graph.initializer) - 1]
        self.names.add(t.name)
        if self.ir_version < 4 and gi.parent is None:
            # IR < 4 lists every initializer among the graph inputs.
            gi.graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
            gi.inputs.add(t.name)

    def replace_initializer(self, gi: GraphInfo, t: TensorProto) -> None:
        """Overwrite the initializer named ``t.name`` in place (same name, same slot)."""
        self._edited()
        old = gi.inits[t.name]
        changed_shape = list(old.dims) != list(t.dims)
        old.CopyFrom(t)
        if changed_shape:
            self.forget_shape(gi, t.name)
            for v in gi.graph.input:
                if v.name == t.name:
                    v.CopyFrom(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))

    def forget_shape(self, gi: GraphInfo, name: str) -> None:
        """Drop the recorded shape of ``name`` (its value changed shape)."""
        _drop_value_info(gi.graph, name)

    # --------------------------------------------------------------- finishing
    def compact(self) -> None:
        """Drop the removed nodes and place the inserted ones; deepest graphs first."""
        for gi in sorted(self.graphs, key=lambda g: -g.depth):
            nodes = list(gi.graph.node)
            if not any(id(n) in self.dead or id(n) in self.inserts for n in nodes):
                continue
            if not any(id(n) in self.inserts for n in nodes):
                for i in range(len(nodes) - 1, -1, -1):
                    if id(nodes[i]) in self.dead:
                        del gi.graph.node[i]
                continue
            kept: list[NodeProto] = []
            for n in nodes:
                if id(n) not in self.dead:
                    kept.append(n)
                kept.extend(self.inserts.get(id(n), []))
            gi.graph.ClearField("node")
            gi.graph.node.extend(kept)


def _const(t: TensorProto, gi: GraphInfo, node: NodeProto | None) -> Const | str:
    try:
        return Const(tensors.to_numpy(t), t.data_type, gi, node)
    except FoldError as e:
        return str(e)


def _computes_constant(node: NodeProto) -> bool:
    """Whether ``node`` is of a type that may compute a constant (``Constant``, ``CONST_OPS``)."""
    return is_onnx_op(node, "Constant", *CONST_OPS)


def _undecided_user(users: list[Use] | None, memo: dict[int, bool], on_path: set[int]) -> Use | None:
    """The first of ``users`` still to decide, or None when their node is decided: none is left,
    one is known to be used, or one is on the walk's path (a cycle)."""
    for v in users or ():
        key = id(v.node)
        if key in on_path or (key in memo and not memo[key]):
            return None
        if key not in memo:
            return v
    return None


def _drop_value_info(graph: GraphProto, name: str) -> None:
    _drop_value_infos(graph, {name})


def _drop_value_infos(graph: GraphProto, names: set[str]) -> None:
    """Drop the value_info entries of ``names`` (one pass over the graph's value_info)."""
    _drop_named(graph.value_info, names)


def _drop_named(entries, names: set[str]) -> None:
    """Delete the entries of a repeated proto field whose ``name`` is in ``names``: one pass to find
    them, then deletions from the end (each moves pointers in C, nothing is copied)."""
    if names:
        for i in [i for i, e in enumerate(entries) if e.name in names][::-1]:
            del entries[i]


def clean_up(model: onnx.ModelProto, tracker: Tracker, shapes=None):
    """Remove initializers and Constant nodes the fold left without users (and the
    nodes that computed a constant from them, see ``consts``), and value_info
    entries of values that no longer exist.  ``shapes`` (``onnx.shapes.Shapes``): what shape
    inference gave, for a ``CastLike`` to a type or a ``Shape`` of dims only inference knows."""
    while True:
        index = ModelIndex(model, tracker)
        if shapes is not None:
            index.inferred_type, index.inferred_dims = shapes.elem_type, shapes.dims
        removed = False
        for gi in index.graphs:
            unused = _remove_unused(index, gi, tracker)
            _drop_named(gi.graph.initializer, unused)
            _drop_value_infos(gi.graph, unused)
            removed = removed or bool(unused) or bool(index.dead)
        index.compact()
        if not removed:
            break
    index = ModelIndex(model, Tracker())
    for gi in index.graphs:
        defined: set[str] = set()
        for g in gi.chain():
            defined |= set(g.producer) | set(g.inits) | g.inputs
        _drop_value_infos(gi.graph, {name for name in tracker.gone | tracker.touched if name not in defined})


def _remove_unused(index: ModelIndex, gi: GraphInfo, tracker: Tracker) -> set[str]:
    """Mark removed the constant-computing nodes of ``gi`` that the touched values lead to and nobody
    uses; return the initializers that nobody uses any more (for the caller to delete)."""
    unused: set[str] = set()
    todo = sorted(tracker.touched, reverse=True)
    while todo:  # a removed node's inputs are looked at next, in the same index
        name = todo.pop()
        if name not in tracker.touched or index.visible_uses(gi, name):
            continue
        if name in gi.inits and name not in gi.inputs:
            unused.add(name)
            tracker.touched.discard(name)
        elif name in gi.producer and not index.is_dead(node := gi.producer[name][0]):
            if is_onnx_op(node, "Constant") or (
                is_onnx_op(node, *CONST_OPS)
                and not isinstance(index.constant(gi, name, "x"), str)
                and not any(index.visible_uses(gi, o) for o in node.output if o)
            ):
                index.remove_node(gi, node)
                tracker.touched.discard(name)
                todo.extend(n for n in node.input if n)
    return unused


def _reserve(taken: set[str], base: str) -> str:
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name
