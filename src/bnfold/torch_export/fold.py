"""The torch.export fold driver: apply the rules to a fixed point, then report."""

from __future__ import annotations

from torch.export import ExportedProgram
from torch.fx import Node

from ..report import FoldReport, FoldResult, Skipped
from .ops import parse_norm, parse_producer
from .program import ProgramEditor
from .rules import Outcome, fold_after, fold_before, norm_label

#: A chain folds at least one node per round, so this bound is never reached in practice.
_MAX_ROUNDS = 64


def fold_program(ep: ExportedProgram, only=None) -> FoldResult:
    """Fold every foldable normalization in ``ep``; ``ep`` itself is not modified."""
    if not isinstance(ep, ExportedProgram):
        raise TypeError(f"expected a torch.export.ExportedProgram, got {type(ep).__name__}")
    editor = ProgramEditor(ep)
    report = FoldReport()
    reasons: dict[str, str] = {}
    for _ in range(_MAX_ROUNDS):
        changed = False
        for rule in (fold_after, fold_before):
            for node in list(editor.graph.nodes):
                if getattr(node, "_erased", False) or node.op != "call_function":
                    continue
                producer = parse_producer(node)
                if producer is None:
                    continue
                outcome: Outcome = rule(editor, producer, only)
                for name, reason in outcome.reasons.items():
                    reasons.setdefault(name, reason)
                if outcome.folded:
                    report.folded.extend(outcome.folded)
                    changed = True
        if not changed:
            break
    for node in editor.graph.nodes:
        norm = parse_norm(node)
        if norm is None:
            continue
        label = norm_label(editor, node, norm)
        reason = norm.problem or reasons.get(node.name) or _no_neighbour(editor, node, norm.input)
        report.skipped.append(Skipped(label, reason, _producer_name(norm.input), node.name))
    return FoldResult(editor.build(), report)


def _producer_name(node) -> str:
    return node.name if isinstance(node, Node) and parse_producer(node) is not None else ""


def _no_neighbour(editor: ProgramEditor, node: Node, source) -> str:
    return (f"no conv, transposed conv or linear next to it: its input comes from {editor.describe(source)} "
            "and its output does not feed one directly")
