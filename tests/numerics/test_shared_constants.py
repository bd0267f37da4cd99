"""The audit's two programs share what the fold left as it was: a large constant both hold is rounded once
(``runner._round_constants``' ``shared``), and the folded ONNX program holds the unfolded program's tensor for an
initializer the fold did not rewrite (``onnx_program``'s ``like``), never for one it rewrote under its own name."""

from __future__ import annotations

import pytest
import torch
from numerics_helpers import onnx_keeping_batch_norms
from torch import nn

from bnfold.numerics.profiles import get_profile
from bnfold.numerics.runner import ROUNDED_TOGETHER, Runner, _round_constants

onnx = pytest.importorskip("onnx")
from onnx import numpy_helper  # noqa: E402

import bnfold  # noqa: E402
from bnfold.numerics.onnx_program import onnx_program  # noqa: E402


def test_runners_that_share_their_rounding_round_a_tensor_once():
    prof = get_profile("fp16")
    w = torch.randn(ROUNDED_TOGETHER + 8, generator=torch.Generator().manual_seed(0))
    shared: dict = {}
    first = _round_constants(prof, {"w": w}, shared)["w"]
    assert _round_constants(prof, {"renamed": w.detach()}, shared)["renamed"] is first  # the same memory
    assert torch.equal(first, prof.round_const(w))
    copy = _round_constants(prof, {"w": w.clone()}, shared)["w"]  # equal values, other memory: rounded again
    assert copy is not first and torch.equal(copy, first)
    w.mul_(2)  # written in place: its version moved on, so the rounding of the old values is not reused
    again = _round_constants(prof, {"w": w}, shared)["w"]
    assert again is not first and torch.equal(again, prof.round_const(w))
    assert _round_constants(get_profile("ort-cpu"), {"w": w}, shared)["w"] is not again  # another profile's own


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
    (head_rounded,) = [r for t, r in shared.values() if t is unfolded.constants[head_w]]
    assert beside._const_e[head_w] is head_rounded  # the head's weight, rounded once
    assert len(shared) == 3  # the unfolded conv's weight, the folded one, the head's
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
