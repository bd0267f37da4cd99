"""The fp16 range rewrite's edits (``bnfold.engine.range``): a plan applied through the adapter's primitive edits,
its factors by ``bnfold.fold_math.scale_pow2``.  All or nothing: every new tensor, constant, eps and multiply is
made (or shown exact) before the first edit, so a plan that cannot be applied exactly is Refused with the graph
as it was."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import torch

from .. import fold_math
from ..fold_math import FoldError
from ..report import Code
from .range_planner import Plan, Planner, Refused


def apply(planner: Planner, p: Plan, k: int, label: str) -> list[str]:
    """Make the edits of plan ``p`` with ``s = 2 ** -k``; returns the names of the nodes edited, in graph order.
    Raises Refused, nothing written, when a rewritten layer tensor, constant operand, eps or multiply would not be
    exact in its dtype."""
    g = planner.g

    def exponent(e: Fraction) -> int:  # the power of two a value of exponent ``e`` is scaled by
        return -int(e * k)

    def refused(node: Any, why: str, code: Code = Code.LIMIT_BOUND) -> Refused:
        return Refused(f"{g.describe_node(node) if node is not None else 'the graph output'}: {why}", code)

    def scaled(node: Any, w_e: Fraction, b_e: Fraction, weight: bool = True, exact: bool = False) -> tuple:
        """The layer and its weight (None where ``weight`` is False; a product made as it is written where ``exact``,
        the span showed the scale exact, and the adapter takes one) and bias scaled; Refused where one fails.  Where
        ``weight`` is False, a weight the adapter can tell by its shape is not read."""
        layer, w = planner.layer(node)[0], planner.weights(node, weight)
        try:
            what = f"{layer.op} weight"
            out = (_product(w, exponent(w_e)) if exact else None) if weight else None
            if weight and out is None:
                out = fold_math.scale_pow2(w.weight, exponent(w_e), w.weight_dtype, what)
            bias = None if w.bias is None else fold_math.scale_pow2(w.bias, exponent(b_e), w.bias_dtype, "bias")
        except FoldError as err:
            raise refused(node, str(err)) from None
        return layer, out, bias

    # every layer is checked before anything is written, in order: scaled, except a large weight whose spans show
    # that its scale is exact (its bias is still scaled); a large one's result is not kept but made (again) when it
    # is written (the same arithmetic; where its scale is exact and the adapter writes a deferred product, a block
    # at a time as it is written), so the edit holds one large weight at a time
    writes = []
    for node, (w_e, b_e) in planner.layer_exps(p).items():
        held = planner.layer(node)[1] is not None
        exact = not held and planner.scales_exactly(node, exponent(w_e))
        done = scaled(node, w_e, b_e, not exact)
        writes.append((node, (w_e, b_e), done if held else None, exact))
        del done
    operands = []  # (node, slot, the new constant): made here, written below
    for (node, slot), e in p.operands.items():
        if e != 0:
            operands.append((node, slot, _operand(planner, node, slot, exponent(e), refused)))
    eps = []  # invariant norms reading a scaled value: eps * s ** 2e
    for value, e in p.exps.items():
        for user in g.users(value):
            op = planner.rop(user) if user is not None else None
            if op is not None and op.fact == "invariant" and planner.op_exp(p, user, op.operands[0][0], value):
                x = exponent(2 * e)
                scaled_eps = fold_math.pow2_scalar(op.eps, x, torch.float32)  # a normal float32, or None
                if scaled_eps is None:
                    raise refused(user, f"its eps {op.eps:g} times 2^{x} is no normal float32")
                eps.append((user, scaled_eps))
    muls = []  # (value, factor, readers): a multiply after a value, or before a reader, in the value's dtype
    for value, e in p.mul_after.items():  # the readers that undo the scale keep reading the value as it was
        kept = {node for (v, node) in p.mul_before if v == value}
        readers = [u for u in g.users(value) if u not in kept]
        muls.append((value, _mul(g, value, exponent(e), readers[0] if readers else None, refused), readers))
    for (value, node), e in p.mul_before.items():
        if value not in p.mul_after:
            muls.append((value, _mul(g, value, -exponent(e), node, refused), [node]))

    edited = {}  # node -> its name
    for node, exps, done, exact in writes:
        layer, weight, bias = done if done is not None else scaled(node, *exps, exact=exact)
        g.write_layer(layer, weight, bias, label)
        planner.keep_span(node, exponent(exps[0]))
        edited[node] = g.node_name(node)
        del weight, bias, done
    for node, slot, new in operands:
        was = planner._operand(node, slot)  # the planner's op as it read it: the constant before the write
        g.scale_operand(node, slot, new)
        planner.keep_operand_span(node, slot, was, exponent(p.operands[(node, slot)]))
        edited[node] = g.node_name(node)
    for node, value in eps:
        g.set_eps(node, value)
        edited[node] = g.node_name(node)
    touched, added = [], []  # the writer and every reader of each value a multiply goes at (an adapter may rewire
    for value, factor, readers in muls:  # readers it was not given: ONNX renames a graph output's producer's value)
        touched += [g.producer(value), *(u for u in g.users(value) if u is not None)]
        added += planner.place(g.producer(g.insert_mul(value, factor, readers)))  # placed where it was put
    nodes = [node for node, *_ in writes] + [node for node, _, _ in operands]
    planner.forget(nodes + [node for node, _ in eps], [n for n in dict.fromkeys(touched) if n is not None], added)
    return list(dict.fromkeys(edited[node] for node in planner.in_order(edited)))


def _product(w: Any, exponent: int) -> fold_math.Product | None:
    """``w.weight * 2 ** exponent`` (the caller showed it exact: each element is then
    ``fold_math.scale_pow2``'s) as a product the adapter makes as it writes it, where it takes one
    (``LayerWeights.deferred``) and ``2 ** exponent`` is a normal number of the weight's dtype; else None."""
    if not w.deferred or w.weight.dtype != w.weight_dtype:
        return None
    return fold_math.pow2_product(w.weight, exponent)


def _operand(planner: Planner, node: Any, slot: Any, exponent: int, refused) -> Any:
    """The constant operand at ``slot`` of ``node`` times ``2 ** exponent`` as the adapter writes it; Refused where
    the result leaves its dtype.  A NaN or infinity in it never gets here: ``Planner.choose_k`` refused the plan from
    the constant's span (and ``scale_pow2`` would refuse it too: NaN is not exact, inf leaves the range)."""
    try:
        return planner.g.scaled_operand(node, slot, exponent)
    except FoldError as err:
        raise refused(node, str(err)) from None


def _mul(g, value: Any, exponent: int, reader: Any, refused) -> float:
    """A multiply's factor ``2 ** exponent``, a normal number in ``value``'s dtype (float32 where unknown); else
    Refused, named for ``reader`` (None: the graph output)."""
    dtype = g.shape_info(value).dtype
    dtype = dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32
    factor = fold_math.pow2_scalar(1.0, exponent, dtype)
    if factor is None:
        raise refused(reader, f"a multiply of {g.describe(value)} by 2^{exponent} before it is not exact in {dtype}")
    return factor
