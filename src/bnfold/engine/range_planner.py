"""The fp16 range rewrite's plan (``bnfold.engine.range``): which values of a region are scaled, by which
power of ``s``, and who compensates.

A *plan* gives each value of a region an exponent ``e`` (the value becomes ``value * s ** e``) read from the op
tables' ``range`` facts (``bnfold.engine.optable.Op``): a layer takes any scale of its output into its weight and
bias and any scale of its input into its weight; a ``homogeneous`` op passes its first operand's scale to its
output; ``sum`` needs every operand at one scale; ``product`` / ``quotient`` add / subtract them (a constant
operand absorbs the difference); ``power`` multiplies it by the degree; an ``invariant`` norm drops it (its eps
times ``s ** 2e``).  A value whose producer takes no scale gets a multiply after it, and a reader with no rule
gets one before it (both only where the unscaled value is inside the limit): the report counts them.

The plan is made backward from the value too large (who writes it) and forward in graph order (who reads the
scaled values), then every node touching the region is checked against its rule; ``k`` is the smallest that
brings every scaled value under the limit without pushing another one (or a rewritten constant) past it.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from .. import fold_math
from ..fold_math import BLOCK_ELEMENTS, LARGE_BYTES, index_blocks
from ..report import Code
from .graph import GraphAdapter, Layer, LayerWeights

#: a plan scales at most this many values (a region is never worth an unbounded walk) and takes at most 8 times as
#: many steps (:meth:`Planner.step`)
MAX_REGION = 1 << 14
#: the largest exponent of ``s`` (and denominator of one) a plan gives: past it, its factors leave every float format
MAX_EXPONENT = 1 << 10
#: the steps all plans on a graph take together, per node of the graph (:meth:`Planner.step`)
WORK_PER_NODE = 64


@dataclass
class Limits:
    """What the rewrite aims for: ``value`` bounds every value's magnitude (fp16's 65504 over the margin),
    ``constant`` every constant's, ``tiny`` the smallest nonzero constant magnitude that survives (onnxconverter-
    common's 1e-7 clamp; 0: none)."""

    value: float
    constant: float
    tiny: float = 0.0


class Refused(Exception):
    def __init__(self, reason: str, code: Code):
        super().__init__(reason)
        self.reason, self.code = reason, code


@dataclass
class Plan:
    """A region: exponents of values, of constant operands (``(node, slot)``), multiplies to insert after a
    value (its producer takes no scale) or before a reader (``(value, node)``: the reader takes none).
    ``log``: what the walk back (:meth:`Planner.need`) wrote, to undo a trial that fails (:meth:`undo`)."""

    exps: dict = field(default_factory=dict)
    operands: dict = field(default_factory=dict)
    mul_after: dict = field(default_factory=dict)
    mul_before: dict = field(default_factory=dict)
    forward: set = field(default_factory=set)  # values whose exponent their producer's rule gave
    log: list = field(default_factory=list, repr=False, compare=False)

    def put(self, table: dict, key: Any, value: Any) -> None:
        """``table[key] = value``, undone by :meth:`undo`."""
        self.log.append((table, key, table.get(key, _ABSENT)))
        table[key] = value

    def mark(self) -> int:
        return len(self.log)

    def undo(self, mark: int) -> None:
        """Undo every :meth:`put` since ``mark``, the last first."""
        while len(self.log) > mark:
            table, key, old = self.log.pop()
            if old is _ABSENT:
                del table[key]
            else:
                table[key] = old


_ABSENT = object()
#: the graph-order keys of a node the order does not hold and of the graph output: after every node, in that order
_UNLISTED, _OUTPUT = (math.inf,), (math.inf, 1)


def _unrolled(walk, p: Plan) -> Any:
    """Run the generator ``walk`` to its answer: each generator it yields is run first, on this loop's stack
    (a list, not Python's: no depth is too deep), and its answer sent back; ``p``'s journal is dropped after the
    outermost walk (nothing outside it undoes)."""
    outer = not p.log
    stack, answer = [walk], None
    while stack:
        try:
            stack.append(stack[-1].send(answer))
            answer = None
        except StopIteration as done:
            stack.pop()
            answer = done.value
    if outer:
        p.log.clear()
    return answer


class Planner:
    """Plans rewrites on ``graph`` from ``peaks`` (the largest magnitude of each value by handle, float32);
    ``known``: spans (:func:`span`) of constants the caller measured, by what names their stored bytes
    (``GraphAdapter.stored_key``: a constant written since has another key), so that they are not read for them."""

    def __init__(self, graph: GraphAdapter, peaks: dict, limits: Limits, known: dict | None = None):
        self.g, self.peaks, self.limits, self.known = graph, peaks, limits, known or {}
        self.relisted = 0  # how often the graph order was numbered or the layers listed (``HotConstants``)
        self.read_graph()
        self.nodes = len(self.order)
        self.budget, self.spent = 8 * MAX_REGION + WORK_PER_NODE * self.nodes, 0  # :meth:`step`
        self._steps, self._full = 0, False

    def read_graph(self) -> None:
        """Read the graph: its order and layers, every cache dropped."""
        self._number()
        self._pushed = itertools.count()  # ties in the queue go in the order pushed (never by object id)
        self._ops: dict = {}
        self._spans: dict = {}  # a layer node -> the spans of its weight and bias (:meth:`spans`)
        self._kept: dict = {}  # a layer node -> its written weight's span, kept through forget (:meth:`keep_span`)
        self._is_const: dict = {}  # a value -> whether it is a constant (:meth:`is_const`)
        self._const_spans: dict = {}  # a constant value -> its span (:meth:`const_span`)
        self._layer_exps: tuple = (None, {})  # the last plan's :meth:`layer_exps`
        self._read_layers()
        self.edited: set = set()  # nodes edited since the constants were last read (``HotConstants``)
        self.added: list = []  # nodes added since the constants were last read (``HotConstants``)

    def _read_layers(self) -> None:
        """The layers whose weights are constants (each read once: :meth:`layer` keeps what it read)."""
        self.written: dict = {}  # a layer's output value -> its node
        self.layer_nodes: set = set()  # the nodes of ``written``
        self.inside: set = set()  # nodes that are part of a layer (its bias add): no op of their own
        self._ends: dict = {}  # a layer node -> its output and the node that writes it (:meth:`_layer_of`)
        self.relisted += 1
        for layer in self.g.layers():
            if self.layer(layer.node) is None:
                continue
            self.written[layer.output] = layer.node
            self.layer_nodes.add(layer.node)
            end = self.g.producer(layer.output)
            if end is not None and end != layer.node:
                self.inside.add(end)
            self._ends[layer.node] = (layer.output, end)

    def in_order(self, nodes) -> list:
        """``nodes`` (each once) in graph order; nodes the graph order does not hold last, as given."""
        return sorted(dict.fromkeys(nodes), key=lambda n: self.order.get(n, _UNLISTED))

    def _number(self) -> None:
        """Number the graph order: ``order`` maps each node to a key (a tuple) that sorts as the graph does."""
        self.order = {n: (i,) for i, n in enumerate(self.g.ordered_nodes())}
        self._placed = itertools.count(1)
        self.relisted += 1

    def place(self, node: Any) -> list:
        """Give ``node``, just made by ``insert_mul``, its key in the graph order from the node the adapter says it
        follows (``GraphAdapter.mul_placed``), without a walk over the graph: right after a key ``K`` is ``K + (-c,)``,
        ``c`` counting up, so it sorts after ``K`` and before whatever followed ``K`` (a node placed there before it
        included).  Returns the nodes the graph order now holds that it did not (pass them to :meth:`forget`); a
        node said to follow one the order does not hold has the whole order numbered again."""
        listed, prev = self.g.mul_placed(node)
        if not listed or node in self.order:
            return []
        if prev is not None and prev not in self.order:
            old = self.order
            self._number()
            return [n for n in self.order if n not in old]
        self.order[node] = (self.order[prev] if prev is not None else ()) + (-next(self._placed),)
        return [node]

    def forget(self, nodes: list, touched: list = (), added: list = ()) -> None:
        """``nodes`` were edited (their weights, a constant operand, an eps): what was read of them is read again.
        ``touched``: nodes that read or write a value a multiply was inserted at (their operands changed, not their
        constants): their ops are read again, and the layers listed again only where a touched node changed what it
        is (a layer, its output, the node that ends it).  ``added``: the nodes the multiplies added to the graph
        order (:meth:`place`, no walk over the graph)."""
        self._layer_exps = (None, {})
        for node in nodes:  # a written layer's weights (held or not) and spans are read again from the graph
            written = self._ops.get(node)
            if written is not None:  # a weight or bias written in place under its name: no span kept for it
                self._const_spans.pop(written[0].weight, None)
                self._const_spans.pop(written[0].bias, None)
            self._ops.pop(node, None)
            self._ops.pop(("op", node), None)
            self._spans.pop(node, None)
        self.edited.update(nodes)
        if not touched:
            return
        for node in touched:  # a layer's input or output is another value: parsed again (its spans are kept)
            self._ops.pop(node, None)
            self._ops.pop(("op", node), None)
        self.edited.update(touched)
        self.added += added
        if any(self._layer_of(n) != self._ends.get(n) for n in touched) or any(self.layer(n) for n in added):
            layers, inside = set(self.layer_nodes), set(self.inside)
            self._read_layers()
            for node in (layers ^ self.layer_nodes) | (inside ^ self.inside):
                self._ops.pop(("op", node), None)
                self.edited.add(node)

    def _layer_of(self, node: Any) -> tuple | None:
        """``node`` as a layer of ``written`` now: its output and the node that writes it, or None."""
        lw = self.layer(node)
        return None if lw is None else (lw[0].output, self.g.producer(lw[0].output))

    # ------------------------------------------------------------------ reading the graph

    def layer(self, node: Any) -> tuple[Layer, Any] | None:
        """``node`` as a layer whose weights are constants (and its weights, None where they are large: read
        them with :meth:`weights`), or None.  A large weight the adapter can tell by its shape (a streamed model's,
        left on disk) is not read here: whether the layer is one is answered from its shape and dtype."""
        if node is None:
            return None
        if node not in self._ops:
            layer = self.g.layer(node)
            w = self._read(layer, False) if layer is not None else None
            if w is not None and w.weight.is_meta and _nbytes(w) < LARGE_BYTES:
                w = self._read(layer)  # small: held, its values read once
            ok = layer is not None and w is not None
            # large weights are read again where needed (a streamed model's stay on disk: one held at a time)
            held = ok and not w.weight.is_meta and _nbytes(w) < LARGE_BYTES
            self._ops[node] = (layer, w if held else None) if ok else None
        return self._ops[node]

    def _read(self, layer: Layer, values: bool = True) -> LayerWeights | None:
        """The weights of ``layer`` as the plan reads them (a Gemm's ``beta * C`` as its bias), or None when they
        are not constants or the layer applies a scale of its own.  ``values=False``: the weight may be a ``meta``
        tensor (``GraphAdapter.weights``), the bias is read."""
        w = self.g.weights(layer, values)
        if isinstance(w, str):
            return None
        if w.pre is not None:  # Gemm: alpha 1 and beta * C, read as a bias
            if not bool((w.pre.scale == 1).all()):
                return None
            w = LayerWeights(w.weight, w.pre.shift, w.weight_dtype, w.bias_dtype)
        return w

    def weights(self, node: Any, values: bool = True) -> LayerWeights:
        """The weights of the layer ``node`` (:meth:`layer` is not None): those held, else read again (``values=
        False``: the weight may be a ``meta`` tensor, its shape and dtype only; the bias is read)."""
        layer, w = self.layer(node)
        if w is None:
            w = self._read(layer, values)
            assert w is not None  # the graph has not changed since :meth:`layer` read them (or ``forget``)
        return w

    def spans(self, node: Any) -> tuple[tuple[float, float], tuple[float, float] | None]:
        """The spans (:func:`span`) of the layer ``node``'s weight and bias (None: no bias), read once (again
        after :meth:`forget`, but for a weight written scaled by a power of two: its span is the old one's
        scaled, :meth:`keep_span`)."""
        if node not in self._spans:
            kept = self._kept.pop(node, None)
            known = self._known(self.layer(node)[0].weight) if kept is None else None
            w = self.weights(node, kept is None and known is None)
            if known is not None:
                kept = (known, w.weight.dtype, w.weight_dtype)
            bias = None if w.bias is None else (span(w.bias), w.bias.dtype, w.bias_dtype)
            self._spans[node] = (kept or (span(w.weight), w.weight.dtype, w.weight_dtype), bias)
        weight, bias = self._spans[node]
        return weight[0], None if bias is None else bias[0]

    def keep_span(self, node: Any, exponent: int) -> None:
        """The layer ``node``'s weight has just been written as ``fold_math.scale_pow2`` of it by ``2 ** exponent``
        (every element exact, or it is not written), its old span not yet forgotten: where it is held in the dtype it
        is written in and that span is finite, the written weight's span is that span times ``2 ** exponent``, bit
        for bit (each element was scaled exactly), kept through :meth:`forget` so the weight is not read for it."""
        was = self._spans[node][0] if node in self._spans else self._kept.pop(node, None)
        if was is not None:
            (low, high), dtype, stored = was
            if dtype == stored and all(math.isfinite(x) for x in (low, high)):
                self._kept[node] = ((math.ldexp(low, exponent), math.ldexp(high, exponent)), dtype, stored)

    def const_span(self, value: Any) -> tuple[float, float]:
        """The span (:func:`span`) of the constant ``value`` (:meth:`is_const`), read once: an edit never changes
        an operand's constant (a rewritten one is a new value, whose span :meth:`keep_operand_span` may know).  A
        layer's weight or bias is written in place under its name (``GraphAdapter.write_layer``) where that layer is
        its one reader left: an operand rewritten before took a new value; the span kept from then is dropped
        (:meth:`forget`)."""
        if isinstance(value, (int, float)):
            return span(self._const(value))
        if value not in self._const_spans:
            known = self._known(value)
            self._const_spans[value] = known if known is not None else span(self._const(value))
        return self._const_spans[value]

    def _known(self, value: Any) -> tuple[float, float] | None:
        """The span the caller measured of ``value``'s stored constant (``known``), or None."""
        if not self.known:
            return None
        return self.known.get(self.g.stored_key(value))

    def keep_operand_span(self, node: Any, slot: Any, was: Any, exponent: int) -> None:
        """``node``'s constant operand at ``slot``, ``was``, has just been written as ``fold_math.scale_pow2`` of it
        by ``2 ** exponent`` (``GraphAdapter.scaled_operand``: every element exact, or it is not written): where
        ``was``'s span was read and is finite, the new constant's span is that span times ``2 ** exponent``, bit for
        bit (its float64 values are ``was``'s times a power of two, each exact), so it is not read for it."""
        old = None if isinstance(was, (int, float)) else self._const_spans.get(was)
        if old is not None and all(math.isfinite(x) for x in old):
            op = self.g.range_op(node)
            new = next((v for s, v in op.operands if s == slot), None) if op is not None else None
            if new is not None and not isinstance(new, (int, float)):
                self._const_spans[new] = (math.ldexp(old[0], exponent), math.ldexp(old[1], exponent))

    def scales_exactly(self, node: Any, exponent: int) -> bool:
        """Whether ``fold_math.scale_pow2`` of the layer ``node``'s weight by ``2 ** exponent`` surely succeeds, read
        from its span: it is held in the dtype it is written in, and its largest and smallest nonzero magnitudes stay
        in that dtype's normal range (a power of two then keeps every bit)."""
        self.spans(node)
        return fold_math.pow2_exact(*self._spans[node][0], exponent)

    def rop(self, node: Any):
        key = ("op", node)
        if key not in self._ops:
            part = node is None or node in self.inside or self.layer(node) is not None
            self._ops[key] = None if part else self.g.range_op(node)
        return self._ops[key]

    def _unit(self, value: Any) -> bool:
        """Whether the constant ``value`` is 1 or -1 everywhere."""
        return bool((self._const(value).abs() == 1).all())

    def is_const(self, value: Any) -> bool:
        """Whether ``value`` is a number or a constant, asked once per value (an edit never makes a value another
        kind: a rewritten constant is a new value, a multiply goes after a computed one)."""
        if isinstance(value, (int, float)):
            return True
        if value not in self._is_const:
            self._is_const[value] = self.g.is_constant(value)
        return self._is_const[value]

    def hot(self, value: Any) -> bool:
        return self.peaks.get(value, 0.0) > self.limits.value

    def op_exp(self, p: Plan, node: Any, slot: Any, value: Any) -> Fraction:
        """The exponent ``node`` reads at ``slot``."""
        if (value, node) in p.mul_before:
            return Fraction(0)
        if self.is_const(value):
            return p.operands.get((node, slot), Fraction(0))
        return p.exps.get(value, Fraction(0))

    # ------------------------------------------------------------------ backward: who writes a scaled value

    def need(self, p: Plan, value: Any, e: Fraction, queue: list) -> bool:
        """``value`` must reach its readers as ``value * s ** e``.  The walk back through its writers runs on a
        stack of its own (:func:`_unrolled`), not Python's: a chain of any depth plans, in time linear in it."""
        return _unrolled(self._need(p, value, e, queue), p)

    def need_operand(self, p: Plan, node: Any, slot: Any, value: Any, e: Fraction, queue: list) -> bool:
        return _unrolled(self._need_operand(p, node, slot, value, e, queue), p)

    def _need(self, p: Plan, value: Any, e: Fraction, queue: list):
        """:meth:`need` as a generator: it yields the walks it waits for (:func:`_unrolled` runs them) and
        returns its answer.  A trial that fails is undone from ``p``'s journal (:meth:`Plan.undo`), not made
        on a copy (a copy per step made a chain quadratic).  ``_full``: whether the last value the walk entered
        stopped at the region's bound.  A failure passed up enters no other value, so at a refusal it tells that
        failure's cause; after a backtracked one (another operand took the scale, a multiply went after it) the next
        value entered clears it, and a later refusal is coded by what refused it."""
        self._full = False
        if e == 0:
            return p.exps.get(value, Fraction(0)) == 0
        if value in p.exps:
            return p.exps[value] == e
        if len(p.exps) > MAX_REGION:
            self._full = True
            return False
        self.step()
        p.put(p.exps, value, e)
        mark = p.mark()
        if not (yield self._produce(p, value, e, queue)):
            p.undo(mark)
            if self.hot(value):
                return False  # a multiply after it would read the value too large
            p.put(p.mul_after, value, e)
        self.push_readers(value, queue)
        return True

    def _need_operand(self, p: Plan, node: Any, slot: Any, value: Any, e: Fraction, queue: list):
        if self.is_const(value):
            p.put(p.operands, (node, slot), e)
            return True
        return (yield self._need(p, value, e, queue))

    def _produce(self, p: Plan, value: Any, e: Fraction, queue: list):
        """Make ``value``'s producer write it scaled by ``s ** e``, asking its inputs for scales (a generator, as
        :meth:`_need`)."""
        if value in self.written:
            return True  # its layer's weight and bias take it (``apply``)
        node = self.g.producer(value)
        op = self.rop(node)
        if op is None or op.output != value:
            return False
        if op.fact == "homogeneous":
            slot, v = op.operands[0]
            return (yield self._need_operand(p, node, slot, v, e, queue))
        if op.fact == "sum":
            for s, v in op.operands:
                if not (yield self._need_operand(p, node, s, v, e, queue)):
                    return False
            return True
        if op.fact == "power" and (degree := _degree(op)) is not None:
            slot, v = op.operands[0]
            return (yield self._need_operand(p, node, slot, v, e / degree, queue))
        if op.fact in ("product", "quotient") and len(op.operands) == 2:
            order = sorted(range(2), key=lambda i: not self.is_const(op.operands[i][1]))  # a constant first
            for i in order:
                slot, v = op.operands[i]
                mark = p.mark()
                sign = -1 if op.fact == "quotient" and i == 1 else 1
                if (yield self._need_operand(p, node, slot, v, sign * e, queue)):
                    return True
                p.undo(mark)
        return False

    # ------------------------------------------------------------------ forward: who reads a scaled value

    def push_readers(self, value: Any, queue: list) -> None:
        for user in self.g.users(value):
            if user is None:
                heapq.heappush(queue, (_OUTPUT, next(self._pushed), ("output", value)))
            else:
                heapq.heappush(queue, (self.order.get(user, _UNLISTED), next(self._pushed), ("node", user)))

    def read(self, p: Plan, node: Any, queue: list) -> bool:
        """``node`` reads scaled values: set its output's exponent by its rule, or stop the scale before it."""
        lw = self.layer(node)
        if lw is not None:
            reads = [v for v in self.g.inputs(node) if p.exps.get(v, 0) != 0 and v != lw[0].input]
            return not reads or self.stop_before(p, node, queue)  # its weight takes the scale of its input
        op = self.rop(node)
        floats = [] if op is None else [(s, v) for s, v in op.operands]
        exps = [self.op_exp(p, node, s, v) for s, v in floats]
        if op is None or op.fact == "":
            return self.stop_before(p, node, queue)
        if op.fact == "invariant":
            if op.eps is None or any(x != 0 for x in exps[1:]):
                return self.stop_before(p, node, queue)
            return True
        if op.fact == "homogeneous":
            if any(x != 0 for x in exps[1:]):
                return self.stop_before(p, node, queue)
            return self.set_out(p, op.output, exps[0], queue)
        if op.fact == "sum":
            scaled = {x for x in exps if x != 0}
            if len(scaled) > 1:
                return False
            e = scaled.pop() if scaled else Fraction(0)
            for (s, v), x in zip(floats, exps):
                if x != e and not self.need_operand(p, node, s, v, e, queue):
                    return False
            return self.set_out(p, op.output, e, queue)
        if op.fact == "power" and (degree := _degree(op)) is not None:
            return self.set_out(p, op.output, exps[0] * degree, queue)
        if op.fact in ("product", "quotient") and len(floats) == 2:
            out = exps[0] + exps[1] if op.fact == "product" else exps[0] - exps[1]
            want = p.exps.get(op.output, Fraction(0)) if op.output not in p.forward else Fraction(0)
            forced = op.output in p.exps and op.output not in p.forward
            if out != want:  # a constant operand takes the difference (a 1 only where the output's scale is asked:
                for i, (s, v) in enumerate(floats):  # ``1 / x`` is how a reciprocal is spelled, runtimes fuse it)
                    if self.is_const(v) and (forced or not self._unit(v)):
                        sign = 1 if op.fact == "product" or i == 0 else -1
                        p.operands[(node, s)] = exps[i] + sign * (want - out)
                        return True
            return self.set_out(p, op.output, out, queue)
        return self.stop_before(p, node, queue)

    def set_out(self, p: Plan, value: Any, e: Fraction, queue: list) -> bool:
        old = p.exps.get(value, Fraction(0))
        if old == e:
            return True
        if value in p.exps and value not in p.forward:
            return False  # a reader asked for another scale of it
        if e == 0:
            p.exps.pop(value, None)
        else:
            p.exps[value] = e
        p.forward.add(value)
        self.push_readers(value, queue)
        return True

    def stop_before(self, p: Plan, node: Any, queue: list) -> bool:
        """A multiply before ``node`` undoes the scale of each scaled operand (each must be inside the limit)."""
        op = self.rop(node)
        for s, v in op.operands if op is not None else self._inputs(node):
            x = self.op_exp(p, node, s, v)
            if x != 0:
                if self.hot(v) or self.is_const(v):
                    raise Refused(
                        f"{self.g.describe_node(node)} reads {self.g.describe(v)} too large and no exact rule moves "
                        "a scale through it",
                        Code.NONLINEAR_READER,
                    )
                p.mul_before[(v, node)] = x
        return True

    def _inputs(self, node: Any) -> list:
        return [(i, v) for i, v in enumerate(self.g.inputs(node))]

    def output_read(self, p: Plan, value: Any) -> None:
        x = p.exps.get(value, Fraction(0))
        if x != 0:
            if self.hot(value):
                raise Refused(f"the graph output {self.g.describe(value)} itself is too large", Code.NO_ABSORBER)
            p.mul_before[(value, None)] = x

    # ------------------------------------------------------------------ a plan for one value

    def plan(self, value: Any) -> Plan:
        p, queue = Plan(), []
        self._steps, self._full = 0, False
        if not self.need(p, value, Fraction(1), queue) or value in p.mul_after:
            if self._full:
                raise Refused(f"its region passes {MAX_REGION} values", Code.REGION_LIMIT)
            raise Refused(
                f"{self.g.describe(value)} is too large where it is made and nothing before it takes a scale "
                "(a graph input, or an overflow inside the op that computes it)",
                Code.NO_ABSORBER,
            )
        done: dict = {}
        while queue:
            self.step()
            _, _, (what, x) = heapq.heappop(queue)
            if what == "output":
                self.output_read(p, x)
                continue
            key = self.seen(p, x)
            if done.get(x) == key:
                continue
            done[x] = key
            if not self.read(p, x, queue):
                raise Refused(
                    f"{self.g.describe_node(x)} needs its operands at one scale and a writer cannot give it",
                    Code.SCALE_CONFLICT,
                )
        self.check(p)
        return p

    def step(self) -> None:
        """Count one step of a plan (a value the walk back scales, a node the walk forward reads): a plan takes
        at most ``8 * MAX_REGION``, all plans together at most :attr:`budget` (linear in the graph), else
        Refused: a hostile graph costs bounded time, however its regions fail."""
        self._steps += 1
        self.spent += 1
        if self._steps > 8 * MAX_REGION:
            raise Refused(f"its region grows past {8 * MAX_REGION} steps of the plan", Code.REGION_LIMIT)
        if self.spent > self.budget:
            raise Refused(
                f"the rewrite's work budget is spent ({self.budget} steps for {self.nodes} nodes): not tried",
                Code.REGION_LIMIT,
            )

    def seen(self, p: Plan, node: Any) -> tuple:
        """What ``node`` reads and writes under ``p``: it is read again only when that changed."""
        op = self.rop(node)
        if op is None:
            return tuple(p.exps.get(v, 0) for v in self.g.inputs(node))
        return (*(self.op_exp(p, node, s, v) for s, v in op.operands), p.exps.get(op.output, 0))

    def check(self, p: Plan) -> None:
        """Every node touching the region obeys its rule with the plan's exponents, or Refused."""
        nodes = [n for v in p.exps for n in [self.g.producer(v), *self.g.users(v)] if n is not None]
        for node in self.in_order(nodes):  # the first node in graph order that breaks its rule is named
            if self.layer(node) is not None:
                continue
            op = self.rop(node)
            if op is None or op.fact in ("", "invariant"):
                continue
            out = Fraction(0) if op.output in p.mul_after else p.exps.get(op.output, Fraction(0))
            if op.output in p.mul_after:
                out = Fraction(0)
            xs = [self.op_exp(p, node, s, v) for s, v in op.operands]
            if op.fact == "homogeneous":
                ok = out == xs[0] and all(x == 0 for x in xs[1:])
            elif op.fact == "sum":
                ok = all(x == out for x in xs)
            elif op.fact == "power":
                ok = (degree := _degree(op)) is not None and out == xs[0] * degree
            elif op.fact == "product":
                ok = len(xs) == 2 and out == xs[0] + xs[1]
            else:
                ok = len(xs) == 2 and out == xs[0] - xs[1]
            if not ok:
                raise Refused(f"{self.g.describe_node(node)} would compute another value", Code.SCALE_CONFLICT)

    # ------------------------------------------------------------------ k

    def choose_k(self, p: Plan) -> tuple[int, bool]:
        """The smallest ``k`` that brings every scaled value under the limit (and a multiple of what makes every
        factor a power of two), bounded by what keeps the others and the rewritten constants inside; and
        whether the limit is met."""
        fractions = list(p.exps.values()) + list(p.operands.values()) + list(p.mul_before.values())
        step = math.lcm(*(f.denominator for f in fractions)) if fractions else 1
        if step > MAX_EXPONENT or any(abs(f) > MAX_EXPONENT for f in fractions):  # a chain of powers
            raise Refused(f"its exponents of s pass {MAX_EXPONENT} (a chain of powers)", Code.REGION_LIMIT)
        lo, hi = 0.0, math.inf
        for value, e in p.exps.items():
            peak = self.peaks.get(value, 0.0)
            if peak <= 0 or value in p.mul_after:
                continue
            if not math.isfinite(peak):
                raise Refused(
                    f"{self.g.describe(value)} is not finite in float32 on the calibration batches", Code.NOT_FINITE
                )
            if e > 0 and peak > self.limits.value:
                lo = max(lo, math.log2(peak / self.limits.value) / float(e))
            elif e < 0:
                hi = min(hi, math.log2(self.limits.value / peak) / float(-e))
        for low, high, e in self.constant_ranges(p):
            if not math.isfinite(high):
                raise Refused("a constant it rescales holds NaN or inf", Code.NOT_FINITE)
            if e > 0 and high > self.limits.constant:  # a constant beyond the limit: it moves down with the region
                lo = max(lo, math.log2(high / self.limits.constant) / float(e))
            if e > 0 and low > 0 and self.limits.tiny:
                hi = min(hi, math.log2(low / self.limits.tiny) / float(e))
            elif e < 0 and high > 0:
                hi = min(hi, math.log2(self.limits.constant / high) / float(-e))
        k = math.ceil(lo / step - 1e-12) * step
        met = k <= hi
        if not met:
            k = math.floor(hi / step) * step if hi != math.inf else 0
        return int(k), met

    def constant_ranges(self, p: Plan) -> list[tuple[float, float, Fraction]]:
        """``(smallest nonzero, largest magnitude, exponent)`` of each constant the plan rewrites."""
        out = []
        for (node, slot), e in p.operands.items():
            if e == 0:
                continue
            out.append((*self.const_span(self._operand(node, slot)), e))
        for node, (w_e, b_e) in self.layer_exps(p).items():
            weight, bias = self.spans(node)
            out.append((*weight, w_e))
            if bias is not None:
                out.append((*bias, b_e))
        return out

    def _operand(self, node: Any, slot: Any) -> Any:
        op = self.rop(node)
        return next(v for s, v in op.operands if s == slot)

    def _const(self, value: Any):
        import torch

        return torch.tensor(float(value)) if isinstance(value, (int, float)) else self.g.constant(value)

    def layer_exps(self, p: Plan) -> dict:
        """``{layer node: (weight exponent, bias exponent)}`` of the layers touching the region, in graph order (made
        once per plan: sizing, naming and applying it read the same)."""
        if self._layer_exps[0] is not p:
            self._layer_exps = (p, self._exps_of_layers(p))
        return self._layer_exps[1]

    def _exps_of_layers(self, p: Plan) -> dict:
        out = {}
        nodes = [self.written[v] for v in p.exps if v in self.written] + [u for v in p.exps for u in self.g.users(v)]
        for node in self.in_order(nodes):
            lw = self.layer(node)
            if lw is None:
                continue
            layer = lw[0]
            e_out = Fraction(0) if layer.output in p.mul_after else p.exps.get(layer.output, Fraction(0))
            e_in = self.op_exp(p, node, "input", layer.input) if not self.is_const(layer.input) else Fraction(0)
            if e_out != 0 or e_in != 0:
                out[node] = (e_out - e_in, e_out)
        return out


def _nbytes(w: LayerWeights) -> int:
    return w.weight.nbytes + (0 if w.bias is None else w.bias.nbytes)


def _degree(op) -> Fraction | None:
    """A ``power`` op's degree as a fraction of denominator at most 8, or None: not a finite nonzero number, or
    not such a fraction exactly (``s ** degree`` would be no power of two for every ``k``)."""
    d = op.degree
    if not d or not math.isfinite(d):
        return None
    f = Fraction(d)
    return f if f.denominator <= 8 else None


def span(t) -> tuple[float, float]:
    """``(smallest nonzero, largest)`` magnitude of ``t`` (NaN: largest NaN, never the smallest), in the tensor's
    dtype (the same floats as in float64, without a float64 copy); a large tensor a block at a time
    (``fold_math.index_blocks``: its temporaries a block's, not the tensor's: a streamed model's weight is the largest
    thing a rewrite holds; each op on the calling thread)."""
    if not t.numel():
        return (0.0, 0.0)
    t = t.detach()
    if t.dim() == 0 or t.numel() < BLOCK_ELEMENTS:
        return _span(t)
    parts = [_span(t[idx]) for idx in index_blocks(tuple(t.shape))]
    highs = [high for _, high in parts]
    high = math.nan if any(math.isnan(h) for h in highs) else max(highs)
    lows = [low for low, _ in parts if low > 0.0]
    return (min(lows) if lows else 0.0, high)


def _span(t) -> tuple[float, float]:
    a = t.abs()
    if not a.is_floating_point():
        a = a.double()
    high = float(a.max())
    positive = a > 0
    low = float(a.masked_fill_(~positive, math.inf).min()) if bool(positive.any()) else 0.0
    return (low, high)
