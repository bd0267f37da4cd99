"""Folding fx graphs: an ExportedProgram (a new program) or a GraphModule (in place)."""

from __future__ import annotations

from torch.export import ExportedProgram
from torch.fx import GraphModule

from ..engine import fold_graph
from ..report import FoldReport, FoldResult
from .graph import FxGraph
from .graph_module import GraphModuleEditor
from .program import ProgramEditor


def fold_program(
    ep: ExportedProgram, only=None, exclude=(), lower_unfoldable: bool = False, inplace: bool = False
) -> FoldResult:
    """Fold every foldable normalization in ``ep``; ``ep`` itself is not modified, unless ``inplace``:
    then ``ep`` is consumed (its graph, state_dict and constants become the result's, and ``ep`` must
    not be used again), and no second copy of the graph or of the tensors is made.

    ``exclude``: fnmatch patterns on module paths left unfolded (see ``bnfold.engine.fold_graph``);
    ``lower_unfoldable``: each eval batch norm that stays becomes ``x * scale + shift``."""
    if not isinstance(ep, ExportedProgram):
        raise TypeError(f"expected a torch.export.ExportedProgram, got {type(ep).__name__}")
    editor = ProgramEditor(ep, inplace=inplace)
    report = fold_graph(FxGraph(editor), only, exclude, lower=lower_unfoldable)
    return FoldResult(editor.build(), report)


def range_edit_program(ep: ExportedProgram, edit) -> tuple[ExportedProgram, list]:
    """``edit(adapter)`` (the fp16 range rewrite, ``bnfold.engine.range``) on a copy of ``ep``: the new program
    (``ep`` itself when nothing was rewritten) and the entries ``edit`` returned."""
    editor = ProgramEditor(ep)
    entries = edit(FxGraph(editor))
    return (editor.build() if any(e.factor != 1.0 for e in entries) else ep), entries


def fold_graph_module(
    gm: GraphModule, program: ExportedProgram | None = None, only=None, lower_unfoldable: bool = False, exclude=()
) -> FoldReport:
    """Fold ``gm`` in place, as an ExecuTorch GraphModule pass does.

    Placeholders are read through ``program``'s signature (matched by name) and
    never changed; folded tensors become ``get_attr`` buffers of ``gm``.
    ``only`` / ``exclude`` as for :func:`fold_program`.
    """
    editor = GraphModuleEditor(gm, program)
    report = fold_graph(FxGraph(editor), only, exclude, lower=lower_unfoldable)
    if report.folded or report.lowered:
        editor.commit()
    return report


def training_norms(ep: ExportedProgram, report: FoldReport | None = None) -> list[str]:
    """The module paths of the normalizations of ``ep`` that run in training mode, read from its nodes
    (``parse_norm``; ``report`` is not needed)."""
    from ..report import Code
    from .ops import module_path, parse_norm

    names = []
    for node in ep.graph.nodes:
        norm = parse_norm(node) if node.op == "call_function" else None
        if norm is not None and norm.problem and norm.problem_code == Code.TRAINING_MODE:
            names.append(module_path(node))
    return names
