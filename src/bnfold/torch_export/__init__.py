"""The torch.export frontend: ATen IRs and the ExecuTorch edge dialect."""

from .fold import fold_program

__all__ = ["fold_program"]
