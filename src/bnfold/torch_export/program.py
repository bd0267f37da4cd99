"""Editing an ExportedProgram's tensors and signature without touching the input (or, asked to, in it).

``ProgramEditor`` works on a copy of the graph (its nodes; the tensors, state_dict and constants are
shared until a fold replaces one: a new tensor, never a write into the input's); with
``inplace=True`` on the input program's own graph and dicts (the caller gives the input up), so
a replaced tensor is released as soon as its new value is stored.  ``build`` makes the program once,
its module's Python code generated when it is first run or read (``_lazy_program``).
Tensors the rules read or write are graph nodes: a lifted placeholder
(parameter, buffer or constant, resolved through the graph signature) or a
``get_attr`` node (how ExecuTorch passes register tensors).  New tensors keep
the kind of the tensor they replace, and are named the way ``torch.export``
names them (``p_``/``b_``/``c_`` + state_dict key), so ``save``/``load``,
``run_decompositions()``, ``.module()`` and ExecuTorch's lowering find them.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.exported_program import ModuleCallEntry
from torch.export.graph_signature import ExportGraphSignature, InputKind, InputSpec, TensorArgument
from torch.fx import Node
from torch.fx.graph_module import _copy_attr
from torch.fx.node import map_arg

from .tensors import FxTensors, like_param
from .verify import scoped_verifiers, snapshot

_PREFIX = {InputKind.PARAMETER: "p_", InputKind.BUFFER: "b_", InputKind.CONSTANT_TENSOR: "c_"}
TENSOR_KINDS = tuple(_PREFIX)
_NOT_IN_NAME = re.compile(r"\W")


class ProgramEditor(FxTensors):
    def __init__(self, ep: ExportedProgram, inplace: bool = False):
        self.ep = ep
        if inplace:  # the input's own graph, module and dicts: nothing is copied, nothing kept twice
            graph, gm = ep.graph, ep.graph_module
        else:
            graph, gm = _graph_copy(ep)
        super().__init__(gm, graph)
        self._calls_before = snapshot(graph, ep.verifiers)  # for the scoped edge dtype check (verify.py)
        self.state_dict = ep.state_dict if inplace else dict(ep.state_dict)
        self.constants = ep.constants if inplace else dict(ep.constants)
        self.input_specs: list[InputSpec] = list(ep.graph_signature.input_specs)
        self._inserted_after: dict[str, list[InputSpec]] = {}  # new specs, by the spec they follow
        self._removed: set[str] = set()
        self._spec_by_name = {s.arg.name: s for s in self.input_specs if isinstance(s.arg, TensorArgument)}
        self._targets = {s.target for s in self.input_specs if s.target} | set(self.state_dict) | set(self.constants)
        self._placeholders: dict[str, Node] | None = None
        self._spec_by_target = {s.target: s for s in self.input_specs if isinstance(s.arg, TensorArgument) and s.target}

    # ------------------------------------------------------------------ placeholders: the signature

    def spec(self, node: Any) -> InputSpec | None:
        if isinstance(node, Node) and node.op == "placeholder":
            return self._spec_by_name.get(node.name)
        return None

    def placeholder_tensor(self, node: Node) -> torch.Tensor | None:
        spec = self.spec(node)
        if spec is None or spec.kind not in TENSOR_KINDS:
            return None
        return self._store(spec).get(spec.target)

    def placeholder_target(self, node: Node) -> str | None:
        spec = self.spec(node)
        return spec.target if spec is not None else None

    def is_user_input(self, node: Node) -> bool:
        spec = self.spec(node)
        return spec is not None and spec.kind == InputKind.USER_INPUT

    def replace_placeholder(self, node: Node, value: torch.Tensor) -> None:
        spec = self.spec(node)
        store = self._store(spec)
        store[spec.target] = like_param(store[spec.target], value)
        self.set_val(node, value)

    def add_placeholder(self, like: Node, target: str, value: torch.Tensor) -> Node:
        target = self.unique_target(target)
        self._targets.add(target)
        spec = self.spec(like)
        name = _NOT_IN_NAME.sub("_", _PREFIX[spec.kind] + target.replace(".", "_"))
        with self.graph.inserting_after(like):
            # create_node with an explicit name: fx makes it unique (without the slow name
            # derivation graph.placeholder does), and a placeholder's target is its name.
            node = self.graph.create_node("placeholder", name, name=name)
        if node.target != node.name:  # each set is a Node.__setattr__: the node out of the lookup table and back
            node.target = node.name
        new_spec = InputSpec(
            spec.kind, TensorArgument(node.name), target, spec.persistent if spec.kind == InputKind.BUFFER else None
        )
        # inserting_after(like) puts the newest node first, right after ``like``
        self._inserted_after.setdefault(spec.arg.name, []).insert(0, new_spec)
        self._spec_by_name[node.name] = new_spec
        self._spec_by_target[target] = new_spec
        if self._placeholders is not None:
            self._placeholders[node.name] = node
        store = self._store(new_spec)
        store[target] = like_param(store.get(spec.target), value)
        self.set_val(node, value)
        return node

    def drop_placeholder(self, node: Node) -> None:
        spec = self.spec(node)
        if spec is None or spec.kind not in TENSOR_KINDS:
            return
        self.graph.erase_node(node)
        self._removed.add(spec.arg.name)
        del self._spec_by_name[node.name]
        self._spec_by_target.pop(spec.target, None)
        self._store(spec).pop(spec.target, None)

    def unique_target(self, target: str) -> str:
        if target not in self._targets:
            return target
        i = 1
        while f"{target}_{i}" in self._targets:
            i += 1
        return f"{target}_{i}"

    def placeholder_for_target(self, target: str) -> Node | None:
        if self._placeholders is None:
            self._placeholders = {n.name: n for n in self.graph.nodes if n.op == "placeholder"}
        spec = self._spec_by_target.get(target)
        node = self._placeholders.get(spec.arg.name) if spec is not None else None
        return node if node is not None and not getattr(node, "_erased", False) else None

    def current_input_specs(self) -> list[InputSpec]:
        """The input specs in placeholder order: new tensors follow the tensor they derive from."""
        specs: list[InputSpec] = []

        def emit(spec: InputSpec) -> None:
            name = spec.arg.name if isinstance(spec.arg, TensorArgument) else None
            if name not in self._removed:
                specs.append(spec)
            for new_spec in self._inserted_after.get(name, []):
                emit(new_spec)

        for spec in self.input_specs:
            emit(spec)
        return specs

    def build(self) -> ExportedProgram:
        output = next(n for n in reversed(self.graph.nodes) if n.op == "output")
        outs = list(output.args[0]) if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
        output_specs = []
        for spec, value in zip(self.ep.graph_signature.output_specs, outs):
            spec = copy.copy(spec)
            if isinstance(spec.arg, TensorArgument) and isinstance(value, Node):
                spec.arg = TensorArgument(value.name)
            output_specs.append(spec)
        signature = ExportGraphSignature(input_specs=self.current_input_specs(), output_specs=output_specs)
        verifiers = list(self.ep.verifiers)
        build_with = scoped_verifiers(verifiers, self.graph, self._calls_before)
        fields = dict(
            graph_signature=signature,
            state_dict=self.state_dict,
            range_constraints=copy.copy(self.ep.range_constraints),
            module_call_graph=_call_graph_copy(self.ep.module_call_graph),
            example_inputs=self.ep.example_inputs,
            constants=self.constants,
        )
        ep = _lazy_program(self.ep, self.gm, self.graph, build_with, fields)
        if ep is None:
            ep = ExportedProgram(root=self.gm, graph=self.graph, verifiers=build_with, **fields)
        if build_with is not verifiers:
            ep._verifiers = verifiers  # the program verifies in full in every later step
        ep.graph_module.meta.update(self.gm.meta)
        return ep

    def _store(self, spec: InputSpec) -> dict:
        if spec.kind == InputKind.PARAMETER or (spec.kind == InputKind.BUFFER and spec.persistent):
            return self.state_dict
        return self.constants


#: What an ExportedProgram holds in the torch releases bnfold supports (2.13, 2.14): ``_lazy_program`` sets each.
_PROGRAM_FIELDS = frozenset(
    ("_graph_module", "_graph_signature", "_state_dict", "_range_constraints", "_module_call_graph")
    + ("_example_inputs", "_constants", "_verifiers", "_guards_code")
)


def _lazy_program(like: ExportedProgram, root, graph, verifiers: list, fields: dict) -> ExportedProgram | None:
    """The program ``ExportedProgram(root, graph, verifiers=verifiers, **fields)`` builds, verified the same way
    (``validate``: every verifier over the whole program), but whose module generates and compiles its Python
    code when it is first run or read (torch.fx's ``_LazyGraphModule``) instead of at once: ``.module()``,
    ``run_decompositions``, ``save`` and ExecuTorch's lowering each generate their own code from the graph, so
    the constructor's was made for nothing (0.14 s of a 0.9 s fold of part A's 800-block chain).  What else the
    constructor does is not needed here: the fold adds no ``getitem`` (its duplicate-getitem pass finds
    nothing to merge) and changes no shape (the guards are ``like``'s).  None where this torch's program holds
    other fields than those known (``_PROGRAM_FIELDS``): the caller then uses the constructor."""
    try:
        from torch.fx._lazy_graph_module import _LazyGraphModule
    except ImportError:
        return None
    if set(vars(like)) != _PROGRAM_FIELDS or not verifiers:
        return None
    graph._codegen = torch.fx.graph.CodeGen()  # a flat graph, as the constructor makes it
    gm = _LazyGraphModule(root, graph)
    gm.meta.update(root.meta)
    ep = ExportedProgram.__new__(ExportedProgram)
    vars(ep).update({"_" + k: v for k, v in fields.items()})
    vars(ep).update(_graph_module=gm, _verifiers=verifiers, _guards_code=list(like._guards_code))
    ep.validate()
    return ep


def _graph_copy(ep: ExportedProgram) -> tuple[torch.fx.Graph, torch.fx.GraphModule]:
    """A new graph (nodes copied, meta dicts shallow-copied) over the same attributes: tensors are
    replaced, never written into, so the input program cannot change.  The module is only a holder
    for get_attr tensors; the program's module is built once, by ``build`` (its code when first used)."""
    graph = _copy_nodes(ep.graph)
    gm = torch.fx.GraphModule(ep.graph_module, torch.fx.Graph())
    for node in graph.nodes:
        if node.op == "get_attr":
            _copy_attr(ep.graph_module, gm, node.target)
    gm._graph, graph.owning_module = graph, gm
    gm.meta.update(ep.graph_module.meta)
    return graph, gm


def _copy_nodes(source: torch.fx.Graph) -> torch.fx.Graph:
    """``source``'s nodes in a new graph, in order, under the same names (the graph signature refers to
    the exported names, also where fx would pick another, e.g. for "input"), each ``meta`` dict
    shallow-copied: what ``copy.deepcopy(graph)`` makes, less the per-node work of ``Graph.create_node``
    that a valid graph's copy does not need (a scan of every argument for raw symbolic values, a lookup
    table entry removed and put back when ``meta`` is set).  0.13 -> 0.07 s for part A's 800-block chain
    (7202 nodes).  A torch without those graph internals gets the deep copy."""
    graph = torch.fx.Graph(tracer_cls=source._tracer_cls)
    names, table = getattr(graph, "_graph_namespace", None), getattr(graph, "_find_nodes_lookup_table", None)
    if names is None or table is None or not hasattr(graph, "_insert") or not hasattr(graph, "_len"):
        return _renamed(source, copy.deepcopy(source))
    env: dict[Node, Node] = {}
    get = env.__getitem__
    for node in source.nodes:
        new = Node(
            graph, node.name, node.op, node.target, map_arg(node.args, get), map_arg(node.kwargs, get), node.type
        )
        meta, fresh = node.meta, new.meta
        if type(meta) is dict and type(fresh) is dict and not fresh:
            fresh.update(meta)  # the new node's own empty dict filled: no Node.__setattr__ (a lookup-table probe)
        else:  # copied before the node is in the lookup table: no update there
            new.meta = copy.copy(meta)
        names.associate_name_with_obj(names.create_name(node.name, None), new)
        graph._insert(new)
        table.insert(new)
        graph._len += 1
        env[node] = new
    graph._codegen = copy.deepcopy(source._codegen)
    return graph


def _renamed(source: torch.fx.Graph, graph: torch.fx.Graph) -> torch.fx.Graph:
    for old, new in zip(source.nodes, graph.nodes):
        if new.name != old.name:  # copying renames nodes fx would not pick (e.g. "input")
            new.name = old.name
    return graph


def _call_graph_copy(entries: list[ModuleCallEntry]) -> list[ModuleCallEntry]:
    """New entries (the program's constructor renames values in their signatures), each signature
    deep-copied; an entry without one (every submodule of a plain export) is only its name.  A deep
    copy of the list took 12 ms for part A's 800-block chain (2402 entries, one signature), this 1.4 ms."""
    return [ModuleCallEntry(e.fqn, copy.deepcopy(e.signature)) for e in entries]
