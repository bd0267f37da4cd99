"""Symbolic-shape expressions (``expr_str``), which ``sympy.sympify`` evaluates: plain arithmetic
over shape symbols and known sympy / torch functions, with small integers and exponents."""

from __future__ import annotations

import ast
import re
from typing import Any

# Names sympify may meet in an exported program's shape expressions (torch 2.13
# writes them with sympy's srepr: ``Add(Symbol('s0', positive=True, integer=True), Integer(1))``).
_SYMPY_FUNCTIONS = frozenset(
    """
    Symbol Dummy Integer Rational Float Add Mul Pow Abs floor ceiling sqrt exp log sign
    Equality Unequality StrictLessThan LessThan StrictGreaterThan GreaterThan Eq Ne Lt Le Gt Ge
    And Or Not Xor Piecewise ExprCondPair ITE Tuple
    FloorDiv ModularIndexing Where PythonMod Mod CleanDiv CeilToInt FloorToInt CeilDiv
    LShift RShift Max Min PowByNatural FloatPow FloatTrueDiv IntTrueDiv IsNonOverlappingAndDenseIndicator
    TruncToFloat TruncToInt RoundToInt RoundDecimal ToFloat Identity
    OpaqueUnaryFn_sqrt OpaqueUnaryFn_cos OpaqueUnaryFn_cosh OpaqueUnaryFn_sin OpaqueUnaryFn_sinh
    OpaqueUnaryFn_tan OpaqueUnaryFn_tanh OpaqueUnaryFn_asin OpaqueUnaryFn_acos OpaqueUnaryFn_atan
    OpaqueUnaryFn_exp OpaqueUnaryFn_log OpaqueUnaryFn_asinh OpaqueUnaryFn_log2
    BitwiseFn_bitwise_and BitwiseFn_bitwise_or BitwiseFn_bitwise_xor
    """.split()  # noqa: SIM905
)
_SYMPY_CONSTANTS = frozenset("true false True False oo zoo nan int_oo pi E".split())  # noqa: SIM905
_SYMBOL_NAME = re.compile(r"[a-z]{1,6}[0-9]+\Z")
_PLAIN_STR = re.compile(r"(?:[A-Za-z_][A-Za-z0-9_]*|[-+]?[0-9]{0,40}\.?[0-9]{1,40}(?:[eE][-+]?[0-9]{1,3})?)\Z")
MAX_EXPR = 20_000
_EXPR_NODES = (
    ast.Expression,
    ast.BinOp,
    ast.UnaryOp,
    ast.BoolOp,
    ast.Compare,
    ast.Tuple,
    ast.Load,
    ast.operator,
    ast.unaryop,
    ast.cmpop,
    ast.boolop,
)


MAX_INT = 1 << 64  # the largest integer literal an expression may hold
MAX_EXPONENT = 64  # the largest exponent of a power
MAX_POW_NESTING = 2  # powers of powers of powers are refused (10**10**10)
_POW_FUNCTIONS = frozenset({"Pow", "PowByNatural", "FloatPow"})
_NUMBER_WRAPPERS = frozenset({"Integer", "Rational", "Float"})


def _small_exponent(node: ast.AST) -> bool:
    """A literal integer exponent of at most MAX_EXPONENT, bare or as ``Integer(n)`` / ``Rational(p, q)``."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _NUMBER_WRAPPERS:
        return bool(node.args) and all(_small_exponent(a) for a in node.args) and not node.keywords
    if isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, str):
            try:
                v = float(v)
            except ValueError:
                return False
        return isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) <= MAX_EXPONENT
    return False


def expr_is_bounded(tree: ast.AST) -> bool:
    """Integers of at most 64 bits, powers with small literal exponents, nested at most twice."""
    depth: dict[int, int] = {}
    for node in ast.walk(tree):  # parents come before children
        level = depth.get(id(node), 0)
        exponent = None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            exponent = node.right
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _POW_FUNCTIONS:
            if len(node.args) != 2:
                return False
            exponent = node.args[1]
        if exponent is not None:
            level += 1
            if level > MAX_POW_NESTING or not _small_exponent(exponent):
                return False
        elif isinstance(node, ast.Constant) and type(node.value) is int and abs(node.value) > MAX_INT:
            return False
        for child in ast.iter_child_nodes(node):
            depth[id(child)] = level
    return True


def sym_expr_is_safe(expr: Any) -> bool:
    """True when ``expr`` only builds a sympy expression: known functions, symbols, numbers.

    ``sympy.sympify`` evaluates the string as Python, so anything else (attribute
    access, builtins such as ``__import__`` or ``eval``, subscripts, lambdas,
    strings with quotes or backslashes) is refused.
    """
    if not isinstance(expr, str) or len(expr) > MAX_EXPR or "\\" in expr:
        return False
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    if not expr_is_bounded(tree):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if not (isinstance(node.func, ast.Name) and node.func.id in _SYMPY_FUNCTIONS):
                return False
            for kw in node.keywords:
                if kw.arg is None or not re.match(r"[a-z_]+\Z", kw.arg):
                    return False
        elif isinstance(node, ast.keyword):
            if not isinstance(node.value, ast.Constant):
                return False
        elif isinstance(node, ast.Name):
            ok = node.id in _SYMPY_FUNCTIONS or node.id in _SYMPY_CONSTANTS or _SYMBOL_NAME.match(node.id)
            if not ok:
                return False
        elif isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, str):
                if not _PLAIN_STR.match(v):
                    return False
            elif not isinstance(v, (int, float, bool, type(None))):
                return False
        elif not isinstance(node, _EXPR_NODES):
            return False
    return True
