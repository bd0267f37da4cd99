"""Model-local functions (``model.functions``): inlined where a normalization inside one could fold.

The fold reads graphs, not function bodies.  A call to a model-local function
whose body holds a normalization (directly, or through another local function
it calls) is inlined first, so the normalization becomes an ordinary node of
the graph; the report says so in a note.  A normalization left in a function
body (the function is never called, or inlining failed) is reported as skipped.
"""

from __future__ import annotations

import onnx
import onnx.inliner

from ..report import Code, Skipped
from .nodes import label, subgraphs
from .ops import NORMS


def _calls(nodes) -> set[tuple[str, str]]:
    """The (domain, name) of every node in ``nodes`` and their subgraphs (a possible function call)."""
    out, stack = set(), list(nodes)
    while stack:
        node = stack.pop()
        out.add((node.domain, node.op_type))
        for _, sub in subgraphs(node):
            stack.extend(sub.node)
    return out


def _norms_in(nodes) -> list[onnx.NodeProto]:
    found, stack = [], list(nodes)
    while stack:
        node = stack.pop()
        if node.domain in ("", "ai.onnx") and node.op_type in NORMS:
            found.append(node)
        for _, sub in subgraphs(node):
            stack.extend(sub.node)
    return found


def with_norms(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """The (domain, name) of the local functions that hold a normalization, directly or through a call."""
    functions = {(f.domain, f.name): f for f in model.functions}
    selected = {key for key, f in functions.items() if _norms_in(f.node)}
    changed = True
    while changed:
        changed = False
        for key, f in functions.items():
            if key not in selected and _calls(f.node) & selected:
                selected.add(key)
                changed = True
    return sorted(selected)


def inline_norm_functions(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """``model`` with every call to a local function that holds a normalization inlined (``model`` itself
    when there is none), and a note per inlined function."""
    selected = with_norms(model)
    called = _calls(model.graph.node) & set(selected)
    if not called:
        return model, []
    try:
        inlined = onnx.inliner.inline_selected_functions(model, selected)
    except Exception:  # noqa: BLE001 - a function the inliner cannot handle stays a function (reported)
        return model, []
    callers = _callers(model.graph.node)
    notes = []
    for key in sorted(called):
        names = ", ".join(f"'{n}'" for n in callers.get(key, []))
        notes.append(
            f"inlined the model-local function {_name(key)} to fold inside it"
            + (f" (called by {names}; its nodes are renamed by the inliner)" if names else "")
        )
    return inlined, notes


def _callers(nodes) -> dict[tuple[str, str], list[str]]:
    """The names of the nodes of the main graph (not its subgraphs) that call each (domain, name)."""
    out: dict[tuple[str, str], list[str]] = {}
    for node in nodes:
        out.setdefault((node.domain, node.op_type), []).append(label(node))
    return out


def skipped_in_functions(model: onnx.ModelProto) -> list[Skipped]:
    """A skipped entry for every normalization still inside a local function body."""
    out = []
    for f in model.functions:
        for node in _norms_in(f.node):
            out.append(
                Skipped(
                    label(node),
                    f"inside the model-local function {_name((f.domain, f.name))} (not folded)",
                    "",
                    label(node),
                    Code.IN_FUNCTION,
                )
            )
    return out


def _name(key: tuple[str, str]) -> str:
    return f"{key[0]}::{key[1]}" if key[0] else key[1]
