"""An index over an ONNX model's graphs (``ModelIndex``): who produces and who uses
each value, where constants live (computed ones through :class:`~.const_eval.ConstantEvaluator`),
and the names in use.  The edits a fold makes are :class:`~.editor.ModelEditor`'s; the clean-up
after a fold is :mod:`.clean_up`.  Names are ONNX's identity of a value, so a fold keeps every name
a downstream node, a graph output or a subgraph refers to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import onnx
from onnx import GraphProto, NodeProto, TensorProto

from .const_eval import Const, ConstantEvaluator
from .consts import CONST_OPS
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
        #: ``id()`` of the nodes removed and of the anchors of ``inserts``, until ``compact`` places them; the objects
        #: are held in ``_marked`` (a proto's Python wrapper lives only while held, and the next one made may take its
        #: id), so no other node can take a marked one's id
        self.dead: set[int] = set()
        self._marked: list = []
        #: the element type ONNX shape inference gives a value (``Shapes.elem_type``), or None
        self.inferred_type: Callable[[str], int | None] = lambda name: None
        #: the dims ONNX shape inference gives a value (``Shapes.dims``: ints, or names / None), or None
        self.inferred_dims: Callable[[str], list | None] = lambda name: None
        self.inserts: dict[int, list[NodeProto]] = {}
        self._dead: dict[int, bool] = {}  # id(node) -> a constant node nobody uses (see _dead_const)
        self.evaluator = ConstantEvaluator(self)
        self._add_graph(model.graph, None, "graph")

    # ------------------------------------------------------------------ build
    def read_again(self) -> None:
        """Index the model as it is now (after ``ModelEditor.compact``, whose node lists may be new elements: the
        index's nodes, producers and uses would name protos no longer in the graph).  A graph proto still in the
        model keeps its :class:`GraphInfo`, read again; one that is not (a subgraph of a node ``compact`` copied is a
        new proto, with a new :class:`GraphInfo`) is left empty: hold no :class:`GraphInfo` across ``compact``.
        Names only grow (those reserved stay reserved); constants are computed anew, as by a new index."""
        old = {id(gi.graph): gi for gi in self.graphs}  # each held by its GraphInfo: the ids are distinct
        self.graphs, self.uses = [], {}
        self._add_graph(self.model.graph, None, "graph", old)
        for gi in old.values():  # graphs the model no longer holds: nothing to find through them
            _empty(gi)
        self._dead.clear()
        self.evaluator.forget()
        self.evaluator = ConstantEvaluator(self)  # metered anew, as in a new index

    def _add_graph(
        self, graph: GraphProto, parent: GraphInfo | None, path: str, old: dict[int, GraphInfo] | None = None
    ) -> None:
        gi = old.pop(id(graph), None) if old else None
        if gi is None:
            gi = GraphInfo(graph, parent, path)
        else:  # the same graph read again
            _empty(gi)
            gi.parent, gi.path = parent, path
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
                self._add_graph(sub, gi, f"{path}/{label(node)}.{attr_name}", old)

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
        self.evaluator.forget()

    def constant(self, gi: GraphInfo, name: str, what: str) -> Const | str:
        """The constant ``name`` as seen from ``gi``, or a reason it is not one (computed ones:
        :meth:`.const_eval.ConstantEvaluator.constant`)."""
        return self.evaluator.constant(gi, name, what)

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


def _empty(gi: GraphInfo) -> None:
    """Forget what ``gi`` indexed of its graph."""
    gi.nodes, gi.producer, gi.inits, gi.inputs, gi.outputs = [], {}, {}, set(), set()


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


def _reserve(taken: set[str], base: str) -> str:
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name
