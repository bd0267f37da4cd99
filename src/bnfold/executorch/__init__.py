"""bnfold for ExecuTorch: a fold pass for edge programs and a QNN pass manager that folds.

``FoldBatchNormPass`` is an ``ExportedProgramPassBase``::

    from bnfold.executorch import FoldBatchNormPass
    fold = FoldBatchNormPass()
    edge = to_edge_transform_and_lower(ep, transform_passes=[fold], partitioner=[XnnpackPartitioner()])
    print(fold.report)

``qnn_pass_manager()`` returns a Qualcomm ``QnnPassManager`` whose to_edge
transform passes fold BatchNorm before ``CanonicalizeConv`` (imported lazily:
the QNN backend pulls in torchao).
"""

from .passes import FoldBatchNormGraphPass, FoldBatchNormPass

_QNN_NAMES = ("qnn_pass_manager", "QnnCanonicalizeConv")

__all__ = ["FoldBatchNormPass", "FoldBatchNormGraphPass", *_QNN_NAMES]


def __getattr__(name):
    if name in _QNN_NAMES:
        from . import qnn

        return getattr(qnn, name)
    raise AttributeError(f"module 'bnfold.executorch' has no attribute {name!r}")
