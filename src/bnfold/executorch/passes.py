"""ExecuTorch passes that run the bnfold program fold.

Two shapes of the same fold, both calling ``bnfold.torch_export.fold_program``
(no fold logic lives here):

``FoldBatchNormPass``
    An ``ExportedProgramPassBase`` for ``EdgeProgramManager.transform([...])``
    and ``to_edge_transform_and_lower(..., transform_passes=[...])``.  It
    returns a new edge program whose fused tensors are real placeholders in
    the graph signature (``p_<state_dict key>``), so every later pass and
    ``to_executorch()`` resolve them through the program they are handed.

``FoldBatchNormGraphPass``
    A GraphModule pass in the style of the Qualcomm (QNN) edge passes: it
    takes the program in its constructor and edits the graph module it is
    called with in place.  ExecuTorch updates the signature of such a pass
    positionally and the QNN passes resolve tensors against the program they
    were built with (the ATen program, in ``to_edge_transform_and_lower_to_qnn``),
    so a new placeholder would be misread or not found.  The pass therefore
    leaves every placeholder where it is and registers each fused tensor with
    ``register_buffer`` + ``graph.get_attr``, as ``CanonicalizeConv`` and
    ``ConvertLinearToConv2d`` do; ``to_edge_transform_and_lower`` lifts those
    ``get_attr`` nodes into constants afterwards.  Placeholders whose tensor
    was replaced stay in the graph without users, like the filters
    ``CanonicalizeConv`` replaces.
"""

from __future__ import annotations

import copy
from typing import Iterable

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    TensorArgument,
)
from torch.fx import GraphModule, Node

from ..api import _check_only
from ..report import FoldReport
from ..torch_export import fold_program

from executorch.exir._program_utils import _get_updated_range_constraints
from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult, ExportPass, PassResult

_TENSOR_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


class FoldBatchNormPass(ExportedProgramPassBase):
    """Fold BatchNorm (and per-channel affines) into the conv / transposed conv /
    linear next to it, as an ExecuTorch ``ExportedProgramPassBase``.

    ``only`` restricts the layer kinds folded into (``{"conv", "linear"}``...).
    After each run ``self.report`` holds that run's ``FoldReport``.

    Not for the Qualcomm pipeline: QNN's passes read weights from the program
    they were constructed with (the ATen program), by placeholder name, so a
    conv1d folded here would be canonicalized from its pre-fold weight.  Use
    ``bnfold.executorch.qnn_pass_manager()`` there.
    """

    def __init__(self, only: Iterable[str] | None = None):
        super().__init__()
        self.only = _check_only(only)
        self.report: FoldReport | None = None

    def call(self, exported_program: ExportedProgram) -> ExportedProgramPassResult:
        result = fold_program(exported_program, only=self.only)
        self.report = result.report
        if not result.report.folded:
            return ExportedProgramPassResult(exported_program, False)
        return ExportedProgramPassResult(result.model, True)


class FoldBatchNormGraphPass(ExportPass):
    """The same fold as a GraphModule pass that edits the graph in place.

    ``edge_program`` is the program the pass resolves placeholders against
    (its signature, state_dict and constants), as for the QNN passes: the ATen
    program in ``to_edge_transform_and_lower_to_qnn``, or the edge program in
    ``QnnPassManager.transform_for_to_edge_pipeline``.  Placeholders are
    matched to that signature by name.  Fused tensors become ``get_attr``
    buffers of the graph module; no placeholder is added or removed.
    ``self.report`` holds the last run's ``FoldReport``.
    """

    def __init__(self, edge_program: ExportedProgram, only: Iterable[str] | None = None):
        super().__init__()
        self.edge_program = edge_program
        self.only = _check_only(only)
        self.report: FoldReport | None = None

    def call(self, graph_module: GraphModule) -> PassResult:
        view = program_view(self.edge_program, graph_module)
        result = fold_program(view, only=self.only)
        self.report = result.report
        if not result.report.folded:
            return PassResult(graph_module, False)
        _transplant(graph_module, view, result.model)
        return PassResult(graph_module, True)


# --------------------------------------------------------------------------- the program view


def _view_verifier():
    # The view carries whatever the pipeline holds at this point (edge ops,
    # get_attr tensors, ops a backend preserved); it is only read by the fold.
    from executorch.exir import EdgeCompileConfig
    from executorch.exir.verification.verifier import EXIREdgeDialectVerifier

    return EXIREdgeDialectVerifier(EdgeCompileConfig(_check_ir_validity=False), class_only=True)


def program_view(program: ExportedProgram, graph_module: GraphModule) -> ExportedProgram:
    """An ExportedProgram over a copy of ``graph_module``'s graph, with the
    tensors of ``program`` (placeholders matched to its signature by name) and
    the ``get_attr`` tensors of ``graph_module``.  Nothing is copied but the
    graph; neither argument is modified."""
    graph = torch.fx.Graph()
    env: dict[Node, Node] = {}
    for node in graph_module.graph.nodes:
        env[node] = graph.node_copy(node, lambda n: env[n])
    view_gm = GraphModule(graph_module, graph)

    specs = {s.arg.name: s for s in program.graph_signature.input_specs if isinstance(s.arg, TensorArgument)}
    input_specs = []
    for node in graph.nodes:
        if node.op != "placeholder":
            continue
        spec = specs.get(node.name)
        if spec is None or spec.kind not in _TENSOR_KINDS + (InputKind.USER_INPUT,):
            # Not a tensor of the program (or a kind the fold never rewrites): read it as an input.
            spec = InputSpec(InputKind.USER_INPUT, TensorArgument(node.name), None)
        elif spec.kind != InputKind.USER_INPUT and _lookup(program, spec) is None:
            spec = InputSpec(InputKind.USER_INPUT, TensorArgument(node.name), None)
        input_specs.append(spec)
    output = graph.output_node()
    outs = output.args[0] if isinstance(output.args[0], (list, tuple)) else (output.args[0],)
    old_outputs = list(program.graph_signature.output_specs)
    output_specs = []
    for i, value in enumerate(outs):
        old = old_outputs[i] if i < len(old_outputs) else None
        if old is not None and old.kind != OutputKind.USER_OUTPUT and isinstance(value, Node):
            output_specs.append(OutputSpec(old.kind, TensorArgument(value.name), old.target))
        elif isinstance(value, Node):
            output_specs.append(OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(value.name), None))
        else:
            output_specs.append(copy.copy(old) if old is not None else
                                OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(str(value)), None))
    targets = {s.target for s in input_specs if s.kind in _TENSOR_KINDS}
    return ExportedProgram(
        root=view_gm,
        graph=graph,
        graph_signature=ExportGraphSignature(input_specs=input_specs, output_specs=output_specs),
        state_dict={k: v for k, v in program.state_dict.items() if k in targets},
        range_constraints=_get_updated_range_constraints(view_gm),
        module_call_graph=copy.deepcopy(program.module_call_graph),
        example_inputs=None,
        constants={k: v for k, v in program.constants.items() if k in targets},
        verifiers=[_view_verifier()],
    )


def _lookup(program: ExportedProgram, spec: InputSpec):
    if spec.kind == InputKind.PARAMETER or (spec.kind == InputKind.BUFFER and spec.persistent):
        return program.state_dict.get(spec.target)
    return program.constants.get(spec.target)


def _tensor_of(ep: ExportedProgram, node: Node):
    if node.op == "get_attr":
        value = _getattr_path(ep.graph_module, node.target)
        return value if isinstance(value, torch.Tensor) else None
    spec = next((s for s in ep.graph_signature.input_specs
                 if isinstance(s.arg, TensorArgument) and s.arg.name == node.name), None)
    if spec is None or spec.kind not in _TENSOR_KINDS:
        return None
    return _lookup(ep, spec)


# --------------------------------------------------------------------------- writing back in place


def _transplant(gm: GraphModule, view: ExportedProgram, folded: ExportedProgram) -> None:
    """Make ``gm`` compute what ``folded`` computes without changing its placeholders.

    The graph of ``folded`` is copied into a fresh graph whose placeholders are
    ``gm``'s own, in their order.  A placeholder of ``folded`` whose tensor is
    new or was replaced becomes a ``get_attr`` of a buffer registered on
    ``gm``; so does a ``get_attr`` whose tensor changed.
    """
    old_graph = gm.graph
    view_nodes = {n.name: n for n in view.graph.nodes}
    new_graph = torch.fx.Graph(tracer_cls=old_graph._tracer_cls, tracer_extras=old_graph._tracer_extras)
    new_graph._codegen = copy.deepcopy(old_graph._codegen)
    by_name: dict[str, Node] = {}
    for ph in old_graph.nodes:
        if ph.op != "placeholder":
            continue
        by_name[ph.name] = new_graph.node_copy(ph)

    env: dict[Node, Node] = {}
    for node in folded.graph.nodes:
        if node.op == "placeholder":
            value = _tensor_of(folded, node)
            original = view_nodes.get(node.name)
            if original is not None and original.op == "placeholder" and (
                value is None or value is _tensor_of(view, original)
            ):
                env[node] = by_name[node.name]
            else:
                if value is None:
                    raise RuntimeError(f"bnfold: folded program has an unknown input '{node.name}'")
                env[node] = _register(gm, new_graph, node, value, _attr_prefix(folded, node))
        elif node.op == "get_attr":
            value = _getattr_path(folded.graph_module, node.target)
            try:
                current = _getattr_path(gm, node.target)
            except AttributeError:
                current = None
            if isinstance(value, torch.Tensor) and not (
                isinstance(current, torch.Tensor) and current.dtype == value.dtype
                and current.shape == value.shape and torch.equal(current, value)
            ):
                env[node] = _register(gm, new_graph, node, value, node.target.replace(".", "_") + "_bnfold")
            else:
                env[node] = new_graph.get_attr(node.target)
                env[node].meta = copy.copy(node.meta)
        else:
            env[node] = new_graph.node_copy(node, lambda n: env[n])
    new_graph.lint()
    gm.graph = new_graph
    gm.recompile()


def _attr_prefix(ep: ExportedProgram, node: Node) -> str:
    spec = next((s for s in ep.graph_signature.input_specs
                 if isinstance(s.arg, TensorArgument) and s.arg.name == node.name), None)
    target = spec.target if spec is not None and spec.target else node.name
    return target.replace(".", "_") + "_bnfold"


def _register(gm: GraphModule, graph: torch.fx.Graph, like: Node, value: torch.Tensor, prefix: str) -> Node:
    name = prefix
    i = 0
    while hasattr(gm, name):
        i += 1
        name = f"{prefix}{i}"
    gm.register_buffer(name, value.detach().clone().contiguous())
    node = graph.get_attr(name)
    node.meta = copy.copy(like.meta)
    return node


def _getattr_path(root, path: str):
    for part in path.split("."):
        root = getattr(root, part)
    return root
