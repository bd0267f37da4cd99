"""Verifying a folded edge program where the fold changed it, not over the whole program again.

An ExecuTorch edge program's verifier (``EXIREdgeDialectVerifier``) runs, on
top of torch's structural checks, a dtype check that interprets every node of
the graph with fake tensors: for a big program it costs more than the fold.
The input program passed that check when it was built, and the check reads
only a call's op, the dtypes of its tensor arguments and the dtype of its
result: a call with the same op, the same dtype in each argument place and
the same result dtype as before the fold gets the same verdict again.  So a
folded program is built with the same verifiers, except that the dtype check
runs only over the calls the fold added or changed, in a graph of their own
(ExecuTorch's own check, on that graph); every other check (ops valid in the
edge dialect, the signature, contiguous tensors) still runs over the whole
program.  The program that comes out carries the original verifiers, so
every later step verifies it in full.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Graph, Node
from torch.fx.node import map_arg

Snapshot = dict[Node, tuple]


def _dtype(node: Node) -> Any:
    val = node.meta.get("val")
    return getattr(val, "dtype", None)


def _signature(node: Node) -> tuple:
    """What ExecuTorch's dtype check reads of a call: its op, the dtype in each argument place, its result's dtype."""
    dtypes = map_arg((node.args, node.kwargs), _dtype)
    return node.target, dtypes[0], dict(dtypes[1]), _dtype(node)


def _edge_verifier(verifier: type) -> bool:
    return (
        getattr(verifier, "dialect", "") == "EDGE"
        and verifier.__module__.startswith("executorch.")
        and "check_additional" in vars(verifier)
    )


def snapshot(graph: Graph, verifiers) -> Snapshot | None:
    """What the dtype check of each call depends on, before the fold; None when no edge verifier runs."""
    if not any(_edge_verifier(v) for v in verifiers):
        return None
    return {n: _signature(n) for n in graph.nodes if n.op == "call_function"}


def changed_calls(graph: Graph, before: Snapshot) -> list[Node] | None:
    """The calls the fold added or changed, in graph order; None when one cannot be checked alone."""
    out = []
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        old = before.get(node)
        try:
            same = old is not None and old == _signature(node)
        except Exception:  # an argument without a boolean ==
            same = False
        if not same:
            out.append(node)
    return out


def _subgraph(nodes: list[Node]) -> torch.fx.GraphModule | None:
    """``nodes`` in a graph of their own, their other inputs as placeholders with the same ``val``."""
    sub, env = Graph(), {}
    for node in nodes:
        for inp in node.all_input_nodes:
            if inp in env:
                continue
            if inp.op == "get_attr" or "val" not in inp.meta:
                return None
            p = sub.placeholder(f"in_{len(env)}")
            p.meta["val"] = inp.meta["val"]
            env[inp] = p
        env[node] = sub.node_copy(node, lambda n: env[n])
    sub.output(tuple(env[n] for n in nodes))
    return torch.fx.GraphModule(torch.nn.Module(), sub)


def scoped_verifiers(verifiers: list, graph: Graph, before: Snapshot | None) -> list:
    """``verifiers`` with each ExecuTorch edge verifier's dtype check scoped to the changed calls
    (see the module docstring), or ``verifiers`` itself when that cannot be done."""
    if before is None:
        return verifiers
    try:
        from executorch.exir.verification.verifier import (
            _check_tensor_args_matching_op_allowed_dtype,
            _check_tensors_are_contiguous,
        )
        from torch._export.verifier import _VerifierMeta
    except ImportError:
        return verifiers
    nodes = changed_calls(graph, before)
    sub = _subgraph(nodes) if nodes else None
    if nodes and sub is None:
        return verifiers
    out = []
    for verifier in verifiers:
        if not _edge_verifier(verifier):
            out.append(verifier)
            continue

        def check_additional(self, gm, sub=sub) -> None:
            if not self.enable:
                return
            _check_tensors_are_contiguous(gm)
            if sub is not None:
                _check_tensor_args_matching_op_allowed_dtype(sub)

        registry = _VerifierMeta._registry
        previous = registry.get(verifier.dialect)
        try:  # a subclass registers itself under its dialect: keep the registry as it was
            out.append(
                type(verifier)(
                    verifier.__name__, (verifier,), {"dialect": verifier.dialect, "check_additional": check_additional}
                )
            )
        finally:
            if previous is not None:
                registry[verifier.dialect] = previous
    return out
