"""Editing an ExportedProgram's tensors and signature without touching the input.

``ProgramEditor`` works on a copy of the graph module, state_dict and constants.
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
from torch.export.graph_signature import ExportGraphSignature, InputKind, InputSpec, TensorArgument
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx import Node
from torch.fx.graph_module import _copy_attr

_PREFIX = {InputKind.PARAMETER: "p_", InputKind.BUFFER: "b_", InputKind.CONSTANT_TENSOR: "c_"}
TENSOR_KINDS = tuple(_PREFIX)


class ProgramEditor:
    def __init__(self, ep: ExportedProgram):
        self.ep = ep
        # A new graph (nodes copied, meta dicts shallow-copied) over the same attributes: tensors
        # are replaced, never written into, so the input program cannot change.  The module is
        # only a holder for get_attr tensors; its code is generated once, by ExportedProgram.
        self.graph = copy.deepcopy(ep.graph)
        self.gm = torch.fx.GraphModule(ep.graph_module, torch.fx.Graph())
        for node in self.graph.nodes:
            if node.op == "get_attr":
                _copy_attr(ep.graph_module, self.gm, node.target)
        self.gm._graph, self.graph.owning_module = self.graph, self.gm
        self.gm.meta.update(ep.graph_module.meta)
        for old, new in zip(ep.graph.nodes, self.graph.nodes):
            if new.name != old.name:  # copying renames nodes fx would not pick (e.g. "input"); the
                new.name = old.name   # graph signature refers to the exported names, so keep them
        self.state_dict = dict(ep.state_dict)
        self.constants = dict(ep.constants)
        self.input_specs: list[InputSpec] = list(ep.graph_signature.input_specs)
        self._inserted_after: dict[str, list[InputSpec]] = {}  # new specs, by the spec they follow
        self._removed: set[str] = set()
        self._spec_by_name = {s.arg.name: s for s in self.input_specs if isinstance(s.arg, TensorArgument)}
        self._targets = {s.target for s in self.input_specs if s.target} | set(self.state_dict) | set(self.constants)
        # How many nodes used each tensor in the input program (sharing is judged on the input).
        # Several get_attr nodes may read one attribute, so those are counted by target.
        self._original_users: dict[str, int] = {}
        for n in self.graph.nodes:
            if n.op in ("placeholder", "get_attr"):
                key = f"attr:{n.target}" if n.op == "get_attr" else n.name
                self._original_users[key] = self._original_users.get(key, 0) + len(n.users)
        self._computed: dict[str, torch.Tensor | None] = {}
        self._placeholders: dict[str, Node] | None = None
        self._spec_by_target = {s.target: s for s in self.input_specs if isinstance(s.arg, TensorArgument) and s.target}
        self._fake_mode = next((n.meta["val"].fake_mode for n in self.graph.nodes
                                if n.op == "placeholder" and hasattr(n.meta.get("val"), "fake_mode")), None)

    # ------------------------------------------------------------------ reading

    def spec(self, node: Any) -> InputSpec | None:
        if isinstance(node, Node) and node.op == "placeholder":
            return self._spec_by_name.get(node.name)
        return None

    def tensor(self, node: Any) -> torch.Tensor | None:
        """The constant tensor behind ``node``, or None if it is not a constant of the program."""
        if not isinstance(node, Node):
            return None
        if node.op == "get_attr":
            value = _getattr_path(self.gm, node.target)
            return value if isinstance(value, torch.Tensor) else None
        spec = self.spec(node)
        if spec is None or spec.kind not in TENSOR_KINDS:
            return None
        if spec.kind == InputKind.PARAMETER or (spec.kind == InputKind.BUFFER and spec.persistent):
            return self.state_dict.get(spec.target)
        return self.constants.get(spec.target)

    def constant_value(self, node: Any, _depth: int = 0) -> torch.Tensor | None:
        """Like ``tensor``, but also evaluates (in float64) a pure subgraph computed
        only from constants, e.g. FrozenBatchNorm's ``weight * (var + eps).rsqrt()``."""
        value = self.tensor(node)
        if value is not None or not isinstance(node, Node) or node.op != "call_function" or _depth > 16:
            return value
        if node.name in self._computed:
            return self._computed[node.name]
        schema = getattr(node.target, "_schema", None)
        if schema is None or schema.is_mutable or not any(isinstance(a, Node) for a in node.args):
            return None
        if torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()) or "empty" in schema.name:
            return None  # random or uninitialized: not a constant, whatever its inputs

        def resolve(arg):
            if isinstance(arg, Node):
                v = self.constant_value(arg, _depth + 1)
                if v is None:
                    raise LookupError
                return v.double() if v.is_floating_point() else v
            return arg

        try:
            args = torch.fx.node.map_aggregate(node.args, resolve)
            kwargs = torch.fx.node.map_aggregate(node.kwargs, resolve)
            value = node.target(*args, **kwargs)
        except LookupError:
            value = None
        except Exception:  # an op that cannot run eagerly on these tensors: not a constant we can use
            value = None
        value = value if isinstance(value, torch.Tensor) else None
        self._computed[node.name] = value
        return value

    def erase_dead(self, node: Any) -> None:
        """Erase ``node`` if nothing uses it any more, then its inputs in turn."""
        if not isinstance(node, Node) or node.users or getattr(node, "_erased", False):
            return
        if node.op in ("placeholder", "get_attr"):
            self.drop_if_unused(node)
            return
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None or schema.is_mutable:
            return
        inputs = list(node.all_input_nodes)
        self.graph.erase_node(node)
        for arg in inputs:
            self.erase_dead(arg)

    def target(self, node: Node) -> str:
        """The state_dict / constants key of a tensor node (get_attr: its attribute path)."""
        spec = self.spec(node)
        return spec.target if spec is not None else str(node.target)

    def describe(self, node: Any) -> str:
        if not isinstance(node, Node):
            return f"the value {node!r}"
        spec = self.spec(node)
        if spec is not None and spec.kind == InputKind.USER_INPUT:
            return f"user input '{node.name}'"
        if node.op == "call_function":
            return f"'{node.name}' ({getattr(node.target, '__name__', node.target)})"
        return f"'{node.name}'"

    def is_shared(self, node: Node) -> bool:
        """Whether the tensor behind ``node`` has (or had, in the input) more than one user."""
        if node.op == "get_attr":
            now = sum(len(n.users) for n in self.graph.nodes if n.op == "get_attr" and n.target == node.target)
            return max(now, self._original_users.get(f"attr:{node.target}", 1)) > 1
        return max(len(node.users), self._original_users.get(node.name, 1)) > 1

    # ------------------------------------------------------------------ writing

    def replace_tensor(self, node: Node, value: torch.Tensor) -> None:
        """Give ``node`` a new value in place: same name, same kind."""
        if node.op == "get_attr":
            old = _getattr_path(self.gm, node.target)
            _setattr_path(self.gm, node.target, _like(old, value))
        else:
            spec = self.spec(node)
            store = self._store(spec)
            store[spec.target] = _like(store[spec.target], value)
        old_val = node.meta.get("val")
        if getattr(old_val, "shape", None) != value.shape or getattr(old_val, "dtype", None) != value.dtype:
            self._set_val(node, value)

    def add_tensor(self, like: Node, target: str, value: torch.Tensor) -> Node:
        """A new tensor node of the same kind as ``like``, placed right after it."""
        target = self.unique_target(target)
        self._targets.add(target)
        if like.op == "get_attr":
            path = target.replace(".", "_")
            old = _getattr_path(self.gm, like.target)
            if isinstance(old, torch.nn.Parameter):
                self.gm.register_parameter(path, _like(old, value))
            else:
                self.gm.register_buffer(path, value)
            with self.graph.inserting_after(like):
                node = self.graph.get_attr(path)
        else:
            spec = self.spec(like)
            name = self._free_name(_PREFIX[spec.kind] + target.replace(".", "_"))
            with self.graph.inserting_after(like):
                # create_node with an explicit name: fx makes it unique (without the slow name
                # derivation graph.placeholder does), and a placeholder's target is its name.
                node = self.graph.create_node("placeholder", name, name=name)
            node.target = node.name
            new_spec = InputSpec(spec.kind, TensorArgument(node.name), target,
                                 spec.persistent if spec.kind == InputKind.BUFFER else None)
            # inserting_after(like) puts the newest node first, right after ``like``
            self._inserted_after.setdefault(spec.arg.name, []).insert(0, new_spec)
            self._spec_by_name[node.name] = new_spec
            self._spec_by_target[target] = new_spec
            if self._placeholders is not None:
                self._placeholders[node.name] = node
            store = self._store(new_spec)
            store[target] = _like(store.get(spec.target), value)
        self._set_val(node, value)
        return node

    def unique_target(self, target: str) -> str:
        if target not in self._targets:
            return target
        i = 1
        while f"{target}_{i}" in self._targets:
            i += 1
        return f"{target}_{i}"

    def drop_if_unused(self, node: Any) -> None:
        """Remove a tensor node that no longer has users, with its state."""
        if not isinstance(node, Node) or node.users or getattr(node, "_erased", False):
            return
        if node.op == "get_attr":
            self.graph.erase_node(node)
            return
        spec = self.spec(node)
        if spec is None or spec.kind not in TENSOR_KINDS:
            return
        self.graph.erase_node(node)
        self._removed.add(spec.arg.name)
        del self._spec_by_name[node.name]
        self._spec_by_target.pop(spec.target, None)
        self._store(spec).pop(spec.target, None)

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
        self.graph.lint()  # ExportedProgram compiles the graph module itself
        output = next(n for n in reversed(self.graph.nodes) if n.op == "output")
        outs = list(output.args[0]) if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
        output_specs = []
        for spec, value in zip(self.ep.graph_signature.output_specs, outs):
            spec = copy.copy(spec)
            if isinstance(spec.arg, TensorArgument) and isinstance(value, Node):
                spec.arg = TensorArgument(value.name)
            output_specs.append(spec)
        signature = ExportGraphSignature(input_specs=self.current_input_specs(), output_specs=output_specs)
        ep = ExportedProgram(
            root=self.gm,
            graph=self.graph,
            graph_signature=signature,
            state_dict=self.state_dict,
            range_constraints=copy.copy(self.ep.range_constraints),
            module_call_graph=copy.deepcopy(self.ep.module_call_graph),
            example_inputs=self.ep.example_inputs,
            constants=self.constants,
            verifiers=list(self.ep.verifiers),
        )
        ep.graph_module.meta.update(self.gm.meta)
        return ep

    # ------------------------------------------------------------------ helpers

    def _store(self, spec: InputSpec) -> dict:
        if spec.kind == InputKind.PARAMETER or (spec.kind == InputKind.BUFFER and spec.persistent):
            return self.state_dict
        return self.constants

    @staticmethod
    def _free_name(name: str) -> str:
        # fx makes the name unique in the graph (adding a suffix) when it is taken.
        return re.sub(r"\W", "_", name)

    def _set_val(self, node: Node, value: torch.Tensor) -> None:
        if self._fake_mode is not None:  # a fake tensor with the value's metadata, in the program's fake mode
            meta = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
            node.meta["val"] = FakeTensor(self._fake_mode, meta, value.device)
        else:
            node.meta["val"] = value
        node.meta.pop("tensor_meta", None)


def _like(old: Any, value: torch.Tensor) -> torch.Tensor:
    if isinstance(old, torch.nn.Parameter):
        return torch.nn.Parameter(value, requires_grad=old.requires_grad)
    return value


def _getattr_path(root: Any, path: str) -> Any:
    for part in path.split("."):
        root = getattr(root, part)
    return root


def _setattr_path(root: Any, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for part in parents:
        root = getattr(root, part)
    setattr(root, last, value)
