"""BatchNorm folding in the Qualcomm (QNN) to_edge pipeline, without the QNN SDK.

The models go through what ``to_edge_transform_and_lower_to_qnn`` does up to
partitioning: QNN's export pipeline, the edge program generated for a
``QnnPartitioner`` (its ops kept from decomposition), then the pass manager's
to_edge transform passes.  Assertions look at that transformed graph, before
any partitioner runs.
"""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch

pytest.importorskip("executorch.exir")
try:
    from executorch.backends.qualcomm._passes import FoldQDQ, LayoutTransform
    from executorch.backends.qualcomm._passes.qnn_pass_manager import get_qnn_pass_manager_cls
    from executorch.backends.qualcomm.partition.qnn_partitioner import QnnPartitioner
    from executorch.backends.qualcomm.utils.constants import QCOM_AXIS_ORDER, QCOM_PASS_ACTIVATE_KEY
    from executorch.backends.qualcomm.utils.utils import (
        generate_htp_compiler_spec,
        generate_qnn_executorch_compiler_spec,
        get_soc_to_chipset_map,
        qnn_edge_config,
    )
except ImportError as err:  # pragma: no cover - depends on the executorch build
    pytest.skip(f"the QNN backend's python passes are not importable: {err}", allow_module_level=True)

from et_models import build
from executorch.backends.qualcomm._passes import CanonicalizeConv, DecomposeAddmm, RemoveRedundancy
from executorch.exir.program._program import _gen_edge_manager_for_partitioners, lift_constant_tensor_pass

from bnfold.executorch import FoldBatchNormGraphPass, QnnCanonicalizeConv, qnn_pass_manager
from bnfold.torch_export.ops import node_key
from bnfold_testutil import assert_matches, norm_nodes, record_max, reference, relative_error

COMPILER_SPECS = generate_qnn_executorch_compiler_spec(
    soc_model=get_soc_to_chipset_map()["SM8650"], backend_options=generate_htp_compiler_spec(use_fp16=True)
)

QNN_MODELS = [
    "dw_conv1d_2048_k15_bias",
    "dw_conv1d_2048_k15_nobias",
    "conv2d_bn_hardtanh_mean",
    "conv_transpose2d_8_8",
    "conv_transpose2d_4_8_g2",
    "shared_bn_residual",
]


def qnn_to_edge(model, x, pm, passes_job=None, dep_table=None):
    """QNN's lowering up to (not including) partitioning; returns the transformed edge program and its passes."""
    ep = torch.export.export(model, x, strict=True)
    ep = pm.transform_for_export_pipeline(ep)
    passes = pm.get_to_edge_transform_passes(
        ep, passes_job=passes_job, dep_table=dep_table, compiler_specs=COMPILER_SPECS
    )
    manager = _gen_edge_manager_for_partitioners(
        {"forward": [QnnPartitioner(COMPILER_SPECS)]}, {"forward": ep}, qnn_edge_config(), None
    )
    manager = manager.transform(passes)
    lift_constant_tensor_pass(manager.exported_program())
    return manager.exported_program(), passes


def axis_order_mismatches(ep) -> list[str]:
    """Nodes whose QCOM_AXIS_ORDER has another rank than their value (what op_squeeze trips on)."""
    bad = []
    for n in ep.graph.nodes:
        order, val = n.meta.get(QCOM_AXIS_ORDER), n.meta.get("val")
        if order is not None and isinstance(val, torch.Tensor) and len(order) != val.dim():
            bad.append(f"{n.name}: axis order {tuple(order)} on a {val.dim()}-D tensor")
    return bad


def _names(passes):
    return [type(p).__name__ for p in passes]


@pytest.mark.parametrize("name", QNN_MODELS)
def test_qnn_to_edge_folds(name):
    model, x = build(name)
    expected = len(norm_nodes(torch.export.export(model, x)))
    ep, passes = qnn_to_edge(model, x, qnn_pass_manager())

    (fold,) = [p for p in passes if isinstance(p, FoldBatchNormGraphPass)]
    assert len(fold.report.folded) == expected and not fold.report.skipped, fold.report
    assert norm_nodes(ep) == []
    assert axis_order_mismatches(ep) == []
    if name.startswith("dw_conv1d"):  # CanonicalizeConv rewrote the conv1d around the folded get_attr weight
        ops = [node_key(n) for n in ep.graph.nodes if n.op == "call_function"]
        assert ops == ["aten::unsqueeze_copy.default", "aten::convolution.default", "aten::squeeze_copy.dims"]
        (conv,) = [n for n in ep.graph.nodes if node_key(n) == "aten::convolution.default"]
        assert conv.args[2] is not None, "the folded bias should be wired into the conv"
    ref = reference(model, *x)
    with torch.no_grad():
        out = ep.module()(*x)
    assert_matches(out, ref)
    record_max("qnn to_edge max relative error", relative_error(out, ref))


def test_qnn_linear_bn1d_through_convert_linear_to_conv2d():
    """linear + BN1d with QNN's ConvertLinearToConv2d on: it reads the folded get_attr weight."""
    from executorch.backends.qualcomm._passes import ConvertLinearToConv2d

    model, x = build("linear_bn1d")
    pm = qnn_pass_manager()
    job = pm.get_capture_program_passes()
    job[ConvertLinearToConv2d][QCOM_PASS_ACTIVATE_KEY] = True
    ep, passes = qnn_to_edge(model, x, pm, passes_job=job)
    (fold,) = [p for p in passes if isinstance(p, FoldBatchNormGraphPass)]
    assert [f.norm for f in fold.report.folded] == ["bn"]
    assert norm_nodes(ep) == []
    assert "aten::convolution.default" in [node_key(n) for n in ep.graph.nodes]
    with torch.no_grad():
        assert_matches(ep.module()(*x), reference(model, *x))


@pytest.mark.parametrize("name", ["linear_bn1d", "bn_mean_linear"])
def test_qnn_to_edge_transform_and_lower_into_a_linear(name):
    """The README's QNN call without a partitioner: linear decomposes to addmm, which QNN's
    DecomposeAddmm splits into mm + add of the folded bias, and ExpandBroadcastTensorShape reads that
    bias's shape after ExportPass re-traced it.  A folded tensor registered as a buffer got symbolic
    dims there (an unhashable SymInt); as a parameter its shape stays static.  Runs to a .pte."""
    from et_models import run_pte
    from executorch.exir import to_edge_transform_and_lower

    model, x = build(name)
    pm = qnn_pass_manager()
    ep = pm.transform_for_export_pipeline(torch.export.export(model, x, strict=True))
    passes = pm.get_to_edge_transform_passes(ep, compiler_specs=COMPILER_SPECS)
    (fold,) = [p for p in passes if isinstance(p, FoldBatchNormGraphPass)]
    edge = to_edge_transform_and_lower(ep, transform_passes=passes, compile_config=qnn_edge_config())
    expected = len(norm_nodes(torch.export.export(model, x)))
    assert len(fold.report.folded) == expected and not fold.report.skipped, fold.report
    assert norm_nodes(edge.exported_program()) == []
    if name == "bn_mean_linear":
        post = next(f for f in fold.report.folded if f.norm == "post")
        assert (post.side, post.pattern.split("+")[1]) == ("input", "mean"), post
    ref = reference(model, *x)
    assert_matches(run_pte(edge.to_executorch().buffer, x), ref)


def test_stock_qnn_pipeline_keeps_batch_norm_and_takes_the_fold_tables():
    """The control for the assertions above: QNN's own pass manager keeps the batch norm.  Handed
    qnn_pass_manager()'s tables (what to_edge_transform_and_lower_to_qnn(passes_job=..., dep_table=...)
    does with them), the same stock manager folds it."""
    model, x = build("dw_conv1d_2048_k15_bias")
    stock = get_qnn_pass_manager_cls()()
    ep, passes = qnn_to_edge(model, x, stock)
    assert not any(isinstance(p, FoldBatchNormGraphPass) for p in passes)
    assert len(norm_nodes(ep)) == 1

    ours = qnn_pass_manager()
    ep, passes = qnn_to_edge(
        model,
        x,
        stock,
        passes_job=ours.get_capture_program_passes(),
        dep_table=ours.get_passes_dependency_for_capture_program(),
    )
    assert any(isinstance(p, FoldBatchNormGraphPass) for p in passes)
    assert norm_nodes(ep) == []
    with torch.no_grad():
        assert_matches(ep.module()(*x), reference(model, *x))


def test_qnn_edge_pipeline_entry_point():
    """``transform_for_to_edge_pipeline`` builds the passes with the edge program itself.  The model, a
    dilated grouped ConvTranspose1d + BN, also takes both of QnnCanonicalizeConv's rewrites (dilation, 1-D)."""
    from executorch.exir import to_edge

    model, x = build("conv_transpose1d_dilated")
    pm = qnn_pass_manager()
    edge = to_edge(
        pm.transform_for_export_pipeline(torch.export.export(model, x, strict=True)), compile_config=qnn_edge_config()
    )
    ep = pm.transform_for_to_edge_pipeline(edge.exported_program())
    assert norm_nodes(ep) == []
    assert axis_order_mismatches(ep) == []
    (conv,) = [n for n in ep.graph.nodes if node_key(n) == "aten::convolution.default"]
    assert conv.args[5] == [1, 1] and len(conv.args[3]) == 2, "expected an undilated conv2d"
    with torch.no_grad():
        assert_matches(ep.module()(*x), reference(model, *x))


# --------------------------------------------------------------------------- ordering


def test_dependency_edges_are_explicit():
    deps = qnn_pass_manager().get_passes_dependency_for_capture_program()
    assert CanonicalizeConv not in deps and not any(CanonicalizeConv in v for v in deps.values())
    assert FoldBatchNormGraphPass in deps[QnnCanonicalizeConv]
    assert FoldQDQ in deps[QnnCanonicalizeConv]
    assert QnnCanonicalizeConv in deps[LayoutTransform]
    assert FoldBatchNormGraphPass in deps[FoldQDQ]
    assert FoldBatchNormGraphPass in deps[DecomposeAddmm]
    assert deps[FoldBatchNormGraphPass] == [RemoveRedundancy]
    # The stock table is extended, not replaced.
    stock = get_qnn_pass_manager_cls().get_passes_dependency_for_capture_program()
    for that, these in stock.items():
        that = QnnCanonicalizeConv if that is CanonicalizeConv else that
        assert all((QnnCanonicalizeConv if p is CanonicalizeConv else p) in deps[that] for p in these)


ORDERED = ("FoldBatchNormGraphPass", "QnnCanonicalizeConv", "LayoutTransform", "FoldQDQ", "DecomposeAddmm")


def _orders(pm, deps):
    """The solved pass order for every position of the fold in the passes job.

    Only the passes the checks look at are instantiated (plus ResolveDebugHandle, which QNN
    requires last); the order is solved over all of them all the same."""
    job = pm.get_capture_program_passes()
    for p, entry in job.items():
        job[p] = {**entry, QCOM_PASS_ACTIVATE_KEY: p.__name__ in ORDERED + ("ResolveDebugHandle",)}
    keys = [k for k in job if k is not FoldBatchNormGraphPass]
    ep = torch.export.export(torch.nn.Linear(2, 2), (torch.randn(1, 2),))
    for pos in range(len(keys) + 1):
        order = keys[:pos] + [FoldBatchNormGraphPass] + keys[pos:]
        passes = pm.get_to_edge_transform_passes(
            ep, passes_job=OrderedDict((k, job[k]) for k in order), dep_table={k: list(v) for k, v in deps.items()}
        )
        yield _names(passes)


def _well_ordered(names):
    fold, canon, layout = (names.index(n) for n in ("FoldBatchNormGraphPass", "QnnCanonicalizeConv", "LayoutTransform"))
    return fold < canon < layout and fold < names.index("FoldQDQ") and fold < names.index("DecomposeAddmm")


def test_order_holds_wherever_the_fold_is_listed():
    pm = qnn_pass_manager()
    default = _names(pm.get_to_edge_transform_passes(torch.export.export(torch.nn.Linear(2, 2), (torch.randn(1, 2),))))
    assert _well_ordered(default)
    assert default[-1] == "ResolveDebugHandle"
    assert all(_well_ordered(names) for names in _orders(pm, pm.get_passes_dependency_for_capture_program()))


def test_layout_edge_is_what_keeps_canonicalize_before_layout_transform():
    """With the fold after FoldQDQ (as upstream first had it) and no CanonicalizeConv -> LayoutTransform
    edge, some list positions solve CanonicalizeConv after LayoutTransform; the edge fixes all of them."""
    pm = qnn_pass_manager()

    def upstream_like(with_layout_edge):
        deps = pm.get_passes_dependency_for_capture_program()
        deps[FoldQDQ].remove(FoldBatchNormGraphPass)
        deps[FoldBatchNormGraphPass] = [FoldQDQ]
        if not with_layout_edge:
            deps[LayoutTransform].remove(QnnCanonicalizeConv)
        return deps

    def canon_before_layout(names):
        return names.index("QnnCanonicalizeConv") < names.index("LayoutTransform")

    assert not all(canon_before_layout(n) for n in _orders(pm, upstream_like(False)))
    assert all(canon_before_layout(n) for n in _orders(pm, upstream_like(True)))


def test_canonicalize_after_layout_transform_breaks_conv1d():
    """What the wrong order does to conv1d + BN: the conv2d / squeeze CanonicalizeConv creates inherit the
    rank-3 axis order LayoutTransform already wrote (op_squeeze then fails at lowering)."""
    pm = qnn_pass_manager()
    job = pm.get_capture_program_passes()
    keys = [k for k in job if k is not FoldBatchNormGraphPass] + [FoldBatchNormGraphPass]
    deps = pm.get_passes_dependency_for_capture_program()
    deps[FoldQDQ].remove(FoldBatchNormGraphPass)
    deps[FoldBatchNormGraphPass] = [FoldQDQ]
    deps[LayoutTransform].remove(QnnCanonicalizeConv)
    model, x = build("dw_conv1d_2048_k15_bias")
    ep, passes = qnn_to_edge(model, x, pm, passes_job=OrderedDict((k, job[k]) for k in keys), dep_table=deps)
    names = _names(passes)
    assert names.index("QnnCanonicalizeConv") > names.index("LayoutTransform")
    assert axis_order_mismatches(ep), "expected the wrong order to leave a rank-3 axis order on a 4-D tensor"


def test_stock_canonicalize_conv_rejects_the_get_attr_weight():
    """Why QnnCanonicalizeConv exists: the stock pass, run after the fold, cannot read a get_attr conv1d weight."""
    pm = qnn_pass_manager()
    job = OrderedDict(
        (CanonicalizeConv if p is QnnCanonicalizeConv else p, v) for p, v in pm.get_capture_program_passes().items()
    )
    deps = {
        (CanonicalizeConv if k is QnnCanonicalizeConv else k): [
            CanonicalizeConv if p is QnnCanonicalizeConv else p for p in v
        ]
        for k, v in pm.get_passes_dependency_for_capture_program().items()
    }
    model, x = build("dw_conv1d_2048_k15_nobias")
    with pytest.raises(Exception) as info:
        qnn_to_edge(model, x, pm, passes_job=job, dep_table=deps)
    chain = [info.value] + [e for e in (info.value.__cause__, getattr(info.value.__cause__, "__cause__", None)) if e]
    assert any(isinstance(e, IndexError) for e in chain), repr(info.value)
    assert "CanonicalizeConv" in str(info.value)


@pytest.mark.parametrize("backend", ["kHtpBackend", "kGpuBackend", "kLpaiBackend"])
def test_every_backend_pass_manager_gets_the_fold(backend):
    from executorch.backends.qualcomm.serialization.qc_schema import QnnExecuTorchBackendType

    backend_type = getattr(QnnExecuTorchBackendType, backend)
    pm = qnn_pass_manager(backend_type)
    assert isinstance(pm, get_qnn_pass_manager_cls(backend_type))
    passes = pm.get_to_edge_transform_passes(torch.export.export(torch.nn.Linear(2, 2), (torch.randn(1, 2),)))
    names = _names(passes)
    assert "CanonicalizeConv" not in names
    assert _well_ordered(names), names


class _PreActivation(torch.nn.Module):
    """DenseNet-style: BN -> ReLU -> conv (the BN cannot fold), then conv -> BN (folds)."""

    def __init__(self):
        super().__init__()
        self.bn1, self.conv1 = torch.nn.BatchNorm2d(4), torch.nn.Conv2d(4, 6, 3, padding=1)
        self.bn2 = torch.nn.BatchNorm2d(6)

    def forward(self, x):
        return self.bn2(self.conv1(torch.relu(self.bn1(x))))


@pytest.mark.parametrize("lower", [True, False])
def test_qnn_lowers_what_cannot_fold_by_default(lower):
    from bnfold_testutil import randomize_bn

    model = randomize_bn(_PreActivation(), var=(1e-7, 2.0)).eval()
    x = (torch.randn(2, 4, 8, 8),)
    pm = qnn_pass_manager() if lower else qnn_pass_manager(lower_unfoldable=False)
    ep, passes = qnn_to_edge(model, x, pm)
    (fold,) = [p for p in passes if isinstance(p, FoldBatchNormGraphPass)]
    assert [f.norm for f in fold.report.folded] == ["bn2"]
    if lower:
        assert [x.norm for x in fold.report.lowered] == ["bn1"] and not fold.report.skipped
        assert norm_nodes(ep) == []  # the QNN builder never sees a batch norm (nor its own eps)
    else:
        assert [s.norm for s in fold.report.skipped] == ["bn1"] and len(norm_nodes(ep)) == 1
    out = ep.module()(*x)
    assert_matches(out, reference(model, *x))
