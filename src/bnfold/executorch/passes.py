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
    ``CanonicalizeConv`` replaces.  The pass edits the graph module through the
    engine's GraphModule adapter: no program view, no copy, no transplant.
"""

from __future__ import annotations

from collections.abc import Iterable

from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult, ExportPass, PassResult
from torch.export import ExportedProgram
from torch.fx import GraphModule

from ..kinds import check_exclude, check_only
from ..report import FoldReport
from ..torch_export import fold_graph_module, fold_program


class FoldBatchNormPass(ExportedProgramPassBase):
    """Fold BatchNorm (and per-channel affines) into the conv / transposed conv /
    linear next to it, as an ExecuTorch ``ExportedProgramPassBase``.

    ``only`` restricts the layer kinds folded into (``{"conv", "linear"}``...);
    ``exclude`` holds fnmatch patterns on module paths left unfolded.  After
    each run ``self.report`` holds that run's ``FoldReport``.

    Not for the Qualcomm pipeline: QNN's passes read weights from the program
    they were constructed with (the ATen program), by placeholder name, so a
    conv1d folded here would be canonicalized from its pre-fold weight.  Use
    ``bnfold.executorch.qnn_pass_manager()`` there.
    """

    def __init__(
        self, only: Iterable[str] | None = None, lower_unfoldable: bool = False, exclude: Iterable[str] | None = None
    ):
        super().__init__()
        self.only = check_only(only)
        self.exclude = check_exclude(exclude)
        self.lower_unfoldable = lower_unfoldable
        self.report: FoldReport | None = None

    def call(self, exported_program: ExportedProgram) -> ExportedProgramPassResult:
        result = fold_program(
            exported_program, only=self.only, exclude=self.exclude, lower_unfoldable=self.lower_unfoldable
        )
        self.report = result.report
        if not (result.report.folded or result.report.lowered):
            return ExportedProgramPassResult(exported_program, False)
        return ExportedProgramPassResult(result.model, True)


class FoldBatchNormGraphPass(ExportPass):
    """The same fold as a GraphModule pass that edits the graph in place.

    ``edge_program`` is the program the pass resolves placeholders against
    (its signature, state_dict and constants), as for the QNN passes: the ATen
    program in ``to_edge_transform_and_lower_to_qnn``, or the edge program in
    ``QnnPassManager.transform_for_to_edge_pipeline``.  Placeholders are
    matched to that signature by name and never changed.  Fused tensors become
    ``get_attr`` buffers of the graph module.  ``self.report`` holds the last
    run's ``FoldReport``.  ``only`` and ``exclude`` as for :class:`FoldBatchNormPass`.
    """

    def __init__(
        self,
        edge_program: ExportedProgram,
        only: Iterable[str] | None = None,
        lower_unfoldable: bool = False,
        exclude: Iterable[str] | None = None,
    ):
        super().__init__()
        self.edge_program = edge_program
        self.only = check_only(only)
        self.exclude = check_exclude(exclude)
        self.lower_unfoldable = lower_unfoldable
        self.report: FoldReport | None = None

    def call(self, graph_module: GraphModule) -> PassResult:
        self.report = fold_graph_module(
            graph_module,
            self.edge_program,
            only=self.only,
            exclude=self.exclude,
            lower_unfoldable=self.lower_unfoldable,
        )
        return PassResult(graph_module, bool(self.report.folded or self.report.lowered))
