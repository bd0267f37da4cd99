"""The torch.export frontend: ATen IRs, the ExecuTorch edge dialect, and bare GraphModules.

``ops.py`` is the op table, ``graph.py`` the engine's adapter, ``program.py`` /
``graph_module.py`` the tensor editors for a program and a GraphModule.
"""

from .fold import fold_graph_module, fold_program
from .ops import parse_layer, parse_norm

__all__ = ["fold_program", "fold_graph_module", "parse_layer", "parse_norm"]
