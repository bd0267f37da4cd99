"""The fold engine, format-neutral: chains, composition, checks, retry policy, report entries.

``fold_graph(adapter, only)`` folds a graph in place through its adapter
(:class:`GraphAdapter`); the frontends (``bnfold.torch_export``,
``bnfold.onnx``) each provide one adapter per graph kind.
"""

from .driver import RULES, fold_graph
from .graph import Binary, GraphAdapter, Hop, Layer, LayerWeights, Norm, ShapeInfo, Step

__all__ = ["fold_graph", "RULES", "GraphAdapter", "Layer", "LayerWeights", "Norm", "Binary", "Hop", "ShapeInfo", "Step"]
