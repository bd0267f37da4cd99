"""Structural re-parameterization: parallel branches that read one value and are summed become one conv.

A RepVGG / MobileOne / RepViT / ACNet / GhostNetV3 block computes ``Σ coeff_i ⊙ branch_i(x) + shift``
where each branch is a conv reading ``x`` (its BN already folded into it by the other rules), ``x``
itself (an identity, possibly through a BN or per-channel affine: a coefficient) or an average pool
of ``x``.  The sum is read down from its last add through adds, subs (in place too, ``out +=
branch(x)``, where nothing else reads what it adds into) and per-channel affines (a layer scale, a
BN) whose values have no other reader; every leaf must be a branch of the same ``x``.  The branches
then become the conv with the largest kernel (``bnfold.fold_math``: kernels embedded where the
paddings align, identity and pool as kernels, coefficients and sums), and the sum's value is that
conv's output; a BN after the sum then folds into it by the output rule.  Linears of one value summed
the same way (two classifier heads averaged) become one linear: a linear is a conv without taps.

What is not exact is refused with a reason and a ``MERGE_*`` :class:`~bnfold.report.Code`, kept on
the sum's last add (a ``report.kept_ops`` note: the add is no normalization): an activation inside a
branch (``MERGE_ACTIVATION``), a branch value with another reader or an in-place add into a value
another op reads (``MERGE_SHARED``), branches that read different values (``MERGE_INPUTS``),
different strides / dilations / groups (``MERGE_GEOMETRY``), misaligned padding (``MERGE_PADDING``),
an average pool that does not count its padding (``MERGE_POOL``).  Written once, for every graph
kind: the adapter only answers and makes one primitive edit (``bypass``) besides writing the layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .. import fold_math
from ..fold_math import Affine, FoldError
from ..report import Code, Folded, FoldStep, Merged
from .axes import channel_axis
from .chain import Stop, binary_step, norm_step, same_value
from .edit import write_layer
from .graph import ConvGeometry, GraphAdapter, Layer, Outcome, Pool
from .rule import Rule
from .rules import check_layer

#: How many sum / affine nodes one merged sum may hold (a bound on the walk).
MAX_TREE = 256

#: The layer kinds whose summed branches merge, with the weight ranks they take: a conv's
#: ``[out, in/g, *kernel]``, a linear's ``[out, in]`` (a linear is a conv without a kernel).
_WEIGHT_RANKS = {"conv": lambda dim: dim >= 3, "linear": lambda dim: dim == 2}

#: A linear in conv terms: no spatial axis, one group (its weight is a kernel without taps).
_LINEAR = ConvGeometry((), (), (), (), 1)


@dataclass
class _Term:
    value: Any
    coeff: torch.Tensor  # per channel, float64
    kind: str  # "conv", "pool" or "identity"
    source: Any  # the value the branch reads
    shared: bool  # the branch value has a reader outside the sum
    layer: Layer | None = None
    pool: Pool | None = None
    norms: list = field(default_factory=list)  # normalizations between the branch and the sum


@dataclass
class _Tree:
    channels: int
    x: Any  # the value the anchor layer reads: a leaf wherever it appears, whatever computes it
    kind: str = "conv"  # the anchor's kind: "conv", or "linear" (branches of one kind merge)
    axis: int = 1  # the anchor's output channel axis (negative: from the end)
    terms: list = field(default_factory=list)
    shift: torch.Tensor = None
    nodes: list = field(default_factory=list)  # the sum and affine nodes (removed by the merge)
    norms: list = field(default_factory=list)
    problems: dict = field(default_factory=dict)  # value -> (why, code) the node computing it is not affine here


class _Refused(Exception):
    """The merge is not exact: ``reason`` and its ``code``."""

    def __init__(self, reason: str, code: Code):
        super().__init__(reason)
        self.reason, self.code = reason, code


def _sum(graph: GraphAdapter, node: Any) -> tuple[Any, Any, float] | None:
    """``node`` as ``a + k * b`` of two computed values (an add or a sub, in place or not), or None."""
    op = (graph.inplace_sum(node) or graph.binary(node)) if node is not None else None
    if op is None or op.op not in ("add", "sub") or graph.is_constant(op.a):
        return None
    if graph.is_constant(op.b):
        return None
    alpha = op.alpha if isinstance(op.alpha, (int, float)) else graph.constant(op.alpha)
    if alpha is None or (isinstance(alpha, torch.Tensor) and alpha.numel() != 1):
        return None
    alpha = float(alpha)
    return op.a, op.b, alpha if op.op == "add" else -alpha


def _output(graph: GraphAdapter, node: Any) -> Any:
    op = graph.inplace_sum(node) or graph.binary(node)
    if op is not None:
        return op.output
    norm = graph.norm(node)
    return norm.output if norm is not None else None


def _affine_step(graph: GraphAdapter, node: Any, value: Any, channels: int, tree: _Tree):
    """The per-channel affine ``node`` applies to produce ``value`` (a ChainStep), or None."""
    rank = graph.shape_info(value).rank
    axis = channel_axis(tree.axis, rank)
    try:
        norm = graph.norm(node)
        if norm is not None:
            if norm.affine_only or not same_value(norm.output, value):
                return None
            return norm_step(graph, norm, axis, channels, rank)
        op = graph.binary(node)
        if op is None:
            return None
        data = [v for v in (op.a, op.b) if not graph.is_constant(v)]
        if len(data) != 1:
            return None
        return binary_step(graph, node, data[0], axis, channels, rank)
    except Stop as stop:
        tree.problems[value] = (stop.reason, stop.code)
        return None


def _expand(graph: GraphAdapter, value: Any, coeff: torch.Tensor, parent: Any, tree: _Tree, norms: list) -> None:
    node = graph.producer(value)
    if same_value(_read(graph, value), tree.x):
        tree.terms.append(_Term(value, coeff, "identity", value, False, norms=norms))
        return
    inside = node is not None and (parent is None or graph.users(value) == [parent])
    if inside and len(tree.nodes) < MAX_TREE:
        parts = _sum(graph, node)
        if parts is not None:
            tree.nodes.append(node)
            _expand(graph, parts[0], coeff, node, tree, [])
            _expand(graph, parts[1], coeff * parts[2], node, tree, [])
            return
        step = _affine_step(graph, node, value, tree.channels, tree)
        if step is not None:
            tree.nodes.append(node)
            tree.shift = tree.shift + coeff * step.affine.shift
            if step.norm is not None:
                tree.norms.append(step.norm)
            _expand(
                graph, step.input, coeff * step.affine.scale, node, tree, norms + ([step.norm] if step.norm else [])
            )
            return
    shared = parent is not None and graph.users(value) != [parent]
    layer = graph.layer(node) if node is not None else None
    if layer is not None and layer.kind == tree.kind and same_value(layer.output, value):
        tree.terms.append(_Term(value, coeff, "conv", _read(graph, layer.input), shared, layer=layer, norms=norms))
        return
    pool = graph.pool(node) if node is not None and tree.kind == "conv" else None
    if pool is not None and same_value(pool.output, value):
        tree.terms.append(_Term(value, coeff, "pool", pool.input, shared, pool=pool, norms=norms))
        return
    tree.terms.append(_Term(value, coeff, "identity", value, shared, norms=norms))


def _read(graph: GraphAdapter, value: Any) -> Any:
    """The value ``value`` is, seen through identity hops (an eval dropout, a clone): two heads that each
    drop out the same feature read one value."""
    for _ in range(MAX_TREE):
        node = graph.producer(value)
        hop = graph.hop(node) if node is not None else None
        if hop is None or not hop.identity or not same_value(hop.output, value):
            break
        value = hop.input
    return value


def _roots(graph: GraphAdapter, first: Any) -> list:
    """The sum nodes above ``first`` (itself included), topmost first: each reached through values
    with one reader, across adds, subs and per-channel affines."""
    roots, node = [first], first
    for _ in range(MAX_TREE):
        out = _output(graph, node)
        users = graph.users(out) if out is not None else []
        if len(users) != 1 or users[0] is None:
            break
        node = users[0]
        if _sum(graph, node) is not None:
            roots.append(node)
        elif graph.binary(node) is None and graph.norm(node) is None:
            break
    return roots[::-1]


def merge_branches(graph: GraphAdapter, layer: Layer, only) -> Outcome:
    """Merge the summed branches that ``layer`` is one of into one layer: of convs, the one with the
    largest kernel; of linears (two heads of one feature, averaged), the first."""
    out = Outcome()
    if layer.kind not in _WEIGHT_RANKS or not graph.is_live(layer.node):
        return out
    users = graph.users(layer.output)
    if len(users) != 1 or users[0] is None or _sum(graph, users[0]) is None:
        return out
    weights = graph.weights(layer, False)  # its shape: the weights are read only for a merge
    if isinstance(weights, str) or not _WEIGHT_RANKS[layer.kind](weights.weight.dim()):
        return out
    channels = int(weights.weight.shape[0])
    refusal = None
    for root in _roots(graph, users[0]):
        tree = _Tree(
            channels,
            _read(graph, layer.input),
            layer.kind,
            layer.out_axis,
            shift=torch.zeros(channels, dtype=torch.float64),
        )
        root_value = _output(graph, root)
        _expand(graph, root_value, torch.ones(channels, dtype=torch.float64), None, tree, [])
        ours = [t for t in tree.terms if same_value(t.source, tree.x) or _activation(graph, t, tree.x)]
        if len(ours) < 2:
            continue  # not branches of one value (a residual add of another block's value)
        if tree.kind == "linear" and any(t.kind == "identity" for t in ours):
            continue  # a residual around a linear (x + fc(x)) stays: only summed linears merge
        try:
            plan = _plan(graph, layer, tree, root_value, only)
        except _Refused as why:
            refusal = refusal or (root, why)
            continue
        if plan is None:
            return out  # merged from another branch (the one that keeps its conv)
        _apply(graph, root, root_value, tree, plan, out)
        return out
    if refusal is not None:
        root, why = refusal
        out.reasons[root] = (f"its branches do not merge into one conv: {why.reason}", why.code)
    return out


def _activation(graph: GraphAdapter, term: _Term, x: Any) -> str:
    """Why ``term`` is a branch of ``x`` with an op that is not affine in it (an activation), or ""."""
    node = graph.producer(term.value)
    if term.kind != "identity" or node is None:
        return ""
    for v in graph.inputs(node):
        below = graph.producer(v)
        inner = graph.layer(below) if below is not None else None
        if inner is not None and same_value(_read(graph, inner.input), x):
            return (
                f"{graph.describe_node(node)} after {graph.describe_node(inner.node)} is not affine: "
                "an activation inside a branch"
            )
    return ""


def _foreign(graph: GraphAdapter, term: _Term, x: Any, tree: _Tree) -> _Refused:
    what = graph.describe(term.value)
    if term.value in tree.problems:
        reason, code = tree.problems[term.value]
        return _Refused(f"{what} is not a per-channel affine of a branch ({reason})", code)
    activation = _activation(graph, term, x)
    if activation:
        return _Refused(activation, Code.MERGE_ACTIVATION)
    return _Refused(
        f"the sum also adds {what}, which does not read {graph.describe(x)}: the branches read different inputs",
        Code.MERGE_INPUTS,
    )


def _plan(graph: GraphAdapter, anchor: Layer, tree: _Tree, root_value: Any, only):
    """The merged weight and bias and the conv that takes them; None when another branch's conv keeps
    them; _Refused with the reason when the merge is not exact."""
    x = tree.x
    for node in tree.nodes:
        op = graph.inplace_sum(node)
        if op is not None and graph.users(op.a) != [node]:  # the merge would leave it unchanged for them
            raise _Refused(
                f"{graph.describe_node(node)} adds in place into {graph.describe(op.a)}, which another op reads",
                Code.MERGE_SHARED,
            )
    for term in tree.terms:
        if not same_value(term.source, x):
            raise _foreign(graph, term, x, tree)
        if term.shared and term.kind != "identity":
            raise _Refused(f"the branch value {graph.describe(term.value)} has another user", Code.MERGE_SHARED)
    convs = [t for t in tree.terms if t.kind == "conv"]
    excluded = getattr(graph, "excluded_layers", ())  # the driver's view when ``exclude`` is given
    for t in convs:
        if t.layer.node in excluded:
            raise _Refused(f"{graph.describe_node(t.layer.node)} is excluded (--exclude)", Code.EXCLUDED)
    geometry = {}
    for t in convs:
        g = graph.conv_geometry(t.layer) if t.layer.kind == "conv" else _LINEAR
        if isinstance(g, str):
            raise _Refused(f"{graph.describe_node(t.layer.node)}: {g}", Code.MERGE_GEOMETRY)
        geometry[t.layer.node] = g
    target = max(convs, key=lambda t: _volume(geometry[t.layer.node].kernel))
    tg = geometry[target.layer.node]
    for t in convs:
        g = geometry[t.layer.node]
        for what in ("stride", "dilation", "groups"):
            if getattr(g, what) != getattr(tg, what):
                raise _Refused(
                    f"{graph.describe_node(t.layer.node)} and {graph.describe_node(target.layer.node)} have different "
                    f"{what} ({getattr(g, what)} vs {getattr(tg, what)})",
                    Code.MERGE_GEOMETRY,
                )
        if any(k > big for k, big in zip(g.kernel, tg.kernel)):
            raise _Refused(
                f"no branch has a kernel that covers {list(g.kernel)} and {list(tg.kernel)}", Code.MERGE_GEOMETRY
            )
    if target.layer.node != anchor.node:
        return None
    out_shape = graph.shape_info(root_value).shape
    if out_shape is None or not all(isinstance(d, int) for d in out_shape):
        raise _Refused(f"the shape of {graph.describe(root_value)} is not known", Code.MERGE_GEOMETRY)
    for term in tree.terms:
        shape = graph.shape_info(term.value).shape
        if shape != out_shape:
            raise _Refused(
                f"{graph.describe(term.value)} has shape {_dims(shape)}, the sum {_dims(out_shape)}",
                Code.MERGE_GEOMETRY,
            )
    parts = []
    try:
        w_target = check_layer(graph, target.layer, only, "output")[0]
        for t in convs:
            w = w_target if t is target else check_layer(graph, t.layer, only, "output")[0]
            g = geometry[t.layer.node]
            offsets = fold_math.kernel_offsets(g.kernel, g.pads, tg.kernel, tg.pads, tg.dilation)
            kernel = fold_math.embed_kernel(w.weight, tg.kernel, offsets)
            # a Gemm's own alpha and beta * C act after its product, before the branch's coefficient
            parts.append(fold_math.scale_branch(kernel, w.bias, _coeff(t) if w.pre is None else w.pre.then(_coeff(t))))
        rank = len(tg.kernel)
        for t in tree.terms:
            if t.kind == "identity":
                if w_target.weight.shape[1] * tg.groups != tree.channels:
                    raise _Refused(
                        f"the conv reads {w_target.weight.shape[1] * tg.groups} channels and writes {tree.channels}",
                        Code.CHANNEL_MISMATCH,
                    )
                offsets = fold_math.kernel_offsets((1,) * rank, ((0, 0),) * rank, tg.kernel, tg.pads, tg.dilation)
                kernel = fold_math.embed_kernel(
                    fold_math.identity_kernel(tree.channels, tg.groups, rank), tg.kernel, offsets
                )
            elif t.kind == "pool":
                kernel = _pool_kernel(graph, t.pool, tg, tree.channels)
            else:
                continue
            parts.append(fold_math.scale_branch(kernel, None, _coeff(t)))
        weight, bias = fold_math.sum_branches(parts)
        bias = bias + tree.shift
        new_w = fold_math.cast_checked(weight, w_target.weight_dtype, f"{target.layer.op} weight")
        new_b = None
        if w_target.bias is not None or w_target.pre is not None or bool((bias != 0).any()):
            new_b = fold_math.cast_checked(bias, w_target.bias_dtype, f"{target.layer.op} bias")
    except Stop as stop:
        raise _Refused(stop.reason, stop.code) from None
    except FoldError as err:
        raise _Refused(str(err), err.code) from None
    return target, new_w, new_b


def _pool_kernel(graph: GraphAdapter, pool: Pool, tg, channels: int) -> torch.Tensor:
    what = graph.describe_node(pool.node)
    if pool.stride != tg.stride:
        raise _Refused(f"{what} has stride {pool.stride}, the conv {tg.stride}", Code.MERGE_GEOMETRY)
    if not pool.count_include_pad and any(p for pads in pool.pads for p in pads):
        raise _Refused(f"{what} pads without counting the padding (count_include_pad=False)", Code.MERGE_POOL)
    if pool.ceil_mode or pool.divisor is not None:
        raise _Refused(f"{what} uses ceil_mode or a divisor_override", Code.MERGE_POOL)
    if any(k > 1 and d != 1 for k, d in zip(pool.kernel, tg.dilation)):
        raise _Refused(f"{what} reads adjacent taps and the conv is dilated {tg.dilation}", Code.MERGE_POOL)
    offsets = fold_math.kernel_offsets(pool.kernel, pool.pads, tg.kernel, tg.pads, tg.dilation)
    return fold_math.embed_kernel(fold_math.avg_pool_kernel(channels, tg.groups, pool.kernel), tg.kernel, offsets)


def _coeff(term: _Term) -> Affine:
    return Affine(term.coeff, torch.zeros_like(term.coeff))


def _volume(kernel) -> int:
    n = 1
    for k in kernel:
        n *= int(k)
    return n


def _dims(shape) -> str:
    return "unknown" if shape is None else str(list(shape))


def _apply(graph: GraphAdapter, root: Any, root_value: Any, tree: _Tree, plan, out: Outcome) -> None:
    target, new_w, new_b = plan
    into, into_node = graph.op_label(target.layer.node), graph.node_name(target.layer.node)
    branches, pattern = [], []
    for t in tree.terms:
        if t.kind == "conv":
            name, kind = graph.op_label(t.layer.node), f"{t.layer.op}{'x'.join(map(str, _kernel(t.layer, graph)))}"
        elif t.kind == "pool":
            name, kind = graph.op_label(t.pool.node), f"{t.pool.op}{'x'.join(map(str, t.pool.kernel))}"
        else:
            name = kind = "identity"
        if t.norms:
            name += f" [{', '.join(graph.norm_label(n) for n in t.norms)}]"
        branches.append(name)
        pattern.append(kind)
    norms = [graph.norm_label(n) for n in tree.norms]
    merged = Merged(into, branches, "+".join(pattern), graph.node_name(root), into_node, norms)
    removed = list(tree.nodes)
    removed += [t.layer.node for t in tree.terms if t.kind == "conv" and t.layer.node != target.layer.node]
    removed += [t.pool.node for t in tree.terms if t.kind == "pool"]
    seen, unique = set(), []
    for node in removed:
        if node not in seen:
            seen.add(node)
            unique.append(node)
    steps = [FoldStep(graph.node_name(n), _op(graph, n)) for n in unique]  # named while still in the graph
    folded = [
        Folded(
            graph.norm_label(n),
            into,
            f"{n.op}+merge",
            "output",
            0,
            graph.node_name(n.node),
            into_node,
            MERGE.name,
            list(steps),
            [into_node],
            kind=n.kind,
        )
        for n in tree.norms
    ]
    graph.bypass(root_value, target.layer.output, unique)
    extra, bias_added = write_layer(graph, target.layer, new_w, new_b, into.replace(".", "_").replace("/", "_"))
    for entry in folded:
        entry.bias_added = bias_added  # a conv that cannot hold a bias: the bias goes after it
    for entry in folded[:1]:
        entry.extra_bytes = extra
    out.folded.extend(folded)
    out.merged.append(merged)


def _op(graph: GraphAdapter, node: Any) -> str:
    """The readable op of a node a merge removes (a sum, an affine, a branch conv or pool)."""
    for parse in (graph.norm, graph.inplace_sum, graph.binary, graph.layer, graph.pool):
        found = parse(node)
        if found is not None:
            return getattr(found, "name", "") or found.op
    return graph.describe_node(node)


def _kernel(layer: Layer, graph: GraphAdapter) -> tuple:
    g = graph.conv_geometry(layer) if layer.kind == "conv" else _LINEAR
    return () if isinstance(g, str) else g.kernel


MERGE = Rule("merge", "convs of one input summed (re-parameterization branches): into one conv", merge_branches)
