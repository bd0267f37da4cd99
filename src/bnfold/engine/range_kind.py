"""What an fp16 range rewrite is, for the report (``bnfold.engine.range``): read from the ops around its
region."""

from __future__ import annotations

import math
from typing import Any

from .range_planner import Plan, Planner


def kind_of(planner: Planner, p: Plan, hot: Any) -> str:
    """What the rewrite is, for the report: ``residual`` (a sum of several computed values scaled together),
    ``norm`` (a scale-invariant norm or a spelled-out one absorbs it), ``reduction``, ``linear_map`` (through a
    product of two computed values), ``constant``, else ``cross_layer``."""
    facts = set()
    for value in p.exps:
        for node in [planner.g.producer(value), *planner.g.users(value)]:
            op = planner.rop(node) if node is not None and planner.layer(node) is None else None
            if op is None:
                continue
            data = [v for _, v in op.operands if not planner.is_const(v)]
            writers = {_writer(planner, w) for w in map(planner.g.producer, data) if w is not None} - {None}
            facts.add((op.fact, len(data) > 1, len(writers) > 1))
    if ("sum", True, True) in facts:
        return "residual"
    if any(f[0] in ("invariant", "power") for f in facts):
        return "norm"
    if _reduces(planner, hot):
        return "reduction"
    if ("product", True, True) in facts or ("product", True, False) in facts:
        return "linear_map"
    if p.operands and not planner.layer_exps(p):
        return "constant"
    return "cross_layer"


def _reduces(planner: Planner, value: Any) -> bool:
    """Whether ``value`` is a reduction of a computed value (fewer elements than its input)."""
    op = planner.rop(planner.g.producer(value))
    if op is None or op.fact != "homogeneous" or planner.is_const(op.operands[0][1]):
        return False
    before, after = planner.g.shape_info(op.operands[0][1]).shape, planner.g.shape_info(value).shape
    return bool(before and after and _numel(after) < _numel(before))


def _numel(shape: tuple) -> int:
    return math.prod(d if isinstance(d, int) else 1 for d in shape)


def _writer(planner: Planner, node: Any) -> Any:
    """The layer or sum that writes what ``node`` passes on through reshapes and other homogeneous ops, or None."""
    for _ in range(16):
        op = planner.rop(node)
        if planner.layer(node) is not None or node in planner.inside or (op is not None and op.fact == "sum"):
            return node
        if op is None or op.fact != "homogeneous" or planner.is_const(op.operands[0][1]):
            return None
        node = planner.g.producer(op.operands[0][1])
        if node is None:
            return None
    return None
