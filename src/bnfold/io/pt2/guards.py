"""Guards (``guards_code``), which ``ExportedProgram.module()`` execs: shape comparisons only,
checked on their Python AST against an allowlist of names and attributes."""

from __future__ import annotations

import ast
import re
from typing import Any

from .exprs import MAX_EXPR, expr_is_bounded

_GUARD_NAMES = frozenset(
    {
        "L",
        "args",
        "inf",
        "int",
        "float",
        "bool",
        "abs",
        "min",
        "max",
        "round",
        "IsNonOverlappingAndDenseIndicator",
        "cast_symbool_to_symint_guardless",
    }
)
_GUARD_MODULE_ATTRS = {
    "math": frozenset(
        {
            "floor",
            "ceil",
            "trunc",
            "isnan",
            "isinf",
            "isfinite",
            "sqrt",
            "inf",
            "nan",
            "pi",
            "e",
            "log",
            "log2",
            "exp",
            "pow",
            "fabs",
            "copysign",
            "gcd",
            "cos",
            "sin",
            "tan",
            "cosh",
            "sinh",
            "tanh",
            "acos",
            "asin",
            "atan",
        }
    ),
    "torch": frozenset({"sym_max", "sym_min", "sym_sqrt", "sym_int", "sym_float", "sym_not", "sym_ite", "sym_sum"}),
}
_GUARD_VALUE_ATTRS = frozenset({"size", "stride", "storage_offset", "dim", "numel", "shape"})
_GUARD_STR = re.compile(r"[A-Za-z0-9_.]*\Z")
_GUARD_NODES = (
    ast.Expression,
    ast.BoolOp,
    ast.BinOp,
    ast.UnaryOp,
    ast.Compare,
    ast.Subscript,
    ast.Slice,
    ast.Tuple,
    ast.Load,
    ast.boolop,
    ast.operator,
    ast.unaryop,
    ast.cmpop,
    ast.IfExp,
)


def guard_is_safe(code: Any) -> bool:
    """True when a ``guards_code`` entry is a shape comparison ``ExportedProgram.module()`` may exec."""
    if not isinstance(code, str) or len(code) > MAX_EXPR or "\n" in code or "\r" in code or "\\" in code:
        return False
    try:
        tree = ast.parse(code, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    if not expr_is_bounded(tree):
        return False
    keys = {id(n.slice) for n in ast.walk(tree) if isinstance(n, ast.Subscript)}
    module_names: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if node.attr.startswith("_"):
                return False
            base = node.value
            if isinstance(base, ast.Name) and base.id in _GUARD_MODULE_ATTRS:
                if node.attr not in _GUARD_MODULE_ATTRS[base.id]:
                    return False
                module_names.add(id(base))
            elif node.attr not in _GUARD_VALUE_ATTRS:
                return False
        elif isinstance(node, ast.Name):
            if node.id in _GUARD_MODULE_ATTRS:
                if id(node) not in module_names:
                    return False
            elif node.id not in _GUARD_NAMES:
                return False
        elif isinstance(node, ast.Call):
            if node.keywords or not isinstance(node.func, (ast.Name, ast.Attribute)):
                return False
        elif isinstance(node, ast.BinOp):
            # no sequence arithmetic: ('x',) * 2**62 would allocate without bound
            for o in (node.left, node.right):
                if isinstance(o, ast.Tuple) or (isinstance(o, ast.Constant) and isinstance(o.value, str)):
                    return False
        elif isinstance(node, ast.Constant):
            if isinstance(node.value, str):
                if not _GUARD_STR.match(node.value) or id(node) not in keys:
                    return False
            elif not isinstance(node.value, (int, float, bool, type(None))):
                return False
        elif not isinstance(node, _GUARD_NODES):
            return False
    return True
