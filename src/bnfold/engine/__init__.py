"""The fold engine, format-neutral: chains, composition, checks, retry policy, edits, report entries.

``fold_graph(adapter, only, exclude)`` folds a graph in place through its adapter
(:class:`GraphAdapter`); the frontends (``bnfold.torch_export``,
``bnfold.onnx``) each provide one adapter per graph kind.  The adapter answers
questions and makes primitive edits; which edits a fold makes is decided here
(``edit.py``); the rules are data (``rule.Rule``: a name, what it folds, its function), run in
the order of ``RULES``; ``reparam.py`` merges summed conv branches into one conv.
"""

from .driver import RULES, fold_graph
from .edit import broadcast_shape, remove_chain
from .graph import Binary, ChainStep, ConvGeometry, GraphAdapter, Hop, Layer, LayerWeights, Norm, Pool, ShapeInfo
from .rule import Rule

__all__ = [
    "fold_graph",
    "RULES",
    "Rule",
    "GraphAdapter",
    "Layer",
    "LayerWeights",
    "Norm",
    "Binary",
    "Hop",
    "ShapeInfo",
    "ChainStep",
    "ConvGeometry",
    "Pool",
    "broadcast_shape",
    "remove_chain",
]
