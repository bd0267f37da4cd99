"""``--fp16-range`` on a streamed model runs its batches in groups, layer by layer (``ranges.run_plain``'s
``group``, sized by the cost plan: ``Plan.batches_at_once``): a large weight is read once per run and group, not once
per batch, and the outputs, peaks, files and report are those of the batches run one at a time."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from test_stream_range import _cases, _files, _model, _plain_and_streamed, _reads_inside, _untimed

from bnfold.cli.main import main
from bnfold.io import cost
from bnfold.io.budget import Budget
from bnfold.io.onnx import load_onnx
from bnfold.numerics import ranges
from bnfold.numerics.onnx_program import OnnxAudit, onnx_program
from bnfold.numerics.ranges import run_plain

_LARGE = ("proj", "l0.w", "l1.w", "l2.w", "l3.w")  # _model's weights of 1 MiB or more


def _batches(folder, n: int) -> str:
    """``n`` batches that take the projection past fp16's range: the rewrite scales layers."""
    path = folder / "in.npz"
    np.savez(path, x=np.random.default_rng(0).standard_normal((n, 1, 3, 8, 8)).astype(np.float32) * 1e4)
    return str(path)


def _runs_reads(monkeypatch) -> tuple[dict, list]:
    """Count each tensor's reads from the data or scratch file inside ``run_plain`` (the calibration and the two
    proof runs): ``(reads by tensor name, the runs' group sizes)``."""
    groups, real = [], ranges.run_plain
    monkeypatch.setattr(
        ranges,
        "run_plain",
        lambda p, b, dtype, peaks=None, group=1, *rest: groups.append(group) or real(p, b, dtype, peaks, group, *rest),
    )
    reads, _ = _reads_inside(monkeypatch, ranges, "run_plain")
    return reads, groups


def test_eight_batches_read_each_large_weight_once_per_run(tmp_path, monkeypatch):
    """8 calibration batches (the proof runs them and 8 fresh ones, on the folded and the rewritten model): each
    large weight is read 3 times by the runs (calibration 1, each proof 1), where it was read once per batch and run
    before (8 + 16 + 16 = 40); the files and report are the plain fold's, and those of the streamed fold with the
    batches run one at a time (``group`` 1, the order before)."""
    src = tmp_path / "in"
    src.mkdir()
    path, _ = _model(src)
    npz = _batches(tmp_path, 8)
    reads, groups = _runs_reads(monkeypatch)

    def plain_done():
        reads.clear()
        groups.clear()

    report = _plain_and_streamed(tmp_path, path, npz, plain_done)
    assert any(e["factor"] != 1.0 for e in report["rescaled"])  # the rewrite applied: three runs
    assert groups == [16, 16, 16]  # the plan fits every batch at once here
    assert {n: reads.get(n, 0) for n in _LARGE} == dict.fromkeys(_LARGE, 3), reads

    # the same fold, streamed, with the batches run one at a time
    monkeypatch.setattr(cost.Plan, "batches_at_once", lambda self, n, within=None: 1)
    out = tmp_path / "one"
    out.mkdir()
    args = ["fold", path, "-o", str(out / "out.onnx"), "-q", "--fp16-range", npz, "--low-memory"]
    assert main([*args, "--report", str(out / "report.json")]) == 0
    assert _files(out) == _files(tmp_path / "stream")
    one = json.loads((out / "report.json").read_text())
    assert _untimed(one) == _untimed(json.loads((tmp_path / "stream" / "report.json").read_text()))


def test_a_streamed_folds_groups_hold_no_more_than_its_largest_tensor(tmp_path, monkeypatch):
    """Where weights stream (``--low-memory``), the batches held at once are sized within the largest streamed
    tensor too (``batches_at_once``'s ``within``), not only within the audit's budget (at least 1 GiB); the plain
    fold, whose weights are in memory, sizes them by the budget alone.  With a batch's part of the plan larger than
    the largest tensor, the streamed runs take one batch at a time and give the same files and report."""
    src = tmp_path / "in"
    src.mkdir()
    path, largest = _model(src)
    npz = _batches(tmp_path, 4)
    asked, groups, real = [], [], cost.Plan.batches_at_once

    def at_once(plan, n, within=None):
        asked.append(within)
        groups.append(real(plan, n, within))
        return groups[-1]

    monkeypatch.setattr(cost.Plan, "batches_at_once", at_once)
    _plain_and_streamed(tmp_path, path, npz)
    assert asked == [None, largest] and groups == [8, 8]  # this model's batch is far smaller than its tensors

    # the same streamed fold with its largest tensor taken as 1 byte: each batch's part is over it, one at a time
    asked.clear()
    groups.clear()
    monkeypatch.setattr(cost.Plan, "batches_at_once", lambda plan, n, within=None: at_once(plan, n, within and 1))
    (tmp_path / "small").mkdir()
    _plain_and_streamed(tmp_path / "small", path, npz)
    assert asked == [None, 1] and groups == [8, 1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_lazy_program_in_groups_runs_as_one_batch_at_a_time(tmp_path, dtype):
    """The lazy program of a streamed load on 5 batches of different scales: in groups of 2, 3 and 5 the outputs
    are those of one batch at a time, bit for bit, and the peaks the same numbers in the same order."""
    path, _ = _model(tmp_path, n=2)
    x = [(torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(i)) * 10**i,) for i in range(5)]
    model, layout = load_onnx(path, stream=True)
    with layout.reading():
        program = onnx_program(model, lazy=True)
        runs = {}
        for group in (1, 2, 3, 5):
            peaks = {}
            runs[group] = (run_plain(program, x, dtype, peaks, group), list(peaks.items()))
    outs, peaks = runs[1]
    for group in (2, 3, 5):
        got, got_peaks = runs[group]
        assert got_peaks == peaks
        assert all(torch.equal(a, b) for ob, gb in zip(outs, got, strict=True) for a, b in zip(ob, gb, strict=True))


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_a_layer_run_by_blocks_in_groups_gives_each_batchs_output(monkeypatch, case):
    """A float64 layer whose large weight runs by blocks of output channels (and the grouped Conv, which runs
    whole): each block converted once serves every batch of the group; each batch's output equals its run alone."""
    _, model, x, _, _ = case
    monkeypatch.setattr(ranges, "BLOCK_BYTES", 64 * 1024)
    program = onnx_program(model)
    gen = torch.Generator().manual_seed(0)
    xs = [(torch.from_numpy(x) * float(torch.rand((), generator=gen) * 4),) for _ in range(4)]
    alone = run_plain(program, xs, torch.float64)
    together = run_plain(program, xs, torch.float64, None, 3)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(alone, together, strict=True))


def test_the_plan_fits_its_batches_at_once_in_its_budget(tmp_path):
    """``Plan.batches_at_once``: one batch's part of the ONNX plan is its peak over what the weights' part holds
    (``fixed``; a batch's inputs are not in it); k batches fit where ``fixed`` + k times that part is within the
    budget, at least 1 and at most the batches there are."""
    path, _ = _model(tmp_path, n=2)
    model = load_onnx(path).model
    x = [(torch.randn(1, 3, 8, 8),)] * 4
    plan = OnnxAudit().plan(model, x, runs=3, name=None)
    one = plan.peak - plan.fixed
    assert 0 < one < plan.peak and plan.fixed > 0
    assert plan.batches_at_once(4) == 4  # the audit's budget of a 9 MB model (at least 1 GiB) holds them all
    for k in (1, 2, 3):
        tight = replace(plan, budget=Budget(plan.fixed + k * one + one // 2, plan.budget.flops))
        assert tight.batches_at_once(16) == k
        assert tight.batches_at_once(2) == min(k, 2)
    assert replace(plan, budget=Budget(plan.peak, plan.budget.flops)).batches_at_once(16) == 1
    # within a streamed model's largest tensor: the batches held at once are no larger, unless one alone is
    for k in (1, 2, 3):
        assert plan.batches_at_once(16, within=k * one + one // 2) == k
    assert plan.batches_at_once(16, within=one // 2) == 1


@pytest.mark.parametrize("dtype,grouped", [(torch.float32, False), (torch.float64, True)])
def test_a_group_runs_layer_by_layer_only_where_a_constant_is_read_at_use(dtype, grouped):
    """A held 2 MiB MatMul weight is converted at use in a float64 run only: there the steps run on every batch of
    the group before the next step; in float32 nothing is read at use, so a group would save nothing and hold every
    batch's values: the batches run one at a time."""
    model = _cases()[0][1]  # x [2, 5, 512] @ w [512, 600]: the MatMul, then nothing
    program = onnx_program(model)
    (step,) = program.steps
    order, real = [], step.run
    step.run = lambda ins, dt, *a, **k: order.append(float(ins[0].flatten()[0])) or real(ins, dt, *a, **k)
    xs = [(torch.full((2, 5, 512), float(i)),) for i in range(3)]
    run_plain(program, xs, dtype, None, 3)
    blocks = len(order) // 3  # a float64 run computes the layer by blocks of channels
    assert order == ([0.0, 1.0, 2.0] * blocks if grouped else [0.0] * blocks + [1.0] * blocks + [2.0] * blocks)


def _onnx_dynamic():
    """x [N, 64] @ w [64, 64], then Relu: N is the batch's."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64])],
        [w],
    )
    return OnnxAudit(), helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _torch_dynamic():
    from bnfold.numerics.fx_program import PROGRAM_AUDIT

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()).eval()
    n = torch.export.Dim("n", min=1, max=4096)
    return PROGRAM_AUDIT, torch.export.export(model, (torch.randn(2, 64),), dynamic_shapes=({0: n},))


@pytest.mark.parametrize("make", [_onnx_dynamic, _torch_dynamic], ids=["onnx", "torch"])
def test_a_plans_fixed_part_does_not_grow_with_the_batch(make):
    """The part of a plan that does not grow with the batches (``fixed``: the weights' part) is the same for a batch
    of 1 row and one of 1024 rows, ONNX and torch programs: the batch's inputs are not in it; one batch's part
    (``peak - fixed``) grows with the rows."""
    fmt, model = make()
    small, large = (fmt.plan(model, [(torch.randn(rows, 64),)], runs=3, name=None) for rows in (1, 1024))
    assert small.fixed == large.fixed > 0
    assert large.peak - large.fixed > 100 * (small.peak - small.fixed) > 0


def test_a_group_whose_blocks_do_not_hold_the_channels_runs_each_batch_whole():
    """A step that says its channels are on an output axis they are not on (here the rows): the first block's output
    tells, and each batch of the group runs the step whole, its output the layer's (the whole weight converted)."""
    from bnfold.numerics.runner import Step

    step = Step("mm", "MatMul", ["x", "w"], ["y"], lambda ins, dt: [ins[0] @ ins[1]], weight="w", channels=(1, 0))
    w = torch.randn(64, 96)
    xs = [[torch.randn(5, 64, dtype=torch.float64) * (i + 1), None] for i in range(3)]
    outs = ranges._by_channels(step, xs, 1, w, torch.float64)
    assert len(outs) == 3
    for (x, _), (y,) in zip(xs, outs, strict=True):
        assert torch.equal(y, x @ w.double())
