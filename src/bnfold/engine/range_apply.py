"""The fp16 range rewrite's edits (``bnfold.engine.range``): a plan applied through the adapter's primitive edits,
its factors by ``bnfold.fold_math.scale_pow2``."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from .. import fold_math
from ..fold_math import FoldError
from ..report import Code
from .range_planner import Plan, Planner, Refused


def apply(planner: Planner, p: Plan, k: int, label: str) -> list[str]:
    """Make the edits of plan ``p`` with ``s = 2 ** -k``; returns the names of the nodes edited, in graph order.
    Raises Refused (nothing written yet) when a rewritten layer tensor would leave its dtype's range."""
    g = planner.g

    def factor(e: Fraction) -> float:
        return 2.0 ** -int(e * k)

    eps = []  # invariant norms reading a scaled value: eps * s ** 2e
    for value, e in p.exps.items():
        for user in g.users(value):
            op = planner.rop(user) if user is not None else None
            if op is not None and op.fact == "invariant" and planner.op_exp(p, user, op.operands[0][0], value):
                eps.append((user, op.eps * factor(2 * e)))

    def scaled(node: Any, w_e: Fraction, b_e: Fraction, weight: bool = True) -> tuple:
        """The layer and its weight (None where ``weight`` is False) and bias scaled; Refused where one fails."""
        layer, w = planner.layer(node)[0], planner.weights(node)
        try:
            what = f"{layer.op} weight"
            out = fold_math.scale_pow2(w.weight, -int(w_e * k), w.weight_dtype, what) if weight else None
            bias = None if w.bias is None else fold_math.scale_pow2(w.bias, -int(b_e * k), w.bias_dtype, "bias")
        except FoldError as err:
            raise Refused(f"{g.describe_node(node)}: {err}", Code.LIMIT_BOUND) from None
        return layer, out, bias

    # every layer is checked before any is written, in order: scaled, except a large weight whose spans show that its
    # scale is exact (its bias is still scaled); a large one's result is not kept but made (again) when it is written
    # (the same arithmetic), so the edit holds one large weight at a time
    writes = []
    for node, (w_e, b_e) in planner.layer_exps(p).items():
        held = planner.layer(node)[1] is not None
        done = scaled(node, w_e, b_e, held or not planner.scales_exactly(node, -int(w_e * k)))
        writes.append((node, (w_e, b_e), done if held else None))
        del done
    edited = {}  # node -> its name
    for node, exps, done in writes:
        layer, weight, bias = done if done is not None else scaled(node, *exps)
        g.write_layer(layer, weight, bias, label)
        edited[node] = g.node_name(node)
        del weight, bias, done
    for (node, slot), e in p.operands.items():
        if e != 0:
            g.scale_operand(node, slot, factor(e))
            edited[node] = g.node_name(node)
    for node, value in eps:
        g.set_eps(node, value)
        edited[node] = g.node_name(node)
    touched = []  # the writer and readers of each value a multiply goes at
    for value, e in p.mul_after.items():  # the readers that undo the scale keep reading the value as it was
        kept = {node for (v, node) in p.mul_before if v == value}
        readers = [u for u in g.users(value) if u not in kept]
        touched += [g.producer(value), *readers]
        g.insert_mul(value, factor(e), readers)
    for (value, node), e in p.mul_before.items():
        if value not in p.mul_after:
            touched += [g.producer(value), node]
            g.insert_mul(value, 1.0 / factor(e), [node])
    nodes = [node for node, _, _ in writes] + [node for (node, _), e in p.operands.items() if e != 0]
    planner.forget(nodes + [node for node, _ in eps], [n for n in dict.fromkeys(touched) if n is not None])
    return list(dict.fromkeys(edited[node] for node in planner.in_order(edited)))
