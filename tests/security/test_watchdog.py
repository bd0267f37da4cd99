"""Issue 28: the run-time check and the watchdog (``bnfold.io.run_checks``), and the decision to refuse a
file whose stored metadata disagrees with what its ops compute (``bnfold.io.fx_shapes``).  In-process
and cheap: nothing here allocates more than a few KB."""

from __future__ import annotations

import resource

import crafted
import crafted_lies as lies
import pytest
import torch

from bnfold.io import cost, fx_cost, fx_shapes, models, run_checks
from bnfold.numerics.audit_memory import AuditHold


def test_recomputed_shapes_agree_with_honest_metadata(programs):
    """No false alarm: on honest programs (static, dynamic, dict inputs) every recomputed value is the one
    export stated."""
    from bnfold.io.pt2 import load_pt2

    for name, path in programs.items():
        ep = load_pt2(path)
        specs = fx_shapes.recompute(ep, where=name)  # compares, raises on a disagreement
        for node in ep.graph.nodes:
            val = node.meta.get("val")
            if node.op == "call_function" and isinstance(val, torch.Tensor) and specs.get(node.name):
                assert specs[node.name][0].dtype == val.dtype, (name, node.name)
                if all(isinstance(d, int) for d in val.shape):
                    assert specs[node.name][0].dims == tuple(val.shape), (name, node.name)


def test_audit_sizes_read_only_checked_metadata(programs):
    """``fx_shapes.specs`` (the audit's plan): a program read from a file is recomputed on a batch of shapes its
    metadata was not checked at, and read from its (checked) metadata on the shapes load checked; a program
    made in memory is read from torch's metadata at the batch's symbols.  A lie planted after load shows
    where the metadata is read, never where it is recomputed."""
    ep = models.load_model(programs["dynamic"]).model  # checked at load, at its example shapes [2, 3, 8, 8]
    (x,) = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    conv = next(n for n in ep.graph.nodes if n.op == "call_function" and "conv" in str(n.target))
    stated = conv.meta["val"]
    conv.meta["val"] = torch.empty(7, 7, 7, 7, device="meta")  # a lie planted after the check
    try:
        example = fx_shapes.specs(ep, {x: (2, 3, 8, 8)})
        other = fx_shapes.specs(ep, {x: (5, 3, 16, 16)})
    finally:
        conv.meta["val"] = stated
    assert example[conv.name][0].dims == (7, 7, 7, 7)  # the checked shapes: the metadata as it is
    assert other[conv.name][0].dims == (5, 4, 14, 14)  # other shapes: recomputed, the planted lie unseen
    fresh = torch.export.export(  # made in memory: torch's own metadata, at the batch's symbols
        crafted.ConvBN().eval(), (torch.randn(2, 3, 8, 8),), dynamic_shapes=({0: torch.export.Dim("b", max=64)},)
    )
    node = next(n for n in fresh.graph.nodes if n.op == "call_function" and "conv" in str(n.target))
    (fx,) = [s.arg.name for s in fresh.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    assert fx_shapes.specs(fresh, {fx: (9, 3, 8, 8)})[node.name][0].dims == (9, 4, 6, 6)


def test_metadata_mismatch_is_refused_naming_node_and_both_shapes(tmp_path):
    """The decision: a file whose stated shape differs from the recomputed one is refused, larger or smaller."""
    with pytest.raises(fx_shapes.MetadataMismatch) as bigger:
        models.load_model(lies.lying_program(tmp_path, "zeros"))
    message = str(bigger.value)
    assert "node 'zeros' (zeros.default)" in message and "[65536, 65536]" in message and "[2, 3]" in message
    with pytest.raises(fx_shapes.MetadataMismatch, match=r"computes \[1, 1\] float32 but the file states \[2, 3\]"):
        models.load_model(lies.smaller_lie(tmp_path))
    assert models.load_model(lies.honest_program(tmp_path, "zeros")).kind == "pt2"


def test_before_op_sizes_an_op_by_its_meta_kernels():
    """The run-time check sizes ``zeros([2**16, 2**16])`` (16 GiB) without allocating it, and refuses it."""
    budget = cost.Budget(1 << 20, 1 << 28)
    with pytest.raises(cost.WorkError, match=r"zeros 'z' would create 16 GiB, over the budget of 1 MiB"):
        run_checks.before_op("zeros 'z'", torch.ops.aten.zeros.default, ([1 << 16, 1 << 16],), budget=budget)
    a = torch.ones(3, 5)
    outs = run_checks.before_op("mm 'm'", torch.ops.aten.mm.default, (a, a.t()), budget=budget)
    assert [o.dims for o in outs] == [(3, 3)] and outs[0].nbytes == 36


def test_values_the_plan_sized_are_not_sized_again(monkeypatch):
    """In a watched run, an op whose outputs the plan sized with the same meta kernels (``Plan.sized``: a torch
    program's checked metadata) is not run on meta tensors again; any other output still is, and is refused
    over the budget.  The audit's plan of a torch program names its nodes."""
    calls = []
    monkeypatch.setattr(run_checks, "meta_outputs", lambda *a: calls.append(a) or [run_checks.Out((1 << 40,), 1 << 42)])
    zeros = torch.ops.aten.zeros.default
    with run_checks.watch():
        run_checks.expect(cost.Budget(1 << 20, 1 << 28), 0, "m.pt2", sized={"conv": 64, "bn": 64})
        assert run_checks.before_op("conv 'conv'", zeros, ([2],), values=["conv"]) is None and not calls
        with pytest.raises(cost.WorkError, match=r"m.pt2: zeros 'z' would create .* GiB, over the budget of 1 MiB"):
            run_checks.before_op("zeros 'z'", zeros, ([2],), values=["conv", "z"])  # one output not sized
        assert len(calls) == 1
        # what the run holds with a sized value is still checked, with the plan's size (no meta run)
        with pytest.raises(cost.WorkError, match=r"m.pt2: conv 'conv' would create 64 bytes \(the run would hold 2"):
            run_checks.before_op("conv 'conv'", zeros, ([2],), values=["conv"], held=lambda n: n + (2 << 20))
        assert len(calls) == 1
    ep = torch.export.export(crafted.ConvBN().eval(), (torch.randn(1, 3, 8, 8),))
    (x,) = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    plan = fx_cost.fx_plan(ep, [(torch.randn(1, 3, 8, 8),)], runs=3, hold=AuditHold(3))
    assert {n.name for n in ep.graph.nodes if n.op == "call_function"} <= plan.sized.keys() and x in plan.sized
    assert plan.sized[x] == 1 * 3 * 8 * 8 * 4  # the value's bytes


def test_cpu_time_bound_stops_the_op_loop(monkeypatch):
    monkeypatch.setattr(run_checks, "CPU_FLOOR_S", -1.0)  # a deadline already past
    with run_checks.watch():
        run_checks.before_op("conv 'c'")  # no plan yet: no bound
        run_checks.expect(cost.Budget(1 << 30, 1 << 38), 0, "m.pt2")
        with pytest.raises(cost.WorkError, match=r"m.pt2: the run passed its CPU-time bound at conv 'c'"):
            run_checks.before_op("conv 'c'")


def test_allocator_failure_becomes_one_line_naming_the_op():
    with pytest.raises(cost.WorkError, match=r"m.pt2: out of memory while running mm 'm3'"):
        with run_checks.watch():
            run_checks.expect(cost.Budget(1 << 30, 1 << 38), 0, "m.pt2")
            run_checks.before_op("mm 'm3'")
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: can't allocate memory")
    with pytest.raises(cost.WorkError, match=r"out of memory while running Mul 'scale'"):
        with run_checks.watch():
            run_checks.before_op("Mul 'scale'")
            raise MemoryError
    with pytest.raises(RuntimeError, match="shapes do not match"):  # any other error is left alone
        with run_checks.watch():
            raise RuntimeError("shapes do not match")


def test_address_space_cap_is_set_for_the_audit_and_restored():
    before = resource.getrlimit(resource.RLIMIT_AS)
    budget = cost.Budget(1 << 28, 1 << 36)
    with run_checks.watch(address_cap=True) as run:
        run_checks.expect(budget, 0, "m.pt2")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if run.saved_limit is not None:  # the OS allowed it
            assert soft != resource.RLIM_INFINITY and hard == before[1]
            assert soft <= run_checks._mapped_bytes() + 2 * budget.bytes + run_checks.ADDRESS_HEADROOM
    assert resource.getrlimit(resource.RLIMIT_AS) == before
    with run_checks.watch():  # fold / check: no cap
        run_checks.expect(budget, 0, "m.pt2")
        assert resource.getrlimit(resource.RLIMIT_AS) == before


def test_strides_an_as_strided_reads_are_checked_like_shapes():
    """The fold takes a flat-order ``as_strided`` for a reshape from its input's stated strides
    (``hop_is_exact``), so a file stating other strides than its ops compute for such an input is refused;
    honest metadata passes."""

    class Head(torch.nn.Module):
        def forward(self, x):
            return torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x.permute(0, 3, 1, 2), 1), 1)

    ep = torch.export.export(Head(), (torch.randn(2, 4, 4, 6),)).run_decompositions()
    strided = [n for n in ep.graph.nodes if "as_strided" in str(n.target)]
    assert strided, "the decomposed flatten is no as_strided any more: the case is gone"
    fx_shapes.recompute(ep, where="honest.pt2")  # torch's own strides: no refusal
    source = strided[0].args[0]
    real = source.meta["val"]
    source.meta["val"] = torch.empty_strided(tuple(real.shape), (1, 2, 12, 12), device="meta")  # same dims
    try:
        with pytest.raises(
            fx_shapes.MetadataMismatch, match=r"computes strides .* but the file states \[1, 2, 12, 12\]"
        ):
            fx_shapes.recompute(ep, where="lying.pt2")
    finally:
        source.meta["val"] = real


def test_the_runner_sizes_a_step_once_per_input_signature_and_by_its_shape_fact(monkeypatch):
    """In a watched run the runner's check (``Runner._check``) runs a step's meta kernels once per input signature
    (a second batch of the same shapes reads what the first found; other shapes are sized again: ``MatMul``), and
    not at all for an op whose table row bounds its outputs by its inputs' shapes within the budget (``Mul``:
    broadcast, ``Sigmoid``: same); a broadcast past the budget is still sized by the meta kernels, and refused before
    it allocates."""
    import onnx
    from onnx import TensorProto, helper

    from bnfold.numerics.onnx_program import OnnxEmulator

    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Mul", ["a", "b"], ["p"], name="mul"),
        helper.make_node("MatMul", ["p", "p"], ["q"], name="mm"),
        helper.make_node("Sigmoid", ["q"], ["y"], name="sig"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("a", f, [1, None]), helper.make_tensor_value_info("b", f, [None, 1])],
        [helper.make_tensor_value_info("y", f, [None, None])],
    )
    emu = OnnxEmulator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "fp16")
    onnx.checker.check_model(emu.model)
    sized = []
    real = run_checks.meta_outputs
    monkeypatch.setattr(run_checks, "meta_outputs", lambda fn, *a: sized.append(fn) or real(fn, *a))
    op_of = {s.run: s.op for s in emu.program.steps}

    def run(n: int) -> list[str]:
        sized.clear()
        emu.run(torch.ones(1, n), torch.ones(n, 1), reference=False)
        return [op_of[fn] for fn in sized]

    with run_checks.watch():
        run_checks.expect(cost.Budget(1 << 20, 1 << 40), 0, "m.onnx")
        assert run(8) == ["MatMul"]  # Mul: 8 x 8 elements, bounded by its inputs' shapes; Sigmoid: its input's
        assert run(8) == []  # the same shapes: sized already
        assert run(16) == ["MatMul"]
        held = r"\(the run would hold [\d.]+ MiB with what it holds already\)"  # the audit's holding counted too
        with pytest.raises(
            cost.WorkError, match=rf"m.onnx: Mul 'mul' would create 4 MiB {held}, over the budget of 1 MiB"
        ):
            run(1024)
        assert sized == [emu.program.steps[0].run]
    assert run(8) == []  # not watched: nothing is sized


def test_the_bound_of_a_shape_fact_holds_whatever_the_other_inputs():
    """``run_checks.shape_bound`` bounds outputs only where no input can make them larger than it says: a ``same`` op
    whose other inputs hold one element each, a reduction, a batch norm with one parameter per channel, a broadcast;
    a LayerNorm scale that could broadcast its input up, or a batch norm's statistics per element (ONNX
    ``spatial=0``), leave it to the meta kernels (None)."""
    x, bound = torch.ones(1, 4, 3, 1), run_checks.shape_bound
    assert bound("same", [x, torch.ones(())], 1) == 12 * 16
    assert bound("same", [x, torch.ones(4)], 1) is None  # [1, 4, 3, 1] * [4] is [1, 4, 3, 4]
    assert bound("reduced", [x, torch.tensor([1, 2])], 1) == 12 * 16
    assert bound("", [x] + [torch.ones(4)] * 4, 3, channel_axis=1) == 3 * 12 * 16
    assert bound("", [x] + [torch.ones(4, 3)] * 4, 1, channel_axis=1) is None
    assert bound("broadcast", [torch.ones(5, 1), torch.ones(1, 7)], 1) == 35 * 16
    assert bound("broadcast", [torch.ones(5), torch.ones(7)], 1) is None
    assert bound("", [x], 1) is None


def test_an_onnx_op_the_allocator_refuses_is_out_of_memory_not_the_input_shapes(monkeypatch):
    """An op that ran out of memory is not an op that failed on its inputs: the audit of an ONNX model says
    "out of memory while running" the op (the command's watch), not "check the input shapes" (the user's)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto as T
    from onnx import helper as h

    import bnfold
    from bnfold.numerics import onnx_program

    x = h.make_tensor_value_info("x", T.FLOAT, [1, 2, 4, 4])
    y = h.make_tensor_value_info("y", T.FLOAT, [1, 2, 4, 4])
    model = h.make_model(h.make_graph([h.make_node("Relu", ["x"], ["y"], name="act")], "g", [x], [y]))
    real = onnx_program.bind

    def refusing(node, opset):
        bound = real(node, opset)

        class Refused:
            emulated, why = bound.emulated, bound.why

            def __call__(self, ins, a, dtype):
                raise RuntimeError("[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: can't allocate memory")

        return Refused()

    monkeypatch.setattr(onnx_program, "bind", refusing)
    with pytest.raises(cost.WorkError, match=r"out of memory while running Relu 'act'") as got:
        with run_checks.watch():
            bnfold.audit(model, [(torch.ones(1, 2, 4, 4),)])
    assert "input shape" not in str(got.value)
    assert onnx is not None
