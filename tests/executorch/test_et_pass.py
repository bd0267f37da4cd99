"""``FoldBatchNormPass`` / ``FoldBatchNormGraphPass`` inside ExecuTorch's pass pipelines."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

pytest.importorskip("executorch.exir")

from et_models import ConvBn, build, prepared, run_pte
from executorch.exir import to_edge, to_edge_transform_and_lower
from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult, ExportPass, PassResult
from executorch.exir.pass_manager import ExportedProgramPassManager
from torch._export.utils import get_buffer, get_lifted_tensor_constant, get_param
from torch.export.graph_signature import InputKind

from bnfold.executorch import FoldBatchNormGraphPass, FoldBatchNormPass
from bnfold.report import Code
from bnfold_testutil import assert_matches, norm_nodes, reference, run


class Probe(ExportedProgramPassBase):
    """A later pass: resolves every tensor input through the program it is handed."""

    def __init__(self):
        self.tensors = None
        self.norms = None

    def call(self, ep):
        self.norms = len(norm_nodes(ep))
        self.tensors = {}
        for spec in ep.graph_signature.input_specs:
            node = next(n for n in ep.graph.nodes if n.op == "placeholder" and n.name == spec.arg.name)
            value = (
                get_param(ep, node)
                if spec.kind == InputKind.PARAMETER
                else get_buffer(ep, node)
                if spec.kind == InputKind.BUFFER
                else get_lifted_tensor_constant(ep, node)
                if spec.kind == InputKind.CONSTANT_TENSOR
                else None
            )
            if spec.kind != InputKind.USER_INPUT:
                assert value is not None, f"a later pass cannot resolve {spec.arg.name} ({spec.target})"
                self.tensors[spec.arg.name] = (spec.kind, spec.target, value)
        return ExportedProgramPassResult(ep, False)


def _conv_no_bias():
    model = prepared(ConvBn(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8)))
    return model, (torch.randn(1, 3, 10, 10),)


def test_transform_registers_fused_tensors_as_placeholders():
    model, x = _conv_no_bias()
    edge = to_edge(torch.export.export(model, x))
    weight_before = edge.exported_program().state_dict["conv.weight"].clone()
    fold, probe = FoldBatchNormPass(), Probe()

    folded = edge.transform([fold, probe])

    assert [f.norm for f in fold.report.folded] == ["bn"] and not fold.report.skipped
    assert probe.norms == 0
    # A conv without bias gains `conv.bias`, a parameter named like export names it.
    assert probe.tensors["p_conv_bias"][:2] == (InputKind.PARAMETER, "conv.bias")
    assert probe.tensors["p_conv_weight"][:2] == (InputKind.PARAMETER, "conv.weight")
    assert not any(t.startswith("bn.") for _, t, _ in probe.tensors.values())
    ep = folded.exported_program()
    assert set(ep.state_dict) == {"conv.weight", "conv.bias"}
    assert_matches(run(ep, *x), reference(model, *x))
    # The manager's own program is untouched.
    assert len(norm_nodes(edge.exported_program())) == 1
    assert torch.equal(edge.exported_program().state_dict["conv.weight"], weight_before)
    # And the program serializes and runs.
    assert_matches(run_pte(folded.to_executorch().buffer, x), reference(model, *x))


def test_pass_manager_runs_it_as_an_exported_program_pass():
    model, x = build("conv1d")
    fold = FoldBatchNormPass()
    manager = ExportedProgramPassManager([fold])
    assert manager.passes == [fold], "ExportedProgramPassManager should keep the pass unwrapped"
    result = manager(to_edge(torch.export.export(model, x)).exported_program())
    assert result.modified
    assert norm_nodes(result.exported_program) == []
    assert_matches(run(result.exported_program, *x), reference(model, *x))


def test_nothing_to_fold_reports_and_leaves_program():
    model = prepared(nn.Sequential(nn.ReLU(), nn.BatchNorm2d(3)))
    x = (torch.randn(1, 3, 4, 4),)
    ep = to_edge(torch.export.export(model, x)).exported_program()
    fold = FoldBatchNormPass()
    result = fold(ep)
    assert not result.modified and result.exported_program is ep
    assert not fold.report.folded and len(fold.report.skipped) == 1
    assert fold.report.skipped[0].code == Code.NO_LAYER


def test_report_is_the_last_run():
    fold = FoldBatchNormPass()
    for name, n in (("conv1d", 1), ("mbconv", 3)):
        model, x = build(name)
        fold(torch.export.export(model, x))
        assert len(fold.report.folded) == n


def test_only_is_checked():
    with pytest.raises(ValueError, match="unknown kind"):
        FoldBatchNormPass(only={"convolution"})
    model, x = build("linear_bn1d")
    fold = FoldBatchNormPass(only={"conv"})
    result = fold(to_edge(torch.export.export(model, x)).exported_program())
    assert not result.modified and not fold.report.folded


def test_exclude_on_both_passes_and_fold_graph_module():
    from bnfold.torch_export import fold_graph_module

    with pytest.raises(TypeError):
        FoldBatchNormPass(exclude=[3])
    model, x = _conv_no_bias()
    ep = torch.export.export(model, x)
    fold = FoldBatchNormPass(exclude="bn")
    assert not fold(ep).modified and [s.code for s in fold.report.skipped] == [Code.EXCLUDED]
    graph_pass = FoldBatchNormGraphPass(ep, exclude=["co*"])
    gm = ep.module()
    assert not graph_pass(gm).modified and [s.code for s in graph_pass.report.skipped] == [Code.EXCLUDED]
    report = fold_graph_module(ep.module(), ep, exclude="bn")
    assert not report.folded and [s.code for s in report.skipped] == [Code.EXCLUDED]
    with pytest.raises(ValueError, match="unknown kind"):
        fold_graph_module(ep.module(), ep, only="convolution")


# --------------------------------------------------------------------------- the GraphModule variant


def _placeholders(gm):
    return [n.name for n in gm.graph.nodes if n.op == "placeholder"]


def test_graph_pass_keeps_placeholders_and_lowers():
    """QNN style: built with the ATen program, called on the edge graph module, edits it in place."""
    model, x = _conv_no_bias()
    aten = torch.export.export(model, x)
    fold = FoldBatchNormGraphPass(aten)
    seen = {}

    def snapshot(gm):
        seen["placeholders"] = _placeholders(gm)
        seen["get_attr"] = [n.target for n in gm.graph.nodes if n.op == "get_attr"]
        seen["norms"] = sum("batch_norm" in str(n.target) for n in gm.graph.nodes)
        return PassResult(gm, False)

    edge = to_edge_transform_and_lower(aten, transform_passes=[fold, snapshot])

    assert [f.norm for f in fold.report.folded] == ["bn"]
    assert seen["norms"] == 0
    assert seen["placeholders"] == _placeholders(aten.graph_module), "a GraphModule pass must keep placeholders"
    assert len(seen["get_attr"]) == 2  # the fused weight and the new bias
    ep = edge.exported_program()
    assert not any(n.op == "get_attr" for n in ep.graph.nodes), "to_edge_transform_and_lower lifts them"
    assert_matches(run(ep, *x), reference(model, *x))
    assert_matches(run_pte(edge.to_executorch().buffer, x), reference(model, *x))
    # The ATen program it was built with is untouched.
    assert len(norm_nodes(aten)) == 1


class _WeightToGetAttr(ExportPass):
    """Moves conv weights into get_attr buffers, as CanonicalizeConv does."""

    def __init__(self, edge_program):
        super().__init__()
        self.edge_program = edge_program

    def call(self, gm):
        for node in list(gm.graph.nodes):
            if "convolution" in str(node.target) and node.args[1].op == "placeholder":
                w = node.args[1]
                name = f"{w.name}_moved"
                gm.register_buffer(name, get_param(self.edge_program, w).detach().clone())
                with gm.graph.inserting_after(w):
                    ga = gm.graph.get_attr(name)
                ga.meta = dict(w.meta)
                node.replace_input_with(w, ga)
        gm.recompile()
        return PassResult(gm, True)


def test_graph_pass_folds_into_get_attr_weights():
    model, x = build("conv2d_depthwise")
    aten = torch.export.export(model, x)
    fold = FoldBatchNormGraphPass(aten)
    edge = to_edge_transform_and_lower(aten, transform_passes=[_WeightToGetAttr(aten), fold])
    assert [f.norm for f in fold.report.folded] == ["bn"]
    assert norm_nodes(edge.exported_program()) == []
    assert_matches(run(edge.exported_program(), *x), reference(model, *x))


def test_graph_pass_dynamic_batch():
    """The program view takes its range constraints from the graph it is called on."""
    model, x = build("conv1d")
    aten = torch.export.export(model, x, dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=8)},))
    fold = FoldBatchNormGraphPass(aten)
    edge = to_edge_transform_and_lower(aten, transform_passes=[fold])
    assert len(fold.report.folded) == 1
    assert norm_nodes(edge.exported_program()) == []
    x5 = (torch.randn(5, 4, 32),)
    assert_matches(run(edge.exported_program(), *x5), reference(model, *x5))
