"""The shapes a torch program's inputs may take, by the program's own constraints: its static dims, and its
dynamic dims (``torch.export.Dim``) within their ranges, each symbol one value across the inputs.  The audit's
batches from an ``.npz`` file or ``--input-shape`` (:mod:`bnfold.io.batches`) are checked here; the program is
a stranger's file, so what it allows is only a bound: the sizes it lets in are still planned from the ops and
counted against the budget (:mod:`bnfold.io.fx_cost`)."""

from __future__ import annotations

import math
from typing import Any

from .input_guards import failed_guard


def user_placeholders(ep: Any) -> list:
    """The placeholder nodes of the program's user inputs, in order."""
    from torch.export.graph_signature import InputKind

    users = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    return [nodes[name] for name in users if name in nodes]


def dims_text(ep: Any, val: Any) -> list[str]:
    """The dims of the stated input ``val``, each as text: ``1``, a dynamic dim as its expression and range
    (``s25 in 1..128``), a derived one with its symbol's (``32*s25 in 32..4096 (s25 in 1..128)``)."""
    import torch

    parts = []
    for d in val.shape:
        if isinstance(d, torch.SymInt) and not d.node.expr.is_number:
            expr, lo, hi = d.node.expr, *_range(ep, d.node.expr)
            (sym,) = expr.free_symbols if len(expr.free_symbols) == 1 else (expr,)
            of = f" ({sym} in {'..'.join(map(_text, _range(ep, sym)))})" if sym != expr else ""
            parts.append(f"{expr} in {lo}..{_text(hi)}{of}")
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
    None.  A static dim must be equal; a dynamic dim's expression of one symbol is solved for it over the integers (the
    same value across the inputs: sympy's ``Eq(s + 10, 10)`` is False for torch's positive symbols, so a derived dim's
    symbol at 0 is solved for an unassumed one) and both the dim and its symbol must be within the program's
    ``range_constraints``, as ``ExportedProgram.module()`` checks them: a lowest bound up to 2 does not refuse 0 and 1
    (export's own specialization; a negative symbol is refused); then the program's guards on its inputs' sizes
    (:mod:`bnfold.io.input_guards`), where export refuses 0 or 1 that its ops were traced without.  A dim whose
    expression has several symbols cannot be checked here and is refused."""
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
                solved = r if expr == sym else _solve(try_solve, expr, r, sym)
                if solved is None:
                    return node.name, f"dim {k} is {r}, not of the program's form {expr} for a whole {sym}"
                bound[sym] = solved
            if expr.xreplace({sym: bound[sym]}) != r:
                return node.name, f"dim {k} is {r}, but {expr} is {expr.xreplace({sym: bound[sym]})} by an earlier dim"
            why = _outside(ep, expr, r, sym, bound[sym])
            if why is not None:
                return node.name, f"dim {k} is {r}{why}"
    failed = failed_guard(ep, shapes)
    if failed is not None:
        guard, read = failed
        name = next((n for n in shapes if f"[{n!r}]" in guard), next(iter(shapes)))
        if read:
            return name, f"its dims break the program's guard {guard[:200]}"
        return name, f"the program has a guard bnfold cannot check on these dims ({guard[:200]}); use its example shape"
    return None


def _outside(ep: Any, expr: Any, dim: int, sym: Any, value: int) -> str | None:
    """Why ``dim`` (of ``expr``) or ``value`` (its symbol's) is outside the program's range, naming it, else None."""
    lo, hi = _range(ep, expr)
    if (lo > 2 and dim < lo) or dim > hi:
        return f", but the program allows {expr} only in {lo}..{_text(hi)}"
    s_lo, s_hi = _range(ep, sym)
    if expr != sym and (value > s_hi or (value < s_lo and not 0 <= value < s_lo <= 2)):
        return f", so {sym} is {value}, but the program allows {sym} only in {s_lo}..{_text(s_hi)}"
    return None


def _text(hi: float) -> str:
    return str(int(hi)) if hi < math.inf else "inf"


def _solve(try_solve: Any, expr: Any, dim: int, sym: Any) -> int | None:
    """The whole number ``sym`` for which ``expr`` is ``dim``, else None; it may be 0 or negative (checked against its
    range afterwards), which torch's positive symbols would rule out before solving."""
    import sympy

    free = sympy.Symbol(f"{sym}_", integer=True)
    solution = try_solve(sympy.Eq(expr.xreplace({sym: free}), dim), free)
    value = solution[1] if solution is not None else None
    return int(value) if value is not None and value.is_integer else None
