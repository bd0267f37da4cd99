"""bnfold.audit: the fold/skip column, layer matching, end-to-end numbers, outputs."""

import copy
import json
import operator

import pytest
import torch
from numerics_helpers import HopInChain, NormChain, ScaledByMatmul, TokenLinearNorm, export, mixed, small_net

import bnfold
from bnfold.numerics import Emulator, audit


def _bn_nodes(ep):
    return {n.name for n in ep.graph.nodes if n.op == "call_function" and "batch_norm" in str(n.target)}


@pytest.mark.parametrize("ir", ["default", "decomposed"])
def test_fold_column_agrees_with_fold_report(ir):
    net = mixed()
    x = torch.randn(4, 3, 8, 8) + 2
    ep = export(net, x, ir=ir)
    rep = audit(ep, [(x,)], profile="fp16")
    report = bnfold.fold(ep).report
    by_node = {n.node: n for n in rep.norms}
    assert set(by_node) == _bn_nodes(ep)
    assert report.folded and report.skipped  # both kinds are exercised
    assert {f.node for f in report.folded} | {s.node for s in report.skipped} == set(by_node)
    for f in report.folded:
        assert by_node[f.node].folded and f.into in by_node[f.node].fold
    for s in report.skipped:
        assert not by_node[s.node].folded and s.reason in by_node[s.node].fold
    table = rep.table()
    for n in rep.norms:
        assert n.name in table


def test_layers_are_matched_to_the_same_tensor():
    net = mixed()
    x = torch.randn(4, 3, 8, 8) + 2
    ep = export(net, x)
    rep = audit(ep, [(x,)], profile="fp32")
    folded_norms = {n.node for n in rep.norms if n.folded}
    layers = [r for r in rep.layers if r.kind != "batch_norm"]
    assert len(layers) == 4  # conv1, conv2, conv3, fc
    for r in layers:
        assert r.folded is not None
        # the same function in both programs: the same reference values (up to the folded weights'
        # float32 rounding), which also proves the rows point at corresponding tensors
        a, b = r.unfolded.max_abs_ref, r.folded.max_abs_ref
        assert abs(a - b) <= 1e-5 * max(a, b), r.name
    standalone = {r.norm: r for r in rep.layers if r.kind == "batch_norm"}
    for node, r in standalone.items():
        assert (r.folded is None) == (node in folded_norms)  # a norm folded into its consumer has no tensor left


def _assert_same_tensor(row):
    """The row's unfolded and folded errors were measured on the same tensor: the same shape and
    the same float64 reference values (up to the folded weights' float32 rounding)."""
    a, b = row.unfolded, row.folded
    assert a.shape == b.shape, (row.name, a.node, b.node)
    assert abs(a.max_abs_ref - b.max_abs_ref) <= 1e-5 * max(a.max_abs_ref, b.max_abs_ref), (row.name, a.node, b.node)


def _only(ep, target):
    (node,) = ep.graph.find_nodes(op="call_function", target=target)
    return node


def _normalized(node):
    """The node holding a batch norm's result: its getitem(0) in the decomposed IR, else itself."""
    return next((u for u in node.users if u.target is operator.getitem and u.args[1] == 0), node)


def test_rows_pair_by_node_name_when_the_fold_removes_a_layer_like_node():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    ep = export(ScaledByMatmul(), x)
    folded_nodes = {n.name for n in bnfold.fold(ep).model.graph.nodes}
    rep = audit(ep, [(x,)], profile="fp32")
    # a @ b of two constants: a plain matmul, or a linear layer since the frontend reads aten.matmul by a
    # constant 2-D weight as one; either way a layer-like row
    assert [r.kind for r in rep.layers][1:] == ["conv", "linear"] and rep.layers[0].kind in ("matmul", "linear")
    matmul, conv, fc = rep.layers
    # the fold computed a @ b ahead of time: the matmul is gone, and so is its row's counterpart
    assert matmul.name not in folded_nodes and matmul.folded is None
    # the conv row measures conv * (a @ b), which the folded conv computes under its own name
    assert conv.unfolded.node == _only(ep, torch.ops.aten.mul.Tensor).name
    assert conv.folded.node == conv.name and fc.folded.node == fc.name
    for row in (conv, fc):
        _assert_same_tensor(row)


@pytest.mark.parametrize("ir", ["default", "decomposed"])
@pytest.mark.parametrize(
    "model, shape, holder",
    [
        (NormChain, (3, 8, 8), "layer"),
        (HopInChain, (3, 8), torch.ops.aten.unsqueeze.default),  # the hop the fold keeps holds the result
        (TokenLinearNorm, (8, 5), None),  # a flatten, or the bias add the fold inserts, holds it
    ],
)
def test_a_folded_layer_row_measures_where_its_chain_ends(model, shape, holder, ir):
    torch.manual_seed(0)
    x = torch.randn(2, *shape)
    ep = export(model(), x, ir=ir)
    report = bnfold.fold(ep).report
    rep = audit(ep, [(x,)], profile="fp32")
    (row,) = rep.layers  # every norm went into the layer: none has a row of its own
    assert {getattr(f, "into_node", "") or f.into for f in report.folded} == {row.name}
    last_norm = [n for n in ep.graph.nodes if n.name in {f.node for f in report.folded}][-1]
    assert row.unfolded.node == _normalized(last_norm).name  # the chain's result in the unfolded program
    assert row.folded is not None
    if holder == "layer":
        assert row.folded.node == row.name
    elif holder is not None:
        assert row.folded.node == _only(ep, holder).name
    _assert_same_tensor(row)


def test_end_to_end_agreement_and_accuracy():
    net = small_net()
    torch.manual_seed(3)
    xs = [(torch.randn(16, 3, 8, 8),), (torch.randn(16, 3, 8, 8),)]
    ep = export(net, xs[0][0])
    with torch.no_grad():
        fp32_pred = torch.cat([net(*b).argmax(1) for b in xs])
    labels = fp32_pred.clone()
    labels[::3] = (labels[::3] + 1) % 5
    rep = audit(ep, xs, profile="fp16-acc", labels=labels)
    emu = Emulator(ep, "fp16-acc")
    pred = torch.cat([emu.run(*b, reference=False).outputs[0].argmax(1) for b in xs])
    assert rep.unfolded.top1_agreement == pytest.approx((pred == fp32_pred).double().mean().item())
    assert rep.unfolded.accuracy == pytest.approx((pred == labels).double().mean().item())
    assert rep.fp32_accuracy == pytest.approx((fp32_pred == labels).double().mean().item())
    r32 = audit(ep, xs, profile="fp32", labels=labels)
    assert r32.unfolded.top1_agreement == 1.0 and r32.folded.top1_agreement == 1.0
    assert r32.unfolded.output.sqnr_db > 100  # float32 against float64


def test_bn_eps_reaches_unfolded_runs_only():
    net = small_net()
    x = torch.randn(8, 3, 8, 8)
    ep = export(net, x)
    with torch.no_grad():  # a dead channel: variance 0
        ep.state_dict["bn2.running_var"][0] = 0.0
    plain = audit(ep, [(x,)], profile="htp")
    override = audit(ep, [(x,)], profile="htp", bn_eps=1e-9)
    assert all(n.folded for n in plain.norms)
    assert override.folded.output.sqnr_db == plain.folded.output.sqnr_db  # no BatchNorm left to misread eps
    assert override.unfolded.output.sqnr_db != plain.unfolded.output.sqnr_db
    (bn2,) = [n for n in override.norms if n.name == "bn2"]
    assert bn2.runtime_scale_max == pytest.approx(bn2.scale_max * (1e-5 / 1e-9) ** 0.5, rel=1e-3)


def test_module_input_progress_and_outputs(tmp_path):
    net = small_net()
    before = copy.deepcopy(net.state_dict())
    net.train()
    batches = [(torch.randn(n, 3, 8, 8),) for n in (3, 5)]  # different sizes: exported with a dynamic batch
    calls = []
    rep = bnfold.audit(net, batches, profile="htp", progress=lambda d, t: calls.append((d, t)))
    assert calls == [(1, 2), (2, 2), (1, 2), (2, 2)]  # per stage: the 2 batches unfolded, then folded
    assert net.training  # the caller's mode is restored
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert rep.samples == 8 and rep.batches == 2
    doc = json.loads(json.dumps(rep.to_dict(), allow_nan=False))
    assert doc["profile"] == "htp" and len(doc["layers"]) == len(rep.layers)
    assert {n["node"] for n in doc["normalizations"]} == {n.node for n in rep.norms}
    png = tmp_path / "chart.png"
    rep.plot(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
