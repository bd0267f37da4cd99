"""Pytree specs (``in_spec`` / ``out_spec``) of an exported program, checked as data.

The module call graph of a serialized program holds treespecs as JSON *strings*.
``torch.utils._pytree.treespec_loads`` turns them into Python: a context may
carry an ``__enum__`` (module + class: imported), a ``defaultdict`` names the
module of its ``default_factory`` (imported), and the dict keys end up in the
Python source that ``ExportedProgram.module()`` generates.  This module reads
the same strings with :func:`bnfold.io.limits.loads_json` and accepts only what
``torch.export.save`` writes for ordinary models:

* containers in :data:`CONTAINERS` (tuple, list, dict, OrderedDict, namedtuple);
* tuple / list contexts ``null``; dict / OrderedDict contexts a list of keys,
  each an int or an identifier that is not a Python keyword (so nothing in it
  can end a string literal or a name in generated code);
* a namedtuple context: the name of a namedtuple type listed in the program's
  ``treespec_namedtuple_fields`` whose fields are identifiers (torch looks the
  type up in its registry, it imports nothing);
* leaves ``{"type": null, "context": null, "children_spec": []}``.
"""

from __future__ import annotations

import keyword
import re
from typing import Any

from ...errors import ModelFileError
from ..limits import Limits, loads_json
from .walk import short

CONTAINERS = frozenset(
    {"builtins.tuple", "builtins.list", "builtins.dict", "collections.OrderedDict", "collections.namedtuple"}
)
_KEYED = frozenset({"builtins.dict", "collections.OrderedDict"})
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
MAX_NODES = 100_000


def is_plain_name(value: Any) -> bool:
    """An identifier that is not a Python keyword: safe to paste into generated source as a name."""
    return isinstance(value, str) and _IDENT.match(value) is not None and not keyword.iskeyword(value)


def treespec_problem(spec: Any, namedtuples: dict[str, Any], where: str, limits: Limits | None = None) -> str | None:
    """Why the serialized treespec ``spec`` is refused, or None when it is plain data."""
    if not isinstance(spec, str):
        return f"{where} is not a serialized treespec"
    try:
        doc = loads_json(spec.encode("utf-8", "surrogatepass"), where, limits)
    except ModelFileError as e:
        return str(e)
    if not (isinstance(doc, list) and len(doc) == 2 and doc[0] == 1):
        return f"{where} is not a protocol-1 treespec"
    stack = [doc[1]]
    seen = 0
    while stack:
        node = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            return f"{where} has more than {MAX_NODES} nodes"
        problem = _node_problem(node, namedtuples, limits)
        if problem:
            return f"{where}: {problem}"
        stack.extend(node["children_spec"])
    return None


def _node_problem(node: Any, namedtuples: dict[str, Any], limits: Limits | None) -> str | None:
    if not isinstance(node, dict) or set(node) != {"type", "context", "children_spec"}:
        return "a node that is not {type, context, children_spec}"
    typ, context, children = node["type"], node["context"], node["children_spec"]
    if not isinstance(children, list):
        return "children_spec is not a list"
    if typ is None:
        return None if context is None and not children else "a leaf with a context or children"
    if typ not in CONTAINERS:
        return f"container type {short(typ)} is not one of {', '.join(sorted(CONTAINERS))}"
    if not isinstance(context, str):
        return f"the context of a {typ} is not a string"
    if typ == "collections.namedtuple":
        return _namedtuple_problem(context, namedtuples)
    try:
        value = loads_json(context.encode("utf-8", "surrogatepass"), "context", limits)
    except ModelFileError:
        return f"the context of a {typ} is not JSON"
    if typ in _KEYED:
        if not isinstance(value, list) or len(value) != len(children):
            return f"the keys of a {typ} are not a list with one key per child"
        for key in value:
            if not (is_plain_name(key) or (type(key) is int)):
                return f"dict key {short(key)} is not a plain name (an identifier, not a keyword) or an int"
        return None
    return None if value is None else f"a {typ} with context {short(value)}"


def _namedtuple_problem(context: str, namedtuples: dict[str, Any]) -> str | None:
    if not _DOTTED.match(context) or context not in namedtuples:
        return f"namedtuple type {short(context)} is not declared in treespec_namedtuple_fields"
    fields = namedtuples[context]
    names = fields.get("field_names") if isinstance(fields, dict) else None
    if not isinstance(names, list) or not all(is_plain_name(n) for n in names):
        return f"namedtuple {short(context)} has fields that are not plain names"
    return None


def check_namedtuple_fields(fields: Any, where: str) -> str | None:
    """``treespec_namedtuple_fields``: dotted type names mapping to ``{"field_names": [plain names]}``."""
    if fields is None:
        return None
    if not isinstance(fields, dict):
        return f"{where} has a malformed treespec_namedtuple_fields"
    for name, value in fields.items():
        problem = _namedtuple_problem(name, fields)
        if problem:
            return f"{where}: {problem}"
        if not isinstance(value, dict):
            return f"{where}: namedtuple {short(name)} is malformed"
    return None
