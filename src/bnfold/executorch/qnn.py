"""BatchNorm folding in the Qualcomm (QNN) to_edge pipeline.

``qnn_pass_manager()`` returns the backend's ``QnnPassManager`` (HTP by
default) extended so that its to_edge transform passes fold BatchNorm:

* ``FoldBatchNormGraphPass`` (the bnfold program fold, registering fused
  tensors with ``register_buffer`` + ``graph.get_attr`` like the QNN passes) is
  added to the capture-program passes, right before ``CanonicalizeConv``;
* ``CanonicalizeConv`` is replaced by ``QnnCanonicalizeConv``, which also
  accepts a conv weight held by a ``get_attr`` node;
* the ordering is stated as dependency edges: the fold after
  ``RemoveRedundancy`` and before ``FoldQDQ`` (in a quantized graph a weight
  is then still behind its dequantize node, which the fold does not treat as
  a constant, so it never folds into a quantized weight whose encodings
  ``FoldQDQ`` is about to record; PTQ's ``prepare_pt2e`` folds those pairs
  itself), ``DecomposeAddmm`` (a fold into ``mm`` produces ``addmm``),
  ``AnnotateGetAttr`` (the fold creates ``get_attr`` nodes),
  ``ConvertLinearToConv2d`` and ``CanonicalizeConv``; and ``CanonicalizeConv``
  before ``LayoutTransform``.  The last edge is what the stock table gets
  right only by list order: once ``CanonicalizeConv`` has one more dependency
  the solver places it after ``LayoutTransform``, and the conv2d / squeeze it
  creates for a conv1d inherit a rank-3 ``QCOM_AXIS_ORDER``.

Nothing in the installed executorch package is modified.  The QNN SDK is not
needed for the to_edge transform passes.
"""

from __future__ import annotations

import functools
from typing import cast

import torch
from executorch.backends.qualcomm._passes import (
    AnnotateGetAttr,
    CanonicalizeConv,
    ConvertLinearToConv2d,
    DecomposeAddmm,
    FoldQDQ,
    LayoutTransform,
    RemoveRedundancy,
)
from executorch.backends.qualcomm._passes.canonicalize_conv import ConvParamIdx
from executorch.backends.qualcomm._passes.qnn_pass_manager import QnnPassManager, get_qnn_pass_manager_cls
from executorch.backends.qualcomm.builders.utils import get_parameter
from executorch.backends.qualcomm.utils.constants import QCOM_PASS_ARGS_KWARGS_DEFAULTS_KEY
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.pass_base import PassResult
from executorch.exir.passes import dead_code_elimination_pass
from torch._guards import detect_fake_mode

from ..kinds import check_exclude, check_only
from .passes import FoldBatchNormGraphPass

__all__ = ["QnnCanonicalizeConv", "qnn_pass_manager", "FOLD_DEPENDENCIES"]


class QnnCanonicalizeConv(CanonicalizeConv):
    """``CanonicalizeConv`` that also accepts a weight held by a ``get_attr`` node.

    The stock pass reads a conv1d / dilated transposed conv filter from a
    placeholder (float graph) or from the input of a dequantize node (QDQ
    graph) and raises ``IndexError`` on a ``get_attr`` weight, which is how a
    pass in this pipeline registers a new tensor.  Convolutions with a
    ``get_attr`` weight are rewritten here exactly as the stock pass rewrites
    a placeholder weight (same dilation, unsqueeze and conv1d -> conv2d
    rewrite, using its helpers); every other convolution is left to it.
    """

    def call(self, graph_module: torch.fx.GraphModule):
        graph = graph_module.graph
        changed = False
        for node in list(graph.nodes):
            if node.target is not exir_ops.edge.aten.convolution.default:
                continue
            weight = node.args[ConvParamIdx.WEIGHT]
            if not (isinstance(weight, torch.fx.Node) and weight.op == "get_attr"):
                continue
            stride = cast(tuple[int], node.args[ConvParamIdx.STRIDE])
            dilation = cast(tuple[int], node.args[ConvParamIdx.DILATION])
            is_1d_op = len(stride) == 1
            has_conv_transpose_dilation = node.args[ConvParamIdx.TRANSPOSED] and any(d != 1 for d in dilation)
            if not (is_1d_op or has_conv_transpose_dilation):
                continue
            filter_tensor = get_parameter(weight, self.edge_program).contiguous().detach()
            if has_conv_transpose_dilation:
                filter_tensor = self._dilate(filter_tensor, dilation)
                node.args = (
                    *node.args[: ConvParamIdx.DILATION],
                    [1] * len(dilation),
                    *node.args[ConvParamIdx.TRANSPOSED :],
                )
            if is_1d_op:
                filter_tensor = filter_tensor.unsqueeze(2)
            buffer_name = _free_attr_name(graph_module, node.name)
            graph_module.register_buffer(buffer_name, filter_tensor)
            with graph.inserting_after(weight):
                get_attr_node = graph.get_attr(buffer_name)
            fake_mode = detect_fake_mode(weight.meta["val"])
            get_attr_node.meta["val"] = fake_mode.fake_tensor_converter.from_real_tensor(fake_mode, filter_tensor)
            node.replace_input_with(weight, get_attr_node)
            if is_1d_op:
                self._replace_1d_conv(graph_module, node, node.args[ConvParamIdx.INPUT])
            changed = True
        if changed:
            # The replaced conv1d nodes are dead now; drop them before the stock pass walks the graph.
            dead_code_elimination_pass(graph_module)
        result = super().call(graph_module)
        return PassResult(result.graph_module, result.modified or changed)


def _free_attr_name(module: torch.nn.Module, prefix: str) -> str:
    prefix = prefix.replace(".", "_")
    i = 0
    while hasattr(module, f"{prefix}{i}"):
        i += 1
    return f"{prefix}{i}"


#: The edges added to the QNN dependency table: pass -> passes that must run before it.
FOLD_DEPENDENCIES = {
    FoldBatchNormGraphPass: [RemoveRedundancy],
    FoldQDQ: [FoldBatchNormGraphPass],
    DecomposeAddmm: [FoldBatchNormGraphPass],
    AnnotateGetAttr: [FoldBatchNormGraphPass],
    ConvertLinearToConv2d: [FoldBatchNormGraphPass],
    QnnCanonicalizeConv: [FoldBatchNormGraphPass],
    LayoutTransform: [QnnCanonicalizeConv],
}


def _swap(p):
    return QnnCanonicalizeConv if p is CanonicalizeConv else p


class _FoldBatchNormMixin:
    """Adds the fold to a ``QnnPassManager`` subclass's capture-program passes.

    ``lower_unfoldable``: the fold pass also rewrites each batch norm it cannot
    fold as ``mul`` + ``add`` by constants computed with the model's eps, so
    QNN's batch-norm builder (which uses eps 1e-9) never sees one.
    """

    lower_unfoldable = True
    only: frozenset | None = None
    exclude: tuple = ()

    @classmethod
    def get_capture_program_passes(cls):
        passes = super().get_capture_program_passes()
        kwargs = passes[FoldBatchNormGraphPass][QCOM_PASS_ARGS_KWARGS_DEFAULTS_KEY]
        kwargs["lower_unfoldable"] = cls.lower_unfoldable
        if cls.only is not None:
            kwargs["only"] = cls.only
        if cls.exclude:
            kwargs["exclude"] = cls.exclude
        return passes

    @classmethod
    def get_default_pass_activations(cls):
        activations = []
        for p, active in super().get_default_pass_activations():
            if p is CanonicalizeConv:
                activations.append((FoldBatchNormGraphPass, True))
            activations.append((_swap(p), active))
        if not any(p is FoldBatchNormGraphPass for p, _ in activations):
            raise RuntimeError("bnfold: this QnnPassManager has no CanonicalizeConv pass to fold before")
        return activations

    @classmethod
    def get_passes_dependency_for_capture_program(cls):
        table = {
            _swap(k): [_swap(p) for p in v] for k, v in super().get_passes_dependency_for_capture_program().items()
        }
        for that, these in FOLD_DEPENDENCIES.items():
            deps = table.setdefault(that, [])
            deps.extend(p for p in these if p not in deps)
        return table


@functools.cache
def _fold_cls(base: type, lower_unfoldable: bool, only: frozenset | None = None, exclude: tuple = ()) -> type:
    return type(
        f"Fold{base.__name__}",
        (_FoldBatchNormMixin, base),
        {"__module__": __name__, "lower_unfoldable": lower_unfoldable, "only": only, "exclude": exclude},
    )


def qnn_pass_manager(backend_type=None, lower_unfoldable: bool = True, *, only=None, exclude=None) -> QnnPassManager:
    """A ``QnnPassManager`` for ``backend_type`` (a ``QnnExecuTorchBackendType``,
    HTP by default) whose to_edge transform passes fold BatchNorm.

    ``lower_unfoldable`` (default True) also rewrites every batch norm that
    cannot fold (a pre-activation BN before a ReLU) as ``mul`` + ``add`` by
    constants computed in float64 with the model's eps: QNN's batch-norm
    builder would otherwise recompute it with eps 1e-9.  Measured on a
    DenseNet-121-shaped network (``benchmarks/lowering.py``): under the ``htp``
    profile at eps 1e-9 the lowered model matches its ``fp16`` emulation,
    while the BNs left as BNs lose SQNR (see BENCHMARKS.md, part F).
    ``only`` / ``exclude`` as for ``bnfold.fold`` (validated here).

    Use it where QNN's own pass manager is used::

        pm = qnn_pass_manager()
        ep = pm.transform_for_export_pipeline(ep)
        passes = pm.get_to_edge_transform_passes(ep, compiler_specs=compiler_specs)
        edge = to_edge_transform_and_lower(ep, transform_passes=passes, partitioner=[QnnPartitioner(compiler_specs)])

    or hand its tables to ``to_edge_transform_and_lower_to_qnn(...,
    passes_job=pm.get_capture_program_passes(),
    dep_table=pm.get_passes_dependency_for_capture_program())``.
    """
    base = get_qnn_pass_manager_cls() if backend_type is None else get_qnn_pass_manager_cls(backend_type)
    return _fold_cls(base, lower_unfoldable, check_only(only), check_exclude(exclude))()
