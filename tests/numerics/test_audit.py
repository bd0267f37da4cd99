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
    assert calls == [(1, 2), (2, 2)]  # each batch once it ran unfolded and folded (one stage: batch by batch)
    assert net.training  # the caller's mode is restored
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert rep.samples == 8 and rep.batches == 2
    doc = json.loads(json.dumps(rep.to_dict(), allow_nan=False))
    assert doc["profile"] == "htp" and len(doc["layers"]) == len(rep.layers)
    assert {n["node"] for n in doc["normalizations"]} == {n.node for n in rep.norms}
    png = tmp_path / "chart.png"
    rep.plot(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_output_sqnr_comes_with_its_spread_over_batches():
    """The end-to-end SQNR over all batches lies between the per-batch SQNRs (signal and noise are summed),
    and the table prints it with their standard deviation; one batch has no spread."""
    import math
    import statistics

    net = small_net()
    torch.manual_seed(3)
    batches = [(torch.randn(2, 3, 8, 8) * 2,) for _ in range(4)]
    rep = audit(net, batches, profile="fp16")
    for e2e in (rep.unfolded, rep.folded):
        per = e2e.batch_sqnr_db
        assert len(per) == 4 and min(per) <= e2e.output.sqnr_db <= max(per)
        assert e2e.sqnr_spread_db == pytest.approx(statistics.stdev(per)) and e2e.sqnr_spread_db > 0
        assert e2e.to_dict()["batch_output_sqnr_db"] == pytest.approx(per)
    spread = f"{max(rep.unfolded.sqnr_spread_db, 0.1):.1f}"
    assert f"{rep.unfolded.output.sqnr_db:.1f} ± {spread}" in rep.table()
    one = audit(net, batches[:1], profile="fp16")
    assert math.isnan(one.unfolded.sqnr_spread_db) and "±" not in one.table()


def test_the_worst_norm_does_not_move_with_the_measured_tenths():
    """Two safe norms whose losses tie to within the measurement's noise (PP-OCRv6 rec under fp16: predicted
    1.46 | measured 1.35 against predicted 1.31 | measured 1.47 on one CPU, 1.46 | 1.18 against 1.31 | 1.41 on
    its AVX2 path): the predicted loss, the same on every CPU, decides; a worse verdict comes first."""
    from bnfold.numerics.audit_report import NormAudit, norm_severity
    from bnfold.numerics.risk import EpsRisk, Measured, Risk

    def norm(name, pred, meas, verdict="safe"):
        eps = EpsRisk(1e-5, 1.0, 1.0, 0, {}, 1e3, 50.0, 50.0 + pred)
        risk = Risk(eps, None, None, Measured({}, {}, 1e3, 1e3, loss_db=meas), verdict=verdict)
        return NormAudit(name, name, 8, 1e-5, 0.1, 1.0, 1.0, 0, 1.0, 1e3, True, "folded", risk=risk)

    for meas_0, meas_2 in ((1.35, 1.47), (1.18, 1.41)):  # the two CPUs
        norms = [norm("bn.2", 1.31, meas_2), norm("bn.0", 1.46, meas_0), norm("bn.1", -0.93, 0.32)]
        assert [n.name for n in sorted(norms, key=norm_severity)] == ["bn.0", "bn.2", "bn.1"]
    norms = [norm("a", 1.46, 1.3), norm("b", 0.5, 2.6), norm("c", 0.1, 0.1, "degrades"), norm("d", 0, 0, "overflows")]
    assert [n.name for n in sorted(norms, key=norm_severity)] == ["d", "c", "a", "b"]


@pytest.mark.parametrize("profile", ["fp16", "htp"])
def test_report_rows_do_not_need_every_tensor(profile):
    """``tensors=False`` (``bnfold audit`` without ``--json``) measures only the values the rows read: the
    report is the same (normalizations, layers, end to end, advice), its ``tensors`` fewer, in both formats."""
    from numerics_helpers import onnx_keeping_batch_norms

    net, x = mixed(), torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0)) + 2
    batches = [(x,), (x * 0.5,)]
    for model in (export(net, x), onnx_keeping_batch_norms(net, x)):
        full = audit(model, batches, profile=profile).to_dict()
        rows = audit(model, batches, profile=profile, tensors=False).to_dict()
        assert full.pop("all_tensors") and not rows.pop("all_tensors")
        measured, all_of_them = (d.pop("tensors")["unfolded"] for d in (rows, full))
        assert 0 < len(measured) < len(all_of_them)
        ops, all_ops = rows.pop("ops"), full.pop("ops")  # per op: those measured
        peaks = {op["value"]: op["peak"] for op in all_ops}  # the jumps read inputs the rows do not measure
        assert 0 < len(ops) < len(all_ops) and all(peaks[op["value"]] == op["peak"] for op in ops)
        for d in (full, rows):
            d["fold_report"]["summary"].pop("seconds")
        assert rows == full


class InPlaceTail(torch.nn.Module):
    """A pooled conv+BN whose small result an in-place ReLU (``nn.ReLU(inplace=True)``) and an in-place ``+=``
    then overwrite: ``torch.export`` keeps ``relu_`` and ``add_``, and the runner runs them in place."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4)
        self.relu, self.head = torch.nn.ReLU(inplace=True), torch.nn.Linear(4, 2)

    def forward(self, x):
        y = self.bn(self.conv(x)).mean((2, 3), keepdim=True) - 0.1
        y = self.relu(y)
        y += 1
        return self.head(y.flatten(1))


def test_values_an_in_place_op_overwrites_are_measured_as_they_were_made():
    """Each value's error is measured against its reference as the op made it, before a later in-place op
    writes the same memory: in both programs, also where the measurement waits (a small tensor) and where the
    folded program is measured against a kept unfolded value."""
    torch.manual_seed(0)
    net = InPlaceTail().eval()
    net.bn.running_mean.uniform_(-1, 1)
    net.bn.running_var.uniform_(0.5, 2)
    x = torch.randn(1, 3, 4, 4)
    ep = torch.export.export(net, (x,))
    assert {"relu_.default", "add_.Tensor"} <= {str(n.target).split("aten.")[-1] for n in ep.graph.nodes}
    tensors = audit(ep, [(x,)]).to_dict()["tensors"]
    unfolded, folded = ({t["node"]: t["max_abs_ref"] for t in tensors[p]} for p in ("unfolded", "folded"))
    with torch.no_grad():
        net64 = copy.deepcopy(net).double()
        sub = net64.bn(net64.conv(x.double())).mean((2, 3), keepdim=True) - 0.1
    made = {
        "sub": sub.abs().max().item(),
        "relu_": sub.relu().abs().max().item(),
        "add_": (sub.relu() + 1).max().item(),
    }
    for name, value in made.items():
        assert unfolded[name] == pytest.approx(value, rel=1e-5), name
    assert folded["relu_"] == pytest.approx(made["relu_"], rel=1e-5)
    for name in set(unfolded) & set(folded) - {"mean"}:  # the fold moved the shift into the conv: "mean" differs
        assert folded[name] == pytest.approx(unfolded[name], rel=1e-5), name
