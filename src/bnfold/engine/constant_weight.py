"""A layer whose weight is computed from constants through a normalization of a constant: weight
standardization (timm's ``StdConv2d`` / ``ScaledStdConv2d``, NF-nets: ``batch_norm(w, training=True)``).

A normalization of a constant is a constant.  The weight is computed once (float64, by the adapter's
metered constant evaluation, rounded once to the weight's dtype) and stored as the layer's weight,
whether or not a BatchNorm follows; the computation goes, the normalization with it.  The other rules
run first, so a BatchNorm after the layer folds into the same computed weight in one write.

The walk goes up from the layer's weight through values read by one op only (a standardized weight
another op also reads stays: it would be computed twice) and stops at the normalizations it finds; one
whose statistics outputs are read stays too (a new weight beside the original saves nothing).
"""

from __future__ import annotations

from collections import deque

import torch

from ..fold_math import Affine, FoldError
from ..report import Code, Folded, FoldStep
from .chain import Stop
from .edit import write_layer
from .graph import GraphAdapter, Layer, Norm, Outcome
from .rule import Rule
from .rules import check_layer, output_params

#: How many values the walk up from a weight may visit.
MAX_WALK = 256


def constant_norms(graph: GraphAdapter, layer: Layer) -> list[Norm]:
    """The normalizations of constants that ``layer``'s weight is computed through, each reached through
    values with no other reader (breadth-first, bounded by :data:`MAX_WALK`)."""
    found: list[Norm] = []
    queue, seen = deque([(layer.weight, layer.node)]), set()
    while queue and len(seen) < MAX_WALK:
        value, reader = queue.popleft()
        node = graph.producer(value)
        if node is None or node in seen or graph.users(value) != [reader]:
            continue
        seen.add(node)
        norm = graph.norm(node)
        if norm is not None:
            # its statistics read elsewhere, the normalization would stay with the weight it reads
            if norm.problem_code is Code.CONSTANT_NORM and not norm.affine_only and not norm.statistics_used:
                found.append(norm)
            continue
        queue.extend((v, node) for v in graph.inputs(node))
    return found


def fold_constant_weight(graph: GraphAdapter, layer: Layer, only) -> Outcome:
    """Store the weight ``layer`` computes through a normalization of a constant as its weight."""
    out = Outcome()
    if layer.weight is None or graph.producer(layer.weight) is None:
        return out  # a stored weight
    norms = constant_norms(graph, layer)
    if not norms:
        return out
    try:
        w, channels = check_layer(graph, layer, only, "output")
        identity = Affine(torch.ones(channels, dtype=torch.float64), torch.zeros(channels, dtype=torch.float64))
        new_w, new_b = output_params(layer, w, identity)
    except (Stop, FoldError):
        return out  # the normalization stays, with its own reason (constant_norm)
    into, into_node = graph.op_label(layer.node), graph.node_name(layer.node)
    steps = [FoldStep(graph.node_name(n.node), n.op) for n in norms]  # named while still in the graph
    entries = [
        Folded(
            graph.norm_label(n),
            into,
            f"{n.op}+{layer.op}",
            "weight",
            0,
            graph.node_name(n.node),
            into_node,
            CONSTANT.name,
            steps,  # shared by the entries of one chain, not copied
            [into_node],
            kind=n.kind,
        )
        for n in norms
    ]
    label = entries[0].norm.replace(".", "_").replace("/", "_")
    extra, bias_added = write_layer(graph, layer, new_w, new_b, label)  # a Gemm's beta * C: a bias after it
    for entry in entries:
        entry.bias_added = bias_added
    entries[0].extra_bytes = extra
    out.folded.extend(entries)
    return out


CONSTANT = Rule(
    "constant", "a normalization of a constant weight (weight standardization): the stored weight", fold_constant_weight
)
