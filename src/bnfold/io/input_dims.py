"""The shapes a torch program's inputs may take, by the program's own constraints: its static dims, and its
dynamic dims (``torch.export.Dim``) within their ranges, each symbol one value across the inputs.  The audit's
batches from an ``.npz`` file or ``--input-shape`` (:mod:`bnfold.io.batches`) are checked here; the program is
a stranger's file, so what it allows is only a bound: the sizes it lets in are still planned from the ops and
counted against the budget (:mod:`bnfold.io.fx_cost`)."""

from __future__ import annotations

import math
from typing import Any


def user_placeholders(ep: Any) -> list:
    """The placeholder nodes of the program's user inputs, in order."""
    from torch.export.graph_signature import InputKind

    users = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    return [nodes[name] for name in users if name in nodes]


def dims_text(ep: Any, val: Any) -> list[str]:
    """The dims of the stated input ``val``, each as text: ``1``, a dynamic dim as its expression and range
    (``32*s25 in 32..4096``)."""
    import torch

    parts = []
    for d in val.shape:
        if isinstance(d, torch.SymInt) and not d.node.expr.is_number:
            lo, hi = _range(ep, d.node.expr)
            parts.append(f"{d.node.expr} in {lo}..{hi if hi < math.inf else 'inf'}")
        else:
            parts.append(str(int(d)))
    return parts


def _range(ep: Any, expr: Any) -> tuple[int, float]:
    """The program's range for ``expr`` (a symbol or a dim's expression): ``(lowest, highest)``, 0..inf if none."""
    vr = ep.range_constraints.get(expr)
    if vr is None:
        return 0, math.inf
    lo, hi = float(vr.lower), float(vr.upper)
    return (int(lo) if math.isfinite(lo) else 0), (int(hi) if math.isfinite(hi) else math.inf)


def shape_error(ep: Any, shapes: dict[str, tuple[int, ...]]) -> tuple[str, str] | None:
    """``(input, why)`` for the first of ``shapes`` (user input name -> dims) that the program does not allow, else
    None.  A static dim must be equal; a dynamic dim's expression of one symbol is solved for it (an integer, the same
    across the inputs) and both the dim and its symbol must be within the program's ranges (a lowest bound up to 2 is
    not enforced: torch's own check lets 0 and 1 through, as export specializes them); a dim whose expression has
    several symbols cannot be checked here and is refused."""
    import sympy
    import torch
    from torch.utils._sympy.solve import try_solve

    bound: dict = {}
    for node in user_placeholders(ep):
        val, shape = node.meta.get("val"), shapes.get(node.name)
        if shape is None or not isinstance(val, torch.Tensor):
            continue
        if len(shape) != val.dim():
            return node.name, f"it has {len(shape)} dims, the program's input has {val.dim()}"
        for k, (d, r) in enumerate(zip(val.shape, shape)):
            expr = d.node.expr if isinstance(d, torch.SymInt) else sympy.Integer(int(d))
            if expr.is_number:
                if int(expr) != r:
                    return node.name, f"dim {k} is {r}, but the program fixes it to {int(expr)}"
                continue
            free = expr.free_symbols
            if len(free) != 1:
                return node.name, f"dim {k} is {expr}, a dim bnfold cannot check"
            (sym,) = free
            if sym not in bound:
                solved = r if expr == sym else _solve(try_solve, sympy.Eq(expr, r), sym)
                if solved is None:
                    return node.name, f"dim {k} is {r}, not of the program's form {expr} for a whole {sym}"
                bound[sym] = solved
            if expr.xreplace({sym: bound[sym]}) != r:
                return node.name, f"dim {k} is {r}, but {expr} is {expr.xreplace({sym: bound[sym]})} by an earlier dim"
            for what, value in ((expr, r), (sym, bound[sym])):
                lo, hi = _range(ep, what)
                if (lo > 2 and value < lo) or value > hi:
                    return node.name, f"dim {k} is {r}, but the program allows {what} only in {lo}..{hi}"
    return None


def _solve(try_solve: Any, eq: Any, sym: Any) -> int | None:
    """The whole number ``sym`` that solves ``eq``, else None."""
    solution = try_solve(eq, sym)
    value = solution[1] if solution is not None else None
    return int(value) if value is not None and value.is_integer else None
