"""The ONNX fold as an onnx-ir pass: ``FoldNormalizationPass`` composes with other ``onnx_ir`` passes
(``onnx_ir.passes.Sequential``, ``PassManager``).

It is a ``FunctionalPass``: it returns a new ``onnx_ir.Model`` and never changes the one it is given
(onnx-ir checks the declared ``in_place`` / ``changes_input`` on every call).  The fold itself is
:func:`bnfold.onnx.fold_onnx`, on the model's proto; ``pass_.report`` holds the last call's
:class:`~bnfold.report.FoldReport`.  Needs ``onnx_ir`` (installed with onnxscript).
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx_ir as ir
from onnx_ir.passes import FunctionalPass, PassResult

from ..kinds import check_exclude, check_only
from ..report import FoldReport
from .fold import fold_onnx


class FoldNormalizationPass(FunctionalPass):
    """Fold BatchNormalization and per-channel affines into Conv / ConvTranspose / Gemm / MatMul.

    ``only``, ``exclude`` and ``lower_unfoldable`` as for :func:`bnfold.fold` (validated here).
    ``modified`` is True when something was folded or lowered.
    """

    def __init__(
        self,
        only: str | Iterable[str] | None = None,
        exclude: str | Iterable[str] | None = None,
        lower_unfoldable: bool = False,
    ):
        super().__init__()
        self.only = check_only(only)
        self.exclude = check_exclude(exclude)
        self.lower_unfoldable = lower_unfoldable
        self.report: FoldReport | None = None

    def call(self, model: ir.Model) -> PassResult:
        result = fold_onnx(
            ir.to_proto(model), only=self.only, exclude=self.exclude, lower_unfoldable=self.lower_unfoldable
        )
        self.report = result.report
        return PassResult(ir.from_proto(result.model), bool(result.report.folded or result.report.lowered))
