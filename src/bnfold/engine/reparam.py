"""Structural re-parameterization: parallel branches that read one value and are summed become one conv.

A RepVGG / MobileOne / RepViT / ACNet block computes ``Σ coeff_i ⊙ branch_i(x) + shift`` where each
branch is a conv reading ``x`` (its BN already folded into it by the other rules), ``x`` itself (an
identity, possibly through a BN or per-channel affine: a coefficient) or an average pool of ``x``.
The sum is read down from its last add through adds, subs and per-channel affines (a layer scale, a
BN) whose values have no other reader; every leaf must be a branch of the same ``x``.  The branches
then become the conv with the largest kernel (``bnfold.fold_math``: kernels embedded where the
paddings align, identity and pool as kernels, coefficients and sums), and the sum's value is that
conv's output; a BN after the sum then folds into it by the output rule.

What is not exact is refused with a reason (kept on the last add, reported as skipped): an
activation inside a branch, a branch value with another reader, branches that read different
values, different strides / dilations / groups, misaligned padding, an average pool that does not
count its padding.  Written once, for every graph kind: the adapter only answers and edits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .. import fold_math
from ..fold_math import Affine, FoldError
from ..report import Folded, Merged
from .chain import Stop, _same, binary_step, norm_step
from .graph import GraphAdapter, Layer, Outcome, Pool
from .rules import check_layer

#: How many sum / affine nodes one merged sum may hold (a bound on the walk).
MAX_TREE = 256


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
    x: Any  # the value the anchor conv reads: a leaf wherever it appears, whatever computes it
    terms: list = field(default_factory=list)
    shift: torch.Tensor = None
    nodes: list = field(default_factory=list)  # the sum and affine nodes (removed by the merge)
    norms: list = field(default_factory=list)
    problems: dict = field(default_factory=dict)  # value -> why the node computing it is not affine here


class _Refused(Exception):
    pass


def _sum(graph: GraphAdapter, node: Any) -> tuple[Any, Any, float] | None:
    """``node`` as ``a + k * b`` of two computed values (an add or a sub), or None."""
    op = graph.binary(node) if node is not None else None
    if op is None or op.op not in ("add", "sub") or graph.constant(op.a) is not None:
        return None
    if graph.constant(op.b) is not None:
        return None
    alpha = op.alpha if isinstance(op.alpha, (int, float)) else graph.constant(op.alpha)
    if alpha is None or (isinstance(alpha, torch.Tensor) and alpha.numel() != 1):
        return None
    alpha = float(alpha)
    return op.a, op.b, alpha if op.op == "add" else -alpha


def _output(graph: GraphAdapter, node: Any) -> Any:
    op = graph.binary(node)
    if op is not None:
        return op.output
    norm = graph.norm(node)
    return norm.output if norm is not None else None


def _affine_step(graph: GraphAdapter, node: Any, value: Any, channels: int, tree: _Tree):
    """The per-channel affine ``node`` applies to produce ``value`` (a Step), or None."""
    rank = graph.shape_info(value).rank
    try:
        norm = graph.norm(node)
        if norm is not None:
            if norm.affine_only or not _same(norm.output, value):
                return None
            return norm_step(graph, norm, 1, channels, rank)
        op = graph.binary(node)
        if op is None:
            return None
        data = [v for v in (op.a, op.b) if graph.constant(v) is None]
        if len(data) != 1:
            return None
        return binary_step(graph, node, data[0], 1, channels, rank)
    except Stop as stop:
        tree.problems[value] = stop.reason
        return None


def _expand(graph: GraphAdapter, value: Any, coeff: torch.Tensor, parent: Any, tree: _Tree, norms: list) -> None:
    node = graph.producer(value)
    if _same(value, tree.x):
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
    if layer is not None and layer.kind == "conv" and _same(layer.output, value):
        tree.terms.append(_Term(value, coeff, "conv", layer.input, shared, layer=layer, norms=norms))
        return
    pool = graph.pool(node) if node is not None else None
    if pool is not None and _same(pool.output, value):
        tree.terms.append(_Term(value, coeff, "pool", pool.input, shared, pool=pool, norms=norms))
        return
    tree.terms.append(_Term(value, coeff, "identity", value, shared, norms=norms))


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
    """Merge the summed branches that ``layer`` is one of into one conv (the one with the largest kernel)."""
    out = Outcome()
    if layer.kind != "conv" or not graph.is_live(layer.node):
        return out
    users = graph.users(layer.output)
    if len(users) != 1 or users[0] is None or _sum(graph, users[0]) is None:
        return out
    weights = graph.weights(layer)
    if isinstance(weights, str) or weights.weight.dim() < 3:
        return out
    channels = int(weights.weight.shape[0])
    refusal = None
    for root in _roots(graph, users[0]):
        tree = _Tree(channels, layer.input, shift=torch.zeros(channels, dtype=torch.float64))
        root_value = _output(graph, root)
        _expand(graph, root_value, torch.ones(channels, dtype=torch.float64), None, tree, [])
        ours = [t for t in tree.terms if _same(t.source, layer.input) or _activation(graph, t, layer.input)]
        if len(ours) < 2:
            continue  # not branches of one value (a residual add of another block's value)
        try:
            plan = _plan(graph, layer, tree, root_value, only)
        except _Refused as why:
            refusal = refusal or (root, str(why))
            continue
        if plan is None:
            return out  # merged from another branch (the one that keeps its conv)
        _apply(graph, root, root_value, tree, plan, out)
        return out
    if refusal is not None:
        out.reasons[refusal[0]] = f"its branches do not merge into one conv: {refusal[1]}"
    return out


def _activation(graph: GraphAdapter, term: _Term, x: Any) -> str:
    """Why ``term`` is a branch of ``x`` with an op that is not affine in it (an activation), or ""."""
    node = graph.producer(term.value)
    if term.kind != "identity" or node is None:
        return ""
    for v in graph.inputs(node):
        below = graph.producer(v)
        inner = graph.layer(below) if below is not None else None
        if inner is not None and _same(inner.input, x):
            return (
                f"{graph.describe_node(node)} after {graph.describe_node(inner.node)} is not affine: "
                "an activation inside a branch"
            )
    return ""


def _foreign(graph: GraphAdapter, term: _Term, x: Any, tree: _Tree) -> str:
    what = graph.describe(term.value)
    if term.value in tree.problems:
        return f"{what} is not a per-channel affine of a branch ({tree.problems[term.value]})"
    activation = _activation(graph, term, x)
    if activation:
        return activation
    return f"the sum also adds {what}, which does not read {graph.describe(x)}: the branches read different inputs"


def _plan(graph: GraphAdapter, anchor: Layer, tree: _Tree, root_value: Any, only):
    """The merged weight and bias and the conv that takes them; None when another branch's conv keeps
    them; _Refused with the reason when the merge is not exact."""
    x = anchor.input
    for term in tree.terms:
        if not _same(term.source, x):
            raise _Refused(_foreign(graph, term, x, tree))
        if term.shared and term.kind != "identity":
            raise _Refused(f"the branch value {graph.describe(term.value)} has another user")
    convs = [t for t in tree.terms if t.kind == "conv"]
    excluded = getattr(graph, "excluded_layers", ())  # the driver's view when ``exclude`` is given
    for t in convs:
        if t.layer.node in excluded:
            raise _Refused(f"{graph.describe_node(t.layer.node)} is excluded (--exclude)")
    geometry = {}
    for t in convs:
        g = graph.conv_geometry(t.layer)
        if isinstance(g, str):
            raise _Refused(f"{graph.describe_node(t.layer.node)}: {g}")
        geometry[t.layer.node] = g
    target = max(convs, key=lambda t: _volume(geometry[t.layer.node].kernel))
    tg = geometry[target.layer.node]
    for t in convs:
        g = geometry[t.layer.node]
        for what in ("stride", "dilation", "groups"):
            if getattr(g, what) != getattr(tg, what):
                raise _Refused(
                    f"{graph.describe_node(t.layer.node)} and {graph.describe_node(target.layer.node)} have different "
                    f"{what} ({getattr(g, what)} vs {getattr(tg, what)})"
                )
        if any(k > big for k, big in zip(g.kernel, tg.kernel)):
            raise _Refused(f"no branch has a kernel that covers {list(g.kernel)} and {list(tg.kernel)}")
    if target.layer.node != anchor.node:
        return None
    out_shape = graph.shape_info(root_value).shape
    if out_shape is None or not all(isinstance(d, int) for d in out_shape):
        raise _Refused(f"the shape of {graph.describe(root_value)} is not known")
    for term in tree.terms:
        shape = graph.shape_info(term.value).shape
        if shape != out_shape:
            raise _Refused(f"{graph.describe(term.value)} has shape {_dims(shape)}, the sum {_dims(out_shape)}")
    parts = []
    try:
        w_target = check_layer(graph, target.layer, only)
        for t in convs:
            w = w_target if t is target else check_layer(graph, t.layer, only)
            if w.pre is not None:
                raise _Refused(f"{graph.describe_node(t.layer.node)} scales its product")
            g = geometry[t.layer.node]
            offsets = fold_math.kernel_offsets(g.kernel, g.pads, tg.kernel, tg.pads, tg.dilation)
            kernel = fold_math.embed_kernel(w.weight, tg.kernel, offsets)
            parts.append(fold_math.scale_branch(kernel, w.bias, _coeff(t)))
        rank = len(tg.kernel)
        for t in tree.terms:
            if t.kind == "identity":
                if w_target.weight.shape[1] * tg.groups != tree.channels:
                    raise _Refused(
                        f"the conv reads {w_target.weight.shape[1] * tg.groups} channels and writes {tree.channels}"
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
        if w_target.bias is not None or bool((bias != 0).any()):
            new_b = fold_math.cast_checked(bias, w_target.bias_dtype, f"{target.layer.op} bias")
    except Stop as stop:
        raise _Refused(stop.reason) from None
    except FoldError as err:
        raise _Refused(str(err)) from None
    return target, new_w, new_b


def _pool_kernel(graph: GraphAdapter, pool: Pool, tg, channels: int) -> torch.Tensor:
    what = graph.describe_node(pool.node)
    if pool.stride != tg.stride:
        raise _Refused(f"{what} has stride {pool.stride}, the conv {tg.stride}")
    if not pool.count_include_pad and any(p for pads in pool.pads for p in pads):
        raise _Refused(f"{what} pads without counting the padding (count_include_pad=False)")
    if pool.ceil_mode or pool.divisor is not None:
        raise _Refused(f"{what} uses ceil_mode or a divisor_override")
    if any(k > 1 and d != 1 for k, d in zip(pool.kernel, tg.dilation)):
        raise _Refused(f"{what} reads adjacent taps and the conv is dilated {tg.dilation}")
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
    folded = [
        Folded(graph.norm_label(n), into, f"{n.op}+merge", "merge", 0, graph.node_name(n.node), into_node)
        for n in tree.norms
    ]
    removed = list(tree.nodes)
    removed += [t.layer.node for t in tree.terms if t.kind == "conv" and t is not target]
    removed += [t.pool.node for t in tree.terms if t.kind == "pool"]
    seen, unique = set(), []
    for node in removed:
        if node not in seen:
            seen.add(node)
            unique.append(node)
    graph.bypass(root_value, target.layer.output, unique)
    extra, pending = graph.write_layer(target.layer, new_w, new_b, into.replace(".", "_").replace("/", "_"))
    assert pending is None, "internal: a conv holds its bias"
    for entry in folded[:1]:
        entry.extra_bytes = extra
    out.folded.extend(folded)
    out.merged.append(merged)


def _kernel(layer: Layer, graph: GraphAdapter) -> tuple:
    g = graph.conv_geometry(layer)
    return () if isinstance(g, str) else g.kernel
