"""A torch program's guards (``guards_code``: ``(-10) + L['x'].size()[3] != 1``) on the sizes of its inputs, as
``ExportedProgram.module()`` checks them before a run: export writes one where its ops were traced for a size
its ranges would let in (a derived dim's symbol at 0 or 1).  The guard is a stranger's text: it is never
executed, but read as a Python expression and evaluated here over whole numbers, with only comparisons, ``and``
/``or``/``not``, ``+ - * // %``, ``min``/``max``/``abs`` and an input's ``.size()[k]``.  A guard of anything else
(or longer than :data:`MAX_GUARD_CHARS`) cannot be checked here, and the sizes it speaks of are refused: running
the program at sizes its ops may not have been traced for could give a silently wrong audit."""

from __future__ import annotations

import ast
import operator
from typing import Any

_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
_DIV = {ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_CMP = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_CALLS = {"min": min, "max": max, "abs": abs}
#: a guard longer than this is not parsed (torch writes guards of a few dozen characters)
MAX_GUARD_CHARS = 4096


class _Unknown(Exception):
    """A guard this evaluator does not read."""


def failed_guard(ep: Any, shapes: dict[str, tuple[int, ...]]) -> tuple[str, bool] | None:
    """The first of the program's guards that ``shapes`` (input name -> dims) break or that cannot be read here
    (one naming an input not in ``shapes``, or beyond what this reads), as ``(its text, read)``, else None."""
    for code in getattr(ep, "_guards_code", None) or ():
        if not isinstance(code, str) or len(code) > MAX_GUARD_CHARS:
            return str(code)[:200], False
        try:
            ok = _value(ast.parse(code, mode="eval").body, shapes)
        except (_Unknown, SyntaxError, ValueError, TypeError, RecursionError, ZeroDivisionError, IndexError, KeyError):
            return code, False
        if not ok:
            return code, True
    return None


def _value(node: ast.AST, shapes: dict) -> Any:
    if isinstance(node, ast.Constant) and type(node.value) in (int, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in {**_BIN, **_DIV}:
        left, right = _value(node.left, shapes), _value(node.right, shapes)
        return {**_BIN, **_DIV}[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
        v = _value(node.operand, shapes)
        return -v if isinstance(node.op, ast.USub) else not v
    if isinstance(node, ast.Compare):
        values = [_value(n, shapes) for n in (node.left, *node.comparators)]
        ops = [_CMP.get(type(op)) for op in node.ops]
        if None in ops:
            raise _Unknown
        return all(op(a, b) for op, a, b in zip(ops, values, values[1:]))
    if isinstance(node, ast.BoolOp):
        values = [bool(_value(n, shapes)) for n in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CALLS and node.args:
        if node.keywords:
            raise _Unknown
        return _CALLS[node.func.id](*(_value(a, shapes) for a in node.args))
    if isinstance(node, ast.Subscript):
        return _size(node, shapes)
    raise _Unknown


def _size(node: ast.Subscript, shapes: dict) -> int:
    """``L['x'].size()[k]`` (or ``.shape[k]``): dim ``k`` of input ``x``."""
    k, base = node.slice, node.value
    if isinstance(base, ast.Call) and not base.args and isinstance(base.func, ast.Attribute):
        base = base.func if base.func.attr == "size" else None
    elif not (isinstance(base, ast.Attribute) and base.attr == "shape"):
        base = None
    inp = base.value if base is not None else None
    if not (
        isinstance(k, ast.Constant)
        and type(k.value) is int
        and isinstance(inp, ast.Subscript)
        and isinstance(inp.value, ast.Name)
        and inp.value.id == "L"
        and isinstance(inp.slice, ast.Constant)
        and inp.slice.value in shapes
    ):
        raise _Unknown
    return int(shapes[inp.slice.value][k.value])
