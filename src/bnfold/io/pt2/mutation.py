"""In-place and ``out=`` operators that write only values their own graph computed.

torchvision- and timm-style models export ``nn.ReLU(inplace=True)``, ``out += identity``,
``nn.SiLU(inplace=True)`` ... as ``aten.relu_``, ``aten.add_``, ``aten.silu_`` in the default IR.
Such a node is accepted when both hold:

* **the operator is allowed in its functional form.**  The overload's schema (parsed with
  torchgen, torch's own code generator) is an in-place or ``out=`` variant, and the functional
  overload with the same signature (or the one whose signature differs only in argument names:
  ``dropout_(Tensor(a!) self, ...)`` / ``dropout(Tensor input, ...)``) is on the allowlist (:mod:`.ops`).
  Overloads tagged ``inplace_view`` (``set_``, ``as_strided_``, ``resize_`` ...) are never accepted: they change
  which memory a tensor refers to, so no aliasing could be followed past them.
* **every argument the schema marks as written** (``Tensor(a!)``) **is an intermediate**: a value
  produced by a node of the same graph, followed back through views and aliases to its base with
  torch's schema alias annotations (``torch._C._SchemaInfo``; an overload tagged
  ``maybe_aliasing_or_mutating`` whose schema shows no mutation, such as ``dropout``, which returns
  its input in eval mode, counts as an alias of every tensor it takes).  A base that is a
  graph input (user input, parameter, buffer, constant, an input of a control-flow body), a value
  produced twice, or a value of a node whose aliasing is unknown (a non-ATen target) is not an
  intermediate, and the node is refused.

A node that writes an intermediate changes nothing outside the run: no file, no state of the
model, no input of the caller.  One limit is torch's: an overload whose kernel returns a view that
its schema does not annotate (``aten._unsafe_view``) is taken at its schema's word.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

from .ops import allowed_overload, split_target
from .walk import dicts, short

#: The torchgen schema kinds that write into an argument of the functional op's signature.
_WRITING_KINDS = ("inplace", "out")


# ----------------------------------------------------------------------------- operators


def _overload(target: Any):
    """The ``OpOverload`` a serialized ATen-style target names, or None."""
    parts = split_target(target)
    if parts is None or parts[0] == "higher_order":
        return None
    import torch

    namespace, name, overload = parts
    try:
        op = getattr(getattr(getattr(torch.ops, namespace), name), overload)
    except (AttributeError, RuntimeError):
        return None
    return op if isinstance(op, torch._ops.OpOverload) else None


@functools.cache
def functional_form(target: str) -> str | None:
    """``torch.ops.aten.relu.default`` for ``torch.ops.aten.relu_.default`` (or an ``out=`` overload):
    the allowed functional overload of an in-place / ``out=`` target, or None."""
    op = _overload(target)
    if op is None or any(t.name == "inplace_view" for t in op.tags):
        return None
    try:
        from torchgen.model import FunctionSchema

        schema = FunctionSchema.parse(str(op._schema).split("::", 1)[1])
        if schema.kind().name not in _WRITING_KINDS:
            return None
        signature = schema.signature()
    except Exception:  # noqa: BLE001 - no torchgen, or a schema it cannot parse: not accepted
        return None
    import torch

    base = str(signature.name.name)
    try:
        packet = getattr(getattr(torch.ops, op.namespace), base)
        overloads = packet.overloads()
    except (AttributeError, RuntimeError):
        return None
    functional = []
    for name in overloads:
        candidate = getattr(packet, name)
        try:
            parsed = FunctionSchema.parse(str(candidate._schema).split("::", 1)[1])
        except Exception:  # noqa: BLE001
            continue
        if parsed.kind().name == "functional":
            functional.append((name, parsed.signature()))
    # The same signature; else the one functional overload whose signature differs only in argument
    # names (``dropout_(Tensor(a!) self, ...)`` is the in-place form of ``dropout(Tensor input, ...)``).
    same = [n for n, sig in functional if sig == signature]
    if not same:
        same = [n for n, sig in functional if _unnamed(sig) == _unnamed(signature)]
    if len(same) == 1 and allowed_overload(op.namespace, base, same[0]):
        return f"torch.ops.{op.namespace}.{base}.{same[0]}"
    return None


def _unnamed(signature) -> tuple:
    """A torchgen signature without its argument names: the types and defaults of its positional and
    keyword-only arguments, in order, and the types of its returns."""
    args = signature.arguments
    return (
        tuple((str(a.type), a.default) for a in args.flat_positional),
        tuple((str(a.type), a.default) for a in args.flat_kwarg_only),
        tuple(str(r.type) for r in signature.returns),
    )


def _written_arguments(op) -> list[str]:
    """The names of the arguments the schema marks as written (``Tensor(a!)``)."""
    return [a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]


@functools.cache
def _aliasing(target: str) -> tuple[tuple[int, frozenset[str]], ...] | None:
    """Per return of ``target``: the names of the arguments it may alias (from torch's schema
    alias annotations), or None for a target whose aliasing is unknown."""
    op = _overload(target)
    if op is None:
        return None
    import torch

    schema = op._schema
    info = torch._C._SchemaInfo(schema)
    arg_type = torch._C._SchemaArgType
    # The tag says "may alias or mutate its inputs beyond its schema". Where torch's SchemaInfo
    # knows of a mutation (batch_norm's running stats in training mode), that is what the tag
    # means and SchemaInfo's aliasing stands; otherwise (dropout returns its input in eval mode)
    # the output may alias every tensor the op takes.
    tagged = any(t.name == "maybe_aliasing_or_mutating" for t in op.tags)
    mutates = any(info.is_mutable(torch._C._SchemaArgument(arg_type.input, i)) for i in range(len(schema.arguments)))
    every = tagged and not mutates
    out = []
    for j in range(len(schema.returns)):
        names = frozenset(
            a.name
            for i, a in enumerate(schema.arguments)
            if every
            or info.may_contain_alias(
                torch._C._SchemaArgument(arg_type.input, i), torch._C._SchemaArgument(arg_type.output, j)
            )
        )
        out.append((j, names))
    return tuple(out)


# ----------------------------------------------------------------------------- graphs


def tensor_names(arg: Any) -> Iterator[str]:
    """The tensor values a serialized argument refers to (``as_tensor``, ``as_tensors``, optional ones)."""
    stack = [arg]
    while stack:
        cur = stack.pop()
        if isinstance(cur, list):
            stack.extend(cur)
        elif isinstance(cur, dict):
            for key, value in cur.items():
                if key == "as_tensor" and isinstance(value, dict) and isinstance(value.get("name"), str):
                    yield value["name"]
                elif key == "as_tensors" and isinstance(value, list):
                    yield from (v["name"] for v in value if isinstance(v, dict) and isinstance(v.get("name"), str))
                elif isinstance(value, (dict, list)):
                    stack.append(value)


def _inputs_by_name(node: dict[str, Any]) -> dict[str, Any]:
    inputs = node.get("inputs")
    out: dict[str, Any] = {}
    for item in inputs if isinstance(inputs, list) else ():
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            out[item["name"]] = item.get("arg")
    return out


class Graph:
    """One serialized graph: which node produced each value, and which values are its inputs."""

    def __init__(self, graph: dict[str, Any], inputs: dict[str, str]):
        self.inputs = inputs  # value name -> what it is ("parameter conv.weight" ...)
        self._memo: dict[str, str | None] = {}
        self._open: set[str] = set()
        self.producers: dict[str, tuple[dict[str, Any], int] | None] = {}
        for node in graph.get("nodes") or ():
            if not isinstance(node, dict):
                continue
            for j, output in enumerate(node.get("outputs") or ()):
                for name in tensor_names(output):
                    # a value produced twice is nobody's for sure
                    self.producers[name] = None if name in self.producers else (node, j)

    def outside_value(self, name: str) -> str | None:
        """What the base of value ``name`` is when it is not an intermediate of this graph, else None.

        Memoized over the graph, so every value is resolved once however many in-place ops write
        through it: linear in the size of the graph, also for a crafted one (cycles included).
        """
        memo = self._memo
        stack = [name]
        while stack:
            cur = stack[-1]
            if cur in memo:
                stack.pop()
                continue
            parents = self._parents(cur)
            if isinstance(parents, str):
                memo[cur] = parents
                stack.pop()
                continue
            todo = [p for p in parents if p not in memo]
            if todo and cur not in self._open:
                self._open.add(cur)
                stack.extend(todo)
                continue
            self._open.discard(cur)
            if todo:  # a parent is still open: the value depends on itself
                memo[cur] = f"value {short(cur)}, which depends on itself"
            else:
                memo[cur] = next((memo[p] for p in parents if memo[p] is not None), None)
            stack.pop()
        return memo[name]

    def _parents(self, name: str) -> str | list[str]:
        """What value ``name`` is when that settles it (a graph input, an unknown value), else the
        values it may alias (none: it is a fresh intermediate)."""
        if name in self.inputs:
            return self.inputs[name]
        if name not in self.producers:
            return f"value {short(name)}, which no node of the graph produces"
        produced = self.producers[name]
        if produced is None:
            return f"value {short(name)}, which two nodes produce"
        node, j = produced
        target = node.get("target")
        aliasing = _aliasing(target) if isinstance(target, str) else None
        if aliasing is None or j >= len(aliasing):
            return f"the output of {short(target)}, whose aliasing bnfold cannot follow"
        args = _inputs_by_name(node)
        return [n for arg_name in sorted(aliasing[j][1]) for n in tensor_names(args.get(arg_name))]


def mutation_problem(node: dict[str, Any], graph: Graph | None) -> str | None:
    """None when ``node`` (whose target is not on the allowlist) is an in-place / ``out=`` op that
    writes intermediates only; else what it writes (for the error message), or "" when the
    target is not an in-place / ``out=`` form of an allowed operator at all."""
    target = node.get("target")
    if not isinstance(target, str) or graph is None or functional_form(target) is None:
        return ""
    op = _overload(target)
    args = _inputs_by_name(node)
    for arg_name in _written_arguments(op):
        if arg_name not in args:
            return f"its argument {arg_name}, which the node does not give"
        names = list(tensor_names(args[arg_name]))
        if not names:
            return f"its argument {arg_name}, which is not a tensor of the graph"
        for name in names:
            outside = graph.outside_value(name)
            if outside is not None:
                return outside
    return None


def graphs(doc: dict[str, Any]) -> dict[int, Graph]:
    """``id(node) -> Graph`` for every node of the program's graphs (the top graph and control-flow bodies)."""
    out: dict[int, Graph] = {}
    gm = doc.get("graph_module")
    top = gm.get("graph") if isinstance(gm, dict) else None
    described = _described_inputs(gm.get("signature") if isinstance(gm, dict) else None)
    for cur in dicts(doc):
        if isinstance(cur.get("nodes"), list) and isinstance(cur.get("inputs"), list):
            names = [n for item in cur["inputs"] for n in tensor_names(item)]
            if cur is top:
                inputs = {n: described.get(n, f"graph input {short(n)}") for n in names}
            else:
                inputs = {n: f"input {short(n)} of a control-flow body" for n in names}
            graph = Graph(cur, inputs)
            for node in cur["nodes"]:
                if isinstance(node, dict):
                    out.setdefault(id(node), graph)
    return out


_INPUT_KINDS = {
    "parameter": ("parameter", "parameter_name"),
    "buffer": ("buffer", "buffer_name"),
    "tensor_constant": ("constant", "tensor_constant_name"),
    "custom_obj": ("object", "custom_obj_name"),
}


def _described_inputs(signature: Any) -> dict[str, str]:
    """Top-graph input names described for messages: ``parameter conv.weight``, ``input x`` ..."""
    out: dict[str, str] = {}
    specs = signature.get("input_specs") if isinstance(signature, dict) else None
    for spec in specs if isinstance(specs, list) else ():
        if not isinstance(spec, dict) or len(spec) != 1:
            continue
        ((kind, body),) = spec.items()
        arg = body.get("arg") if isinstance(body, dict) else None
        if kind in _INPUT_KINDS and isinstance(arg, dict) and isinstance(arg.get("name"), str):
            what, key = _INPUT_KINDS[kind]
            out[arg["name"]] = f"{what} {short(body.get(key, arg['name']))}"
        else:
            for name in tensor_names(arg):
                out[name] = f"graph input {short(name)}"
    return out
