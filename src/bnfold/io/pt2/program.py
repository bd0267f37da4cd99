"""A serialized program (``models/<m>.json``): everything in it that ``torch.export.load`` or
``.module()`` would evaluate, import, exec or run."""

from __future__ import annotations

import json
import re
from typing import Any

from ..limits import Limits, json_depth
from .exprs import MAX_EXPONENT, sym_expr_is_safe
from .guards import guard_is_safe
from .mutation import graphs, mutation_problem
from .ops import target_is_allowed
from .treespec import check_namedtuple_fields, is_plain_name, treespec_problem
from .walk import dicts, nodes, short, values_for_key


def node_target_is_safe(target: Any) -> bool:
    """True for a target on the operator allowlist (:mod:`bnfold.io.pt2.ops`)."""
    return target_is_allowed(target)


def check_program_json(doc: dict[str, Any], entry: str, limits: Limits | None = None) -> list[str]:
    """Problems in a serialized program that ``torch.export.load`` or ``.module()`` would eval."""
    problems: list[str] = []
    problems.extend(_treespec_problems(doc, entry, limits))
    problems.extend(_nested_json_problems(doc, entry, limits))
    for expr in values_for_key(doc, "expr_str"):
        if not sym_expr_is_safe(expr):
            problems.append(f"{entry} has a symbolic shape that is not a plain expression: {short(expr)}")
            break
    guards = doc.get("guards_code") or []
    if not isinstance(guards, list):
        problems.append(f"{entry} has a malformed guards_code field")
    else:
        for g in guards:
            if not guard_is_safe(g):
                problems.append(f"{entry} has a guard that is not a shape check: {short(g)}")
                break
    graph_of = None
    for node in nodes(doc):
        target = node.get("target")
        if not node_target_is_safe(target):
            if graph_of is None:
                graph_of = graphs(doc)
            written = mutation_problem(node, graph_of.get(id(node)))
            if written is None:
                continue  # an in-place / out= op that writes only values of its own graph
            if _training_export(node, target):
                problems.append(
                    f"{entry} updates num_batches_tracked in place ({short(target)}, not on bnfold's operator "
                    "allowlist): the model was exported in training mode; call model.eval() before torch.export "
                    "and export again"
                )
                break
            if written:
                problems.append(
                    f"{entry} has a graph node calling {short(target)} in place on {written}, not on a value "
                    "the graph computed; bnfold's operator allowlist admits in-place ops on intermediates only"
                )
                break
            problems.append(
                f"{entry} has a graph node calling {short(target)}, which is not on bnfold's operator allowlist"
            )
            break
        if target == "_operator.pow" and not _small_pow(node):
            problems.append(f"{entry} raises a number to a power over {MAX_EXPONENT}")
            break
    bad_name = _bad_name(doc)
    if bad_name is not None:
        problems.append(
            f"{entry} has a name that is not an identifier (or is a keyword), "
            f"which torch.fx would paste into code: {bad_name}"
        )
    bad_input = _bad_constant_input(doc)
    if bad_input is not None:
        problems.append(f"{entry} has a constant input that torch would paste into guard code: {bad_input}")
    return problems


def _training_export(node: dict[str, Any], target: Any) -> bool:
    """Whether a refused node is the in-place ``num_batches_tracked += 1`` of a program exported in
    training mode (the file is refused all the same; the message then says what to do)."""
    if not isinstance(target, str) or not target.endswith("add_.Tensor"):
        return False
    return "num_batches_tracked" in json.dumps(node.get("inputs"), default=str)


# Parameter / buffer / module paths: torch.fx pastes each part that is not an identifier into a string
# literal (``getattr(self.blocks, "block1-0")``), so a part holds only characters that cannot end or
# escape one: letters, digits, ``_`` and the ``-`` that ModuleDict keys carry (torchvision's RegNet).
_DOTTED = re.compile(r"(?:[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*)?\Z")
_VALUE_TABLES = ("tensor_values", "sym_int_values", "sym_bool_values", "sym_float_values", "custom_obj_values")
_PLAIN_CONSTANT = re.compile(r"[^'\"\\\n\r]*\Z")


def _treespec_problems(doc: dict[str, Any], entry: str, limits: Limits | None) -> list[str]:
    """Every ``in_spec`` / ``out_spec`` string must be a plain treespec (see :mod:`bnfold.io.pt2.treespec`)."""
    gm = doc.get("graph_module")
    fields = gm.get("treespec_namedtuple_fields") if isinstance(gm, dict) else None
    problem = check_namedtuple_fields(fields, entry)
    if problem:
        return [problem]
    for key in ("in_spec", "out_spec"):
        for spec in values_for_key(doc, key):
            problem = treespec_problem(spec, fields or {}, f"{entry} {key}", limits)
            if problem:
                return [f"{problem}; torch would import or paste it into code"]
    return []


_JSON_STRINGS = ("custom", "from_node")  # metadata strings torch.export.load parses with json.loads


def _nested_json_problems(doc: dict[str, Any], entry: str, limits: Limits | None) -> list[str]:
    """Metadata strings that torch parses as JSON must be JSON of bounded depth."""
    depth_limit = (limits or Limits()).json_depth
    for key in _JSON_STRINGS:
        for value in values_for_key(doc, key):
            if isinstance(value, str) and json_depth(value.encode("utf-8", "surrogatepass")) > depth_limit:
                return [f"{entry} has {key} metadata nested over {depth_limit} levels deep"]
    return []


def _small_pow(node: dict[str, Any]) -> bool:
    """``_operator.pow(a, b)`` with literal arguments: the exponent is small."""
    inputs = node.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 2:
        return False
    arg = inputs[1].get("arg") if isinstance(inputs[1], dict) else None
    if not isinstance(arg, dict):
        return False
    for kind in ("as_int", "as_float"):
        if kind in arg:
            v = arg[kind]
            return isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) <= MAX_EXPONENT
    return True  # a symbolic exponent: bounded by the shapes it comes from


def _bad_name(doc: dict[str, Any]) -> str | None:
    """torch.fx generates Python source from node, argument and attribute names; each must be a plain name.

    ``name`` fields (nodes, values, keyword arguments) must be identifiers,
    ``*_name`` / ``fqn`` fields (parameter, buffer, module paths) dotted names,
    and ``forward_arg_names`` identifiers.
    """
    for cur in dicts(doc):
        for key, value in cur.items():
            if key == "name" and isinstance(value, str):
                if value and not is_plain_name(value):
                    return short(value)
            elif (key.endswith("_name") or key == "fqn") and isinstance(value, str):
                if not _DOTTED.match(value):
                    return short(value)
            elif key == "forward_arg_names" and isinstance(value, list):
                for v in value:
                    if not is_plain_name(v):
                        return short(v)
            elif key in _VALUE_TABLES and isinstance(value, dict):
                for k in value:
                    if not is_plain_name(k):
                        return short(k)
    return None


def _bad_constant_input(doc: dict[str, Any]) -> str | None:
    """Constant user inputs become guards like ``L['mode'] == '<value>'`` that ``.module()`` execs."""
    graph = doc.get("graph_module", {}).get("graph", {}) if isinstance(doc.get("graph_module"), dict) else {}
    for inp in graph.get("inputs", []) if isinstance(graph, dict) else []:
        if not isinstance(inp, dict):
            continue
        for kind, value in inp.items():
            if kind == "as_string" and not (isinstance(value, str) and _PLAIN_CONSTANT.match(value)):
                return short(value)
            if kind == "as_int" and (type(value) is not int):
                return short(value)
            if kind == "as_bool" and type(value) is not bool:
                return short(value)
    return None
