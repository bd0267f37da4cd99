"""The operators an untrusted ``.pt2`` graph may call: an allowlist, derived from torch's own schemas.

``bnfold audit`` executes the graph, so every node target of a file that is not
trusted must be an operator that computes values and does nothing else.  The
allowlist is *derived*, not typed in, so it cannot drift from torch:

* ``torch.ops.<ns>.<op>.<overload>`` for ``ns`` in :data:`OP_NAMESPACES` when
  the overload is tagged ``core`` / ``pointwise`` / ``view_copy``, is a view
  (it returns an alias of an input), is a composite
  (``CompositeImplicitAutograd`` / ``CompositeExplicitAutograd``: defined once
  for every backend, in terms of other operators or of tensor math, never a
  backend's I/O kernel such as ``from_file``), or has a decomposition in torch's
  table (``torch._decomp``: a reference written in other operators, such as
  ``hardswish``), and its schema

  - mutates nothing (``schema.is_mutable`` is false, no argument is written),
  - returns at least one value (an op that returns nothing is there for its
    side effect: prints, file and random-state writes), with one exception:
    the ATen assertions (:data:`ASSERTION`: ``_assert_*``,
    ``sym_constrain_range*``), whose only effect is to raise an error, and
    which export emits for every ``.to(dtype)`` and for shape constraints,
  - takes no file path (no argument named in :data:`PATH_ARGUMENTS`, except one typed as a list
    of integers, which holds no path: ``einsum``'s contraction ``path``).

  Namespaces other than ``aten`` (``prims``, ``quantized_decomposed``,
  ``dim_order_ops``) hold only value-computing ops, so their overloads need the
  schema checks but no tag.
* ExecuTorch edge dialect targets (``executorch.exir.dialects.edge._ops.aten.<op>.<overload>``)
  when the ATen overload they wrap is allowed.
* ``torch.ops.higher_order.<name>`` for the control-flow operators in
  :data:`HIGHER_ORDER`, whose bodies are graphs of the same file (checked the
  same way).
* ``_operator.<name>`` / ``math.<name>`` / ``torch.sym_<name>`` for the pure
  functions on Python numbers that export emits for symbolic shapes
  (:data:`PYTHON_FUNCTIONS`).

Anything else is refused: ``aten.from_file`` (writes a file with
``shared=True``), in-place and ``out=`` overloads (unless :mod:`.mutation` shows that the node
writes only values its graph computed), ``_operator.setitem``,
predispatch / functorch wrappers, autocast and grad-mode switches, custom
namespaces and extension targets (``#...``).
"""

from __future__ import annotations

import functools
import re
from typing import Any

OP_NAMESPACES = ("aten", "prims", "quantized_decomposed", "dim_order_ops")
TAGGED_NAMESPACES = ("aten",)
# modules (of torch / executorch, never of the file) that register a namespace's operators
_REGISTRARS = {
    "quantized_decomposed": "torch.ao.quantization.fx._decomposed",
    "dim_order_ops": "executorch.exir.passes.dim_order_ops_registry",
}  # namespaces whose overloads also need a tag or a composite kernel
ALLOWED_TAGS = ("core", "pointwise", "view_copy")
PATH_ARGUMENTS = frozenset({"filename", "file", "path", "f", "fd", "file_name", "filepath"})
#: the schema types of an argument that cannot hold a path whatever its name (``einsum(..., int[]? path)``)
INT_LISTS = frozenset({"List[int]", "Optional[List[int]]"})
HIGHER_ORDER = frozenset({"cond", "while_loop", "map_impl", "scan"})
PYTHON_FUNCTIONS = {
    "_operator": frozenset(
        "getitem add sub mul truediv floordiv mod pow neg pos abs eq ne lt le gt ge and_ or_ xor not_ invert".split()
    ),
    "math": frozenset("ceil floor trunc sqrt".split()),
    "torch": frozenset("sym_max sym_min sym_int sym_float sym_not sym_ite sym_sqrt sym_sum".split()),
}
ASSERTION = re.compile(r"(?:_assert_[a-z_]+|sym_constrain_range(?:_for_size)?)\Z")
_EDGE_PREFIX = "executorch.exir.dialects.edge._ops."
_COMPOSITE_KEYS = ("CompositeImplicitAutograd", "CompositeExplicitAutograd")
_TARGET = re.compile(r"torch\.ops\.([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)(?:\.([A-Za-z_][A-Za-z0-9_]*))?\Z")


def is_assertion(op: Any) -> bool:
    """An ATen assertion: returns nothing, only raises (``_assert_scalar``, ``_assert_tensor_metadata`` ...)."""
    return op.namespace == "aten" and ASSERTION.match(op._schema.name.split("::", 1)[1]) is not None


def op_is_side_effect_free(op: Any) -> bool:
    """The schema test every allowed ``OpOverload`` passes (see the module docstring)."""
    schema = op._schema
    if schema.is_mutable or not (schema.returns or is_assertion(op)):
        return False
    for arg in schema.arguments:
        if arg.name in PATH_ARGUMENTS and str(arg.type) not in INT_LISTS:
            return False
        if arg.alias_info is not None and arg.alias_info.is_write:
            return False
    return True


def _tagged(op: Any) -> bool:
    import torch

    tags = {t.name for t in op.tags}
    if tags.intersection(ALLOWED_TAGS):
        return True
    if any(r.alias_info is not None for r in op._schema.returns):
        return True  # a view: op_is_side_effect_free() still refuses one that writes
    try:
        if any(op.has_kernel_for_dispatch_key(getattr(torch._C.DispatchKey, k)) for k in _COMPOSITE_KEYS):
            return True
    except RuntimeError:
        return False
    return op in _decompositions()


@functools.cache
def _decompositions() -> frozenset:
    """The overloads torch can decompose (``torch._decomp.decomposition_table``): each has a Python
    reference written in other operators (``hardswish``, ``pixel_shuffle`` ...)."""
    try:
        from torch._decomp import decomposition_table
    except Exception:  # noqa: BLE001  # pragma: no cover - torch moved it: fewer overloads are allowed
        return frozenset()
    return frozenset(decomposition_table)


@functools.cache
def allowed_overload(namespace: str, name: str, overload: str) -> bool:
    """True when ``torch.ops.<namespace>.<name>.<overload>`` is on the allowlist."""
    if namespace not in OP_NAMESPACES or name.startswith("__") or overload.startswith("__"):
        return False
    import importlib

    import torch

    if namespace in _REGISTRARS:
        try:
            importlib.import_module(_REGISTRARS[namespace])
        except Exception:  # noqa: BLE001 - not installed: the namespace's ops stay unknown, hence refused
            pass
    try:
        packet = getattr(getattr(torch.ops, namespace), name)
        op = getattr(packet, overload)
    except (AttributeError, RuntimeError):
        return False
    if not isinstance(op, torch._ops.OpOverload):
        return False
    if namespace in TAGGED_NAMESPACES and not (_tagged(op) or is_assertion(op)):
        return False
    return op_is_side_effect_free(op)


def split_target(target: Any) -> tuple[str, str, str | None] | None:
    """``(namespace, name, overload)`` of a serialized operator target (``torch.ops.aten.add_.Tensor``,
    an edge-dialect one, ``torch.ops.higher_order.cond``), or None for anything else."""
    if not isinstance(target, str):
        return None
    if target.startswith(_EDGE_PREFIX):
        target = "torch.ops." + target[len(_EDGE_PREFIX) :]
    m = _TARGET.match(target)
    if not m:
        return None
    namespace, name, overload = m.groups()
    return namespace, name, overload if overload or namespace == "higher_order" else "default"


def target_is_allowed(target: Any) -> bool:
    """True when a serialized node target (``torch.ops.aten.conv2d.default`` ...) is on the allowlist."""
    if not isinstance(target, str):
        return False
    parts = split_target(target)
    if parts is not None:
        namespace, name, overload = parts
        if namespace == "higher_order":
            return overload is None and name in HIGHER_ORDER
        return allowed_overload(namespace, name, overload)
    module, _, func = target.rpartition(".")
    return func in PYTHON_FUNCTIONS.get(module, ())


def allowed_overloads() -> list[Any]:
    """Every ``OpOverload`` on the allowlist (for tests and ``SECURITY.md``)."""
    import torch

    out = []
    for namespace in OP_NAMESPACES:
        try:
            ns = getattr(torch.ops, namespace)
        except (AttributeError, RuntimeError):
            continue
        for name in dir(ns):
            try:
                packet = getattr(ns, name)
                overloads = packet.overloads()
            except (AttributeError, RuntimeError, TypeError):
                continue
            for ov in overloads:
                if allowed_overload(namespace, name, ov):
                    out.append(getattr(packet, ov))
    return out
