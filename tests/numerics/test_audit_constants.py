"""The audit's constant evaluation (``numerics.onnx_program.constants``) is metered by what is alive: a weight
computed through a long chain of constant ops (weight standardization in a dynamo export, NF-nets) is judged by
the values it holds at once, not by the sum of every intermediate; a chain whose live values exceed the budget
is still refused."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from bnfold.io.cost import WorkError, max_work  # noqa: E402
from bnfold.onnx.const_eval import graph_constants as constants  # noqa: E402

STEPS = 12
SIDE = 256  # a 256x256 float32 weight: 256 KiB; the chain makes STEPS values of that size


def _chain_model() -> onnx.ModelProto:
    """``y = conv(x, w * 1.01 * 1.01 * ...)`` with STEPS constant Muls computing the conv's weight."""
    w = np.random.default_rng(0).standard_normal((SIDE, SIDE, 1, 1)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w0"), numpy_helper.from_array(np.array(1.01, np.float32), "k")]
    nodes = [helper.make_node("Mul", [f"w{i}", "k"], [f"w{i + 1}"], name=f"mul{i}") for i in range(STEPS)]
    nodes.append(helper.make_node("Conv", ["x", f"w{STEPS}"], ["y"], name="conv"))
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, SIDE, 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, SIDE, 2, 2])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_long_constant_chain_is_judged_by_what_it_holds():
    model = _chain_model()
    value = SIDE * SIDE * 4
    # every intermediate of the chain together: far over this budget; the weight, one value in flight and the
    # float64 temporaries of one Mul: under it
    budget = 8 * value
    assert STEPS * value > budget
    with max_work(budget):
        out = constants(model)
    w0 = numpy_helper.to_array(model.graph.initializer[0]).astype(np.float64)
    expect = w0 * np.float64(np.float32(1.01)) ** STEPS
    np.testing.assert_allclose(out[f"w{STEPS}"], expect, rtol=1e-5)
    assert not any(f"w{i}" in out for i in range(1, STEPS))  # the intermediates only the chain read are gone


def test_live_values_over_the_budget_are_still_refused():
    with max_work(SIDE * SIDE * 4 // 2), pytest.raises(WorkError, match="constant evaluation"):
        constants(_chain_model())


def test_a_bfloat16_initializer_keeps_its_values():
    """A bfloat16 initializer (numpy reads it as ml_dtypes' bfloat16, which torch does not take) is held as the
    float32 values it stores, not cast to integers: an op that reads it directly computes on its values."""
    import torch

    from bnfold.numerics.onnx_program import OnnxEmulator

    g = torch.Generator().manual_seed(0)
    w, x = (torch.randn(1, 8, generator=g) * 3).bfloat16(), torch.randn(1, 8, generator=g).bfloat16()
    raw = w.view(torch.int16).numpy().tobytes()
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "bf16",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [1, 8])],
        [helper.make_tensor("w", TensorProto.BFLOAT16, [1, 8], raw, raw=True)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    emulator = OnnxEmulator(model, "fp32")
    assert emulator.program.constants["w"].dtype == torch.float32
    assert torch.equal(emulator.program.constants["w"], w.float())
    assert torch.equal(emulator.run(x).outputs[0], x.float() + w.float())  # float32 sums of bfloat16 values: exact
