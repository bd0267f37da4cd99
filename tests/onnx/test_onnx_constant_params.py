"""Parameter counts when an ONNX model keeps its tensors in ``Constant`` nodes (paddle2onnx does):
``report.stats`` counts them, so the saved-parameter count is what the fold removed."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx_testkit import ort_run

import bnfold


def _constant(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=f"const_{name}", value=numpy_helper.from_array(value, name))


def _model(bias: bool) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    c = 6
    tensors = {
        "W": rng.standard_normal((c, 3, 3, 3)).astype(np.float32),
        "scale": rng.uniform(0.5, 1.5, c).astype(np.float32),
        "B": rng.standard_normal(c).astype(np.float32),
        "mean": rng.standard_normal(c).astype(np.float32),
        "var": rng.uniform(0.5, 2.0, c).astype(np.float32),
    }
    if bias:
        tensors["cb"] = rng.standard_normal(c).astype(np.float32)
    nodes = [_constant(k, v) for k, v in tensors.items()]
    nodes.append(helper.make_node("Conv", ["x", "W"] + (["cb"] if bias else []), ["c"], name="conv", pads=[1] * 4))
    nodes.append(helper.make_node("BatchNormalization", ["c", "scale", "B", "mean", "var"], ["y"], name="bn"))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, 5, 5])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 6, 5, 5])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_constant_held_parameters_are_counted():
    for bias in (False, True):
        model = _model(bias)
        held = sum(
            int(np.prod(numpy_helper.to_array(n.attribute[0].t).shape))
            for n in model.graph.node
            if n.op_type == "Constant"
        )
        result = bnfold.fold(model)
        assert [f.norm for f in result.report.folded] == ["bn"]
        assert "BatchNormalization" not in [n.op_type for n in result.model.graph.node]
        stats = result.report.stats
        assert stats.params_before == held  # every tensor of the model sits in a Constant node
        # the BN's four vectors go; a conv without a bias gains one
        assert stats.params_saved == 4 * 6 - (0 if bias else 6), stats
        assert stats.bytes_saved == 4 * stats.params_saved
        feeds = {"x": np.random.default_rng(1).standard_normal((2, 3, 5, 5)).astype(np.float32)}
        (a,), (b,) = ort_run(model, feeds), ort_run(result.model, feeds)
        assert np.abs(a - b).max() <= 1e-5 * (1 + np.abs(a).max())
