"""The driver: find each normalization, try the layer before it (output side)
and the layer after it (input side), and repeat until nothing more folds.

A BatchNormalization that stays is always reported with a reason.  A
Mul/Div/Add/Sub by a constant is only a candidate next to a layer; it is
reported when it alone reads that layer's output (or alone feeds it) and
still does not fold.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import onnx
from onnx import NodeProto

from ..fold_math import FoldError
from ..report import Folded, FoldReport, FoldResult, Skipped
from .graph import GraphInfo, ModelIndex, Tracker, clean_up
from .nodes import is_onnx_op, label
from .rewrite import add_bias_node, input_params, output_params, write_params
from .rules import (
    LAYERS_TEXT,
    AffineOp,
    Layer,
    affine_op,
    bn_affine,
    bn_params,
    compose,
    in_chan,
    is_matmul_bias,
    layer,
    op_affine,
    out_chan,
    with_bias,
)
from .shapes import HOPS, Chan, Shapes, hop_forward


def fold_onnx(model_or_path, only=None) -> FoldResult:
    """Fold BatchNormalization and per-channel affines into Conv / ConvTranspose / Gemm / MatMul.

    ``model_or_path`` is an ``onnx.ModelProto`` (never mutated) or a path to a
    ``.onnx`` file (read with :func:`bnfold.onnx.load_onnx`).  ``only`` limits
    the layer kinds folded into (``"conv"``, ``"conv_transpose"``, ``"linear"``).
    The result's ``model`` is a new ModelProto.  It carries no external-data
    layout: to save it the way a file was laid out, read the file with
    ``load_onnx`` and pass its layout to ``save_onnx``.
    """
    if isinstance(model_or_path, (str, os.PathLike)):
        from ..io.onnx import load_onnx

        original = load_onnx(model_or_path).model
    elif isinstance(model_or_path, onnx.ModelProto):
        original = model_or_path
    else:
        raise TypeError(f"fold_onnx takes an onnx.ModelProto or a path, not {type(model_or_path).__name__}")
    only = None if only is None else frozenset(only)
    model = onnx.ModelProto()
    model.CopyFrom(original)
    report = _Folder(model, original, only).run()
    return FoldResult(model, report)


@dataclass
class _Side:
    """One side's attempt: folded, or a reason (``relevant``: a layer was there)."""

    folded: Folded | None = None
    reason: str = ""
    relevant: bool = False
    producer: str = ""


class _Folder:
    def __init__(self, model: onnx.ModelProto, original: onnx.ModelProto, only):
        self.model = model
        self.only = only
        self.shapes = Shapes(original)
        self.tracker = Tracker()
        self.folded: list[Folded] = []

    def run(self) -> FoldReport:
        limit = sum(1 for _ in _all_nodes(self.model.graph)) + 2
        for _ in range(limit):
            self.index = ModelIndex(self.model, self.tracker)
            self.skipped: list[Skipped] = []
            changed = False
            for gi in list(self.index.graphs):
                for node in gi.nodes:
                    if self.index.is_dead(node):
                        continue
                    if is_onnx_op(node, "BatchNormalization"):
                        changed |= self._batch_norm(gi, node)
                    elif (op := affine_op(self.index, gi, node)) is not None:
                        changed |= self._affine(gi, op)
            self.index.compact()
            if not changed:
                break
        clean_up(self.model, self.tracker)
        return FoldReport(self.folded, self.skipped)

    # ---------------------------------------------------------------- BN
    def _batch_norm(self, gi: GraphInfo, node: NodeProto) -> bool:
        name = label(node)
        params = bn_params(self.index, gi, node)
        if isinstance(params, str):
            self.skipped.append(Skipped(name, params, self._producer_label(gi, node.input[0]), name))
            return False

        def make_aff(chan: Chan, where: str):
            return bn_affine(params, chan, where)

        out = self._output_side(gi, node, 0, [node], make_aff, name, name)
        if out.folded:
            return True
        inp = self._input_side(gi, [(node, 0, make_aff)], name, name)
        if inp.folded:
            return True
        reasons = [s.reason for s in (out, inp) if s.relevant]
        if not reasons:
            p = self.index.producer(gi, node.input[0])
            src = (f"{p.op_type} '{label(p)}'" if p is not None
                   else "a graph input" if node.input[0] in gi.inputs else "the enclosing graph")
            users = [f"{u.node.op_type} '{label(u.node)}'" if u.node is not None else "a graph output"
                     for u in self.index.visible_uses(gi, node.output[0])]
            reasons = [f"no layer to fold into: its input comes from {src} and its output goes to "
                       f"{', '.join(users) or 'nothing'}; it needs {LAYERS_TEXT} next to it"]
        self.skipped.append(Skipped(name, "; ".join(reasons), out.producer, name))
        return False

    # ------------------------------------------------------------- affines
    def _affine(self, gi: GraphInfo, op: AffineOp) -> bool:
        if is_matmul_bias(self.index, gi, op.node, self.shapes):
            return False
        out = self._affine_output(gi, op)
        if out.folded:
            return True
        inp = self._affine_input(gi, op)
        if inp.folded:
            return True
        for side in (out, inp):
            if side.relevant:
                name = label(op.node)
                self.skipped.append(Skipped(name, side.reason, out.producer, name))
                break
        return False

    def _affine_output(self, gi: GraphInfo, op: AffineOp) -> _Side:
        """``op`` is the first of a run of affines after a layer: fold the run."""
        run = [op]
        while True:
            user, _ = self.index.sole_user(gi, run[-1].node.output[0])
            nxt = affine_op(self.index, gi, user) if user is not None else None
            if nxt is None or nxt.data_name != run[-1].node.output[0]:
                break
            run.append(nxt)
        unit = [a.node for a in run]

        def make_aff(chan: Chan, where: str):
            affs = []
            for a in run:
                r = op_affine(a, chan)
                if isinstance(r, str):
                    if not affs:
                        return r
                    break
                affs.append(r)
            del unit[len(affs):]
            return compose(affs)

        return self._output_side(gi, op.node, op.data, unit, make_aff, None, None, affine=True)

    def _affine_input(self, gi: GraphInfo, op: AffineOp) -> _Side:
        """``op`` feeds a layer: fold the run of affines that ends in it (the longest part that folds)."""
        run = [op]
        while True:
            src = run[0].data_name
            p = self.index.producer(gi, src)
            prev = affine_op(self.index, gi, p) if p is not None else None
            user, _ = self.index.sole_user(gi, src)
            if prev is None or user is not run[0].node or is_matmul_bias(self.index, gi, p, self.shapes):
                break
            run.insert(0, prev)
        return self._input_side(gi, [(a.node, a.data, lambda chan, where, a=a: op_affine(a, chan)) for a in run],
                                None, None, affine=True)

    # ---------------------------------------------------------- the two sides
    def _output_side(self, gi, first: NodeProto, data_idx: int, unit: list, make_aff, norm_name, node_name,
                     affine=False) -> _Side:
        """Fold ``unit`` (nodes starting at ``first``) into the layer that computes ``first.input[data_idx]``."""
        index = self.index
        hops: list[NodeProto] = []
        v = first.input[data_idx]
        while (p := index.producer(gi, v)) is not None and is_onnx_op(p, *HOPS):
            hops.insert(0, p)
            v = p.input[0]
        if p is None:
            return _Side()
        lay = layer(index, gi, p, self.only)
        if lay is None and is_onnx_op(p, "Add"):  # a MatMul's bias Add
            mm = next((index.producer(gi, n) for n in p.input if index.producer(gi, n) is not None
                       and is_onnx_op(index.producer(gi, n), "MatMul")), None)
            if mm is not None and is_matmul_bias(index, gi, p, self.shapes):
                lay = layer(index, gi, mm, self.only)
        if lay is None or (affine and isinstance(lay, str) and _matmul_of_values(index, gi, p)):
            return _Side(producer=label(p))  # an affine after x @ y (attention) is no normalization
        into = f"{p.op_type} '{label(p)}'" if isinstance(lay, str) else f"{lay.op} '{lay.label}'"
        if isinstance(lay, str):
            return _Side(reason=lay, relevant=True, producer=label(p))
        lay = with_bias(index, gi, lay, self.shapes)
        side = _Side(relevant=True, producer=lay.label)
        # every value from the layer to the normalization must feed only the next node
        chain = [lay.out] + [h.output[0] for h in hops]
        for value, nxt in zip(chain, hops + [first]):
            user, why = index.sole_user(gi, value)
            if user is not nxt:
                if affine:
                    return _Side(producer=lay.label)
                side.reason = f"cannot fold into {into}: {why or 'its output feeds another node'}"
                return side
        chan = out_chan(lay, self.shapes)
        for h in hops:
            chan = hop_forward(index, gi, h, chan, self.shapes)
            if isinstance(chan, str):
                side.reason = f"cannot fold into {into}: {chan}"
                return side
        aff = make_aff(chan, f"the output of {into}" + (f" after {', '.join(h.op_type for h in hops)}" if hops else ""))
        if isinstance(aff, str):
            side.reason = f"cannot fold into {into}: {aff}"
            return side
        try:
            params = output_params(lay, aff)
        except FoldError as e:
            side.reason = f"cannot fold into {into}: {e}"
            return side
        feed = unit[0].input[data_idx]
        y = unit[-1].output[0]
        names = [label(n) for n in unit]
        for n in unit:  # first, so that their parameters no longer count as shared
            index.remove_node(gi, n)
        extra, pending_bias = write_params(index, gi, lay, params)
        if pending_bias is not None:
            add_bias_node(index, gi, unit[-1], feed, y, pending_bias, params.bias_type, chan, lay.label)
        else:
            pnode, pidx = gi.producer[feed]
            index.rename_output(gi, pnode, pidx, y)
        pattern = "+".join([lay.op] + [h.op_type for h in hops] + [n.op_type for n in unit])
        norm = norm_name or "+".join(names)
        side.folded = Folded(norm, lay.label, pattern, "output", extra, node_name or norm)
        self.folded.append(side.folded)
        return side

    def _input_side(self, gi, run: list, norm_name, node_name, affine=False) -> _Side:
        """Fold the run ``[(node, data_idx, make_aff), ...]`` into the layer its last node feeds."""
        index = self.index
        last = run[-1][0]
        user, why = index.sole_user(gi, last.output[0])
        if user is None or not user.input or user.input[0] != last.output[0]:
            if user is None and not affine:
                cons = [u.node for u in index.visible_uses(gi, last.output[0]) if u.node is not None]
                nxt = next((c for c in cons if layer(index, gi, c, self.only) is not None), None)
                if nxt is not None:
                    return _Side(reason=f"cannot fold into the following {nxt.op_type} '{label(nxt)}': {why}",
                                 relevant=True)
            return _Side()
        lay = layer(index, gi, user, self.only)
        if lay is None or (affine and isinstance(lay, str) and _matmul_of_values(index, gi, user)):
            return _Side()
        into = f"the following {user.op_type} '{label(user)}'"
        if isinstance(lay, str):
            return _Side(reason=lay, relevant=True)
        lay = with_bias(index, gi, lay, self.shapes)
        chan = in_chan(lay, self.shapes)
        affs = []
        for node, _, make_aff in reversed(run):  # nearest the layer first
            a = make_aff(chan, f"the input of {into}")
            if isinstance(a, str):
                if not affs:
                    return _Side(reason=f"cannot fold into {into}: {a}", relevant=True)
                break
            affs.insert(0, a)
        reason = ""
        for start in range(len(run) - len(affs), len(run)):
            part = run[start:]
            try:
                params = input_params(lay, compose(affs[start - (len(run) - len(affs)):]))
            except FoldError as e:
                reason = reason or f"cannot fold into {into}: {e}"
                continue
            return self._apply_input(gi, lay, part, params, chan, norm_name, node_name)
        return _Side(reason=reason, relevant=True)

    def _apply_input(self, gi, lay: Layer, part: list, params, chan: Chan, norm_name, node_name) -> _Side:
        index = self.index
        x = part[0][0].input[part[0][1]]
        names = [label(n) for n, _, _ in part]
        for n, _, _ in part:
            index.remove_node(gi, n)
        index.set_input(gi, lay.node, 0, x)
        extra, pending_bias = write_params(index, gi, lay, params)
        if pending_bias is not None:  # a MatMul gains a bias Add after it
            m = lay.node.output[0]
            pre = index.unique(f"{m}_unbiased")
            index.rename_output(gi, lay.node, 0, pre)
            index.tracker.gone.discard(m)
            out = Chan(chan.rank, -1 if chan.rank is None else chan.rank - 1, lay.n_out)
            add_bias_node(index, gi, lay.node, pre, m, pending_bias, params.bias_type, out, lay.label)
        pattern = "+".join([n.op_type for n, _, _ in part] + [lay.op])
        norm = norm_name or "+".join(names)
        folded = Folded(norm, lay.label, pattern, "input", extra, node_name or norm)
        self.folded.append(folded)
        return _Side(folded=folded, relevant=True, producer=lay.label)

    def _producer_label(self, gi: GraphInfo, name: str) -> str:
        p = self.index.producer(gi, name)
        return label(p) if p is not None else ""


def _matmul_of_values(index: ModelIndex, gi: GraphInfo, node: NodeProto) -> bool:
    """A MatMul whose second operand is not a constant (e.g. attention scores)."""
    if not is_onnx_op(node, "MatMul"):
        return False
    return len(node.input) < 2 or isinstance(index.constant(gi, node.input[1], "w"), str)


def _all_nodes(graph: onnx.GraphProto):
    for n in graph.node:
        yield n
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from _all_nodes(g)
