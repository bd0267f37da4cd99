"""The audit's two programs share what the fold left as it was: a large constant both hold, as one tensor or as
the same bytes, is rounded once (``rounded_constants.round_constants``' ``shared``), never a constant of other bytes
under the same name; and the folded ONNX program holds the unfolded program's tensor for an initializer the fold did
not rewrite (``onnx_program``'s ``like``), never for one it rewrote under its own name."""

from __future__ import annotations

import pytest
import torch
from numerics_helpers import onnx_keeping_batch_norms
from torch import nn

import bnfold.numerics.rounded_constants as rounded_constants
from bnfold.numerics.profiles import get_profile, round_fp16
from bnfold.numerics.rounded_constants import ROUNDED_TOGETHER, round_constants
from bnfold.numerics.runner import Program, Runner

onnx = pytest.importorskip("onnx")
from onnx import numpy_helper  # noqa: E402

import bnfold  # noqa: E402
from bnfold.numerics.onnx_program import onnx_program  # noqa: E402


def test_runners_that_share_their_rounding_round_a_tensor_once():
    prof = get_profile("fp16")
    w = torch.randn(ROUNDED_TOGETHER + 8, generator=torch.Generator().manual_seed(0))
    shared: dict = {}
    first = round_constants(prof, {"w": w}, shared)["w"]
    assert round_constants(prof, {"renamed": w.detach()}, shared)["renamed"] is first  # the same memory
    assert torch.equal(first, prof.round_const(w))
    copy = round_constants(prof, {"w": w.clone()}, shared)["w"]  # equal bytes, other memory: the same rounding
    assert copy is first
    old = w.clone()
    w.mul_(2)  # written in place: its version moved on, so the rounding of the old values is not reused
    again = round_constants(prof, {"w": w}, shared)["w"]
    assert again is not first and torch.equal(again, prof.round_const(w))
    assert torch.equal(round_constants(prof, {"w": old}, shared)["w"], prof.round_const(old))
    assert round_constants(get_profile("ort-cpu"), {"w": w}, shared)["w"] is not again  # another profile's own


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


def _program(constants: dict) -> Program:
    return Program([], constants, [], [], lambda xs: list(xs))


def test_a_constant_of_other_bytes_under_the_same_name_gets_its_own_rounding(monkeypatch):
    """Two programs (a hostile file may name two different constants alike, the fold rewrites a weight under its
    name) whose constant ``w`` differs only where the content index does not sample it, or only in a zero's sign:
    each runner holds the rounding of its own bytes, compared in full; the same bytes in another tensor share one."""
    prof = get_profile("fp16")
    n = ROUNDED_TOGETHER + 8
    a = torch.randn(n, generator=torch.Generator().manual_seed(1))
    a[n - 3] = 0.0
    step = n // rounded_constants._SAMPLES
    assert (n - 1) % step and (n - 3) % step  # neither position is sampled: the content keys are equal
    other = a.clone()
    other[n - 1] += 1.0
    signed = a.clone()
    signed[n - 3] = -0.0  # equal to 0.0 as a float, not as bits
    assert rounded_constants._content_key(prof, a) == rounded_constants._content_key(prof, other)
    shared: dict = {}
    first = Runner(_program({"w": a}), prof, shared=shared)._const_e["w"]
    for t in (other, signed):
        mine = Runner(_program({"w": t}), prof, shared=shared)._const_e["w"]
        assert mine is not first and torch.equal(_bits(mine), _bits(round_fp16(t)))
    assert torch.signbit(Runner(_program({"w": signed}), prof, shared=shared)._const_e["w"][n - 3])
    same = Runner(_program({"w": a.clone()}), prof, shared=shared)._const_e["w"]
    assert same is first
    a[n - 1] = 7.0  # the first constant written in place where nothing samples it: its rounding is of the old bytes
    moved = Runner(_program({"w": a.clone()}), prof, shared=shared)._const_e["w"]
    assert moved is not first and torch.equal(_bits(moved), _bits(round_fp16(a)))


def test_constants_alike_in_their_samples_cost_one_comparison_each(monkeypatch):
    """A file of many constants that share their sampled elements (differing elsewhere) compares each with the
    first of them once, not with each other (linear work), and rounds each from its own bytes."""
    compared = []
    real = rounded_constants._same_bytes
    monkeypatch.setattr(rounded_constants, "_same_bytes", lambda a, b: compared.append(1) or real(a, b))
    prof = get_profile("fp16")
    n = ROUNDED_TOGETHER + 8
    base = torch.randn(n, generator=torch.Generator().manual_seed(2))
    f32 = {}
    for k in range(12):
        t = base.clone()
        t[n - 1] = float(k)  # not sampled
        f32[f"w{k}"] = t
    shared: dict = {}
    out = round_constants(prof, f32, shared)
    assert len(compared) == 11
    assert round_constants(prof, {"w": base.clone()}, shared)["w"] is not None and len(compared) == 12
    for k, t in f32.items():
        assert torch.equal(_bits(out[k]), _bits(round_fp16(t))), k


@pytest.mark.parametrize("name", ["fp16", "htp", "ort-cpu"])
def test_a_float16_constant_is_its_own_rounding_where_the_profile_clamps_nothing(name):
    """A float16 constant under a profile that stores fp16: its float32 values are its rounding, held as they are
    (no rounding pass); under ort-cpu's clamp of constants it is rounded (clamped) as any other."""
    prof = get_profile(name)
    w = (torch.randn(ROUNDED_TOGETHER * 2, generator=torch.Generator().manual_seed(3)) * 1e-6).half()
    w[:4] = torch.tensor([6e-8, -0.0, 65504.0, float("inf")], dtype=torch.float16)
    small = w[:10].clone()
    runner = Runner(_program({"w": w, "s": small}), prof)
    for k, t in (("w", w), ("s", small)):
        assert torch.equal(_bits(runner._const_e[k]), _bits(prof.round_const(t.float()))), k
    assert (runner._const_e["w"] is runner._const_r["w"]) == (prof.const_clamp is None)


def test_the_folded_onnx_program_holds_only_the_initializers_the_fold_left():
    # a conv whose weight the fold rewrites under its own name, and a linear head it leaves as it was, both larger
    # than the constants the runner rounds together
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(8, 64, 3), nn.BatchNorm2d(64), nn.Flatten(), nn.Linear(64 * 4 * 4, 8)).eval()
    net[1].running_mean.uniform_(-1, 1)
    net[1].running_var.uniform_(0.5, 2)
    x = torch.randn(1, 8, 6, 6)
    model = onnx_keeping_batch_norms(net, x)
    folded = bnfold.fold(model).model
    conv = next(n for n in folded.graph.node if n.op_type == "Conv")
    head = next(n for n in folded.graph.node if n.op_type == "Gemm")
    conv_w, head_w = conv.input[1], head.input[1]
    unfolded = onnx_program(model)
    assert conv_w in unfolded.constants and head_w in unfolded.constants  # the fold kept both names
    prog = onnx_program(folded, like=unfolded)
    assert prog.constants[head_w] is unfolded.constants[head_w]
    assert prog.constants[conv_w] is not unfolded.constants[conv_w]
    inits = {t.name: torch.tensor(numpy_helper.to_array(t)) for t in folded.graph.initializer}
    for name in (conv_w, head_w):
        assert torch.equal(prog.constants[name], inits[name])
    assert not torch.equal(prog.constants[conv_w], unfolded.constants[conv_w])  # the fold did change it
    # the folded program run beside the unfolded one (as the audit runs them) computes what it computes alone
    shared: dict = {}
    Runner(unfolded, "fp16", shared=shared)
    beside = Runner(prog, "fp16", shared=shared)
    by_memory = [v for k, v in shared.items() if k[0] != "content"]
    (head_rounded,) = [r for t, r in by_memory if t is unfolded.constants[head_w]]
    assert beside._const_e[head_w] is head_rounded  # the head's weight, rounded once
    assert len(by_memory) == 3  # the unfolded conv's weight, the folded one, the head's
    assert torch.equal(beside._const_e[conv_w], round_fp16(prog.constants[conv_w]))  # the folded weight's own
    alone = Runner(onnx_program(folded), "fp16").run(x)
    assert torch.equal(beside.run(x).outputs[0], alone.outputs[0])


def test_the_program_holds_one_copy_of_an_initializer():
    """An initializer in ``raw_data`` is read once (the bytes protobuf gives) and held as it was read: the program's
    float tensor is that memory, not a second copy (tracemalloc's peak while the program is built: 2 x 16 MiB before,
    one now), with the same values; a float16 one too, and an int64 one is still copied (the runner's int64)."""
    import tracemalloc

    from onnx import TensorProto, helper

    big = torch.randn(1024, 4096, generator=torch.Generator().manual_seed(0))
    inits = [
        numpy_helper.from_array(big.numpy(), "w"),
        numpy_helper.from_array(big[:8].half().numpy(), "h"),
        numpy_helper.from_array(torch.arange(12).reshape(3, 4).numpy().astype("int32"), "i"),
    ]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "y"], ["z"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4096])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    tracemalloc.start()
    try:
        prog = onnx_program(model)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * big.nbytes, peak / big.nbytes
    assert torch.equal(prog.constants["w"], big) and prog.constants["w"].dtype == torch.float32
    assert torch.equal(prog.constants["h"], big[:8].half())
    assert prog.constants["i"].dtype == torch.int64 and prog.constants["i"].tolist() == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9, 10, 11],
    ]


def _step(name, ins, outs, **kw):
    from bnfold.numerics.runner import Step

    return Step(name, "Op", ins, outs, lambda xs, dtype, **_: [xs[0]], **kw)


def test_written_first_names_only_constants_no_run_reads_before_their_step():
    """A constant a step computes again is held unrounded only where no step reads it before that step, one step
    writes it (as its first output), and the profile's Conv+BatchNormalization fusion does not read it."""
    from bnfold.numerics.rounded_constants import written_first
    from bnfold.numerics.runner import StepNorm

    consts = {k: torch.ones(2) for k in ("wt", "early", "twice", "second", "convw", "mean", "unread")}
    steps = [
        _step("t", ["w"], ["wt"]),
        _step("e0", ["early"], ["y0"]),  # read before the step that writes it
        _step("e1", ["w"], ["early"]),
        _step("d0", ["w"], ["twice"]),
        _step("d1", ["w"], ["twice"]),
        _step("s", ["w"], ["z", "second"]),
        _step("c", ["w"], ["convw"]),
        _step("m", ["w"], ["mean"]),
        _step("conv", ["x", "convw", "wt"], ["y1"], layer="conv", weight="convw"),
        _step("bn", ["y1", "wt", "wt", "mean", "wt"], ["y2"], norm=StepNorm("y1", ("wt", "wt", "mean", "wt"), 1e-5)),
        _step("u", ["w"], ["unread"]),
    ]
    prog = Program(steps, consts, ["x"], ["y2"], lambda xs: list(xs))
    assert written_first(prog) == {"wt", "convw", "mean", "unread"}
    assert written_first(prog, fused=True) == {"unread"}


def _computed_weights_model():
    """An ONNX model whose weights are computed in the graph: a MatMul reading ``Transpose(W)`` (what the dynamo
    exporter writes for a Linear) and a conv reading ``Mul(W, s)`` (a scaled, standardized weight), a batch norm
    after the conv for the fold."""
    from onnx import TensorProto
    from onnx import helper as h

    g = torch.Generator().manual_seed(4)

    def init(name, *shape, scale=1.0):
        return numpy_helper.from_array((torch.randn(shape, generator=g) * scale).numpy(), name)

    nodes = [
        h.make_node("Mul", ["cw_raw", "cs"], ["cw"], name="scale_w"),
        h.make_node("Conv", ["x", "cw", "cb"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        h.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["n"], name="bn"),
        h.make_node("Relu", ["n"], ["r"], name="relu"),
        h.make_node("Flatten", ["r"], ["f"], name="flat"),
        h.make_node("Transpose", ["fw"], ["fwt"], name="t", perm=[1, 0]),
        h.make_node("MatMul", ["f", "fwt"], ["y"], name="fc"),
    ]
    inits = [init("cw_raw", 16, 4, 3, 3), init("cs", 16, 1, 1, 1), init("cb", 16), init("g", 16), init("b", 16)]
    inits += [init("m", 16, scale=0.3), numpy_helper.from_array(torch.rand(16, generator=g).numpy() + 0.5, "v")]
    inits += [init("fw", 10, 16 * 6 * 6, scale=0.05)]
    io = [h.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n, shape in (("x", [1, 4, 6, 6]), ("y", [1, 10]))]
    return h.make_model(h.make_graph(nodes, "computed", io[:1], io[1:], inits), opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize("profile", ["fp16", "htp", "fp16-acc", "ort-cpu", "fp32"])
def test_constants_held_unrounded_leave_the_report_as_it_was(monkeypatch, profile):
    """The audit of a model whose steps compute weights (held unrounded: :func:`written_first`) reports what it
    reports with every constant rounded, within 1e-9, interpreted and generated, every value and the local runs."""
    from test_compiled import _same

    import bnfold.numerics.runner as runner_module

    model = _computed_weights_model()
    unfolded = onnx_program(model)
    assert {"fwt", "cw"} <= runner_module.written_first(unfolded)
    g = torch.Generator().manual_seed(5)
    batches = [(torch.randn(1, 4, 6, 6, generator=g) * 3,) for _ in range(2)]
    fold = bnfold.fold(model)
    real_first, real_round = runner_module.written_first, runner_module.round_constants

    def poisoned(prof, f32, shared=None, exact=frozenset(), by_content=True):
        """What the runner holds, the constants held unrounded replaced by NaN: no run may read them."""
        out = real_round(prof, f32, shared, exact, by_content)
        return {k: torch.full_like(v, float("nan")) if k in exact else v for k, v in out.items()}

    docs = []
    for first, rounding in (
        (real_first, real_round),
        (lambda program, fused=False: frozenset(), real_round),  # every constant rounded
        (real_first, poisoned),
    ):
        monkeypatch.setattr(runner_module, "written_first", first)
        monkeypatch.setattr(runner_module, "round_constants", rounding)
        for after in (None, 0):
            monkeypatch.setattr(runner_module, "COMPILE_AFTER", after)
            docs.append(bnfold.audit(model, batches, profile=profile, fold=fold).to_dict())
    e2e = docs[0]["end_to_end"]["unfolded"]
    assert e2e["nan"] == 0 and 0 < e2e["output_sqnr_db"] < float("inf")  # a real audit: finite, measured numbers
    for doc in docs[1:]:
        assert not _same(docs[0], doc)
