"""Editing a bare GraphModule in place, as ExecuTorch's GraphModule passes do.

QNN's edge passes receive a ``GraphModule`` whose placeholders stand for the
tensors of a program they were built with, matched by name.  ``GraphModuleEditor``
reads placeholders through that program's signature and never changes them:
every folded tensor becomes a tensor of the graph module read by a ``get_attr``
node (as QNN's ``CanonicalizeConv`` adds its own), and a placeholder whose
tensor was replaced stays in the graph without users.  ``get_attr`` tensors
are read and written as they are.

A new tensor is registered as a parameter that needs no gradient, not as a
buffer: ExecuTorch's ``ExportPass`` re-traces a ``get_attr`` tensor with static
shapes only when it is a parameter.  A buffer's dims become symbols there,
which QNN's ``ExpandBroadcastTensorShape`` cannot hash (a folded linear's
``[out]`` bias beside its ``[N, out]`` product failed in its pipeline).
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, TensorArgument
from torch.fx import GraphModule, Node

from .tensors import FxTensors

_TENSOR_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


class GraphModuleEditor(FxTensors):
    """``gm``'s own graph, edited in place; ``program`` resolves its placeholders (may be None)."""

    def __init__(self, gm: GraphModule, program: ExportedProgram | None = None):
        super().__init__(gm, gm.graph)
        self._specs = {}
        self._program = program
        if program is not None:
            self._specs = {
                s.arg.name: s for s in program.graph_signature.input_specs if isinstance(s.arg, TensorArgument)
            }

    def _spec(self, node: Node):
        return self._specs.get(node.name)

    def placeholder_tensor(self, node: Node) -> torch.Tensor | None:
        spec = self._spec(node)
        if spec is None or spec.kind not in _TENSOR_KINDS:
            return None
        if spec.kind == InputKind.PARAMETER or (spec.kind == InputKind.BUFFER and spec.persistent):
            return self._program.state_dict.get(spec.target)
        return self._program.constants.get(spec.target)

    def placeholder_target(self, node: Node) -> str | None:
        spec = self._spec(node)
        return spec.target if spec is not None else None

    def is_user_input(self, node: Node) -> bool:
        spec = self._spec(node)
        return spec is None or spec.kind == InputKind.USER_INPUT

    def replace_placeholder(self, node: Node, value: torch.Tensor) -> None:
        # The program's tensor is not ours to change: its users read a new buffer instead.
        new = self.add_placeholder(node, self.target(node), value)
        node.replace_all_uses_with(new)

    def add_placeholder(self, like: Node, target: str, value: torch.Tensor) -> Node:
        last = [n for n in self.graph.nodes if n.op == "placeholder"][-1]  # get_attr nodes follow the inputs
        return self.add_attr(last, target.replace(".", "_") + "_bnfold", value, parameter=True)

    def drop_placeholder(self, node: Node) -> None:
        """Placeholders stay: the pipeline updates the signature positionally."""

    def commit(self) -> None:
        """Check and recompile the graph module after the edits."""
        self.graph.lint()
        self.gm.recompile()
