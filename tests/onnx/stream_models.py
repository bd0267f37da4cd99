"""A model for the streamed ONNX fold's tests and benchmark (``benchmarks/onnx_stream.py``)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def linear_stack(n_layers: int, width: int, channels: int = 4, size: int = 8, seed: int = 0) -> onnx.ModelProto:
    """A conv + BatchNormalization, a projection, then ``n_layers`` MatMul (``width``² float32, random) each
    followed by a per-channel Mul and Add (a folded BatchNorm's spelling) and a Relu."""
    rng = np.random.default_rng(seed)
    c = channels
    inits = [
        numpy_helper.from_array(rng.standard_normal((c, 3, 3, 3)).astype(np.float32), "conv.w"),
        numpy_helper.from_array(rng.uniform(0.5, 2.0, c).astype(np.float32), "bn.scale"),
        numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "bn.bias"),
        numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "bn.mean"),
        numpy_helper.from_array(rng.uniform(0.5, 2.0, c).astype(np.float32), "bn.var"),
        numpy_helper.from_array(np.array([1, c * size * size], np.int64), "flat"),
        numpy_helper.from_array((rng.standard_normal((c * size * size, width)) * 0.02).astype(np.float32), "proj"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "conv.w"], ["c0"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("BatchNormalization", ["c0", "bn.scale", "bn.bias", "bn.mean", "bn.var"], ["b0"], name="bn"),
        helper.make_node("Reshape", ["b0", "flat"], ["h0"], name="flat"),
        helper.make_node("MatMul", ["h0", "proj"], ["h1"], name="proj"),
    ]
    prev = "h1"
    for i in range(n_layers):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        inits += [
            numpy_helper.from_array(w, f"l{i}.w"),
            numpy_helper.from_array(rng.uniform(0.5, 2.0, width).astype(np.float32), f"l{i}.s"),
            numpy_helper.from_array(rng.standard_normal(width).astype(np.float32), f"l{i}.b"),
        ]
        nodes += [
            helper.make_node("MatMul", [prev, f"l{i}.w"], [f"m{i}"], name=f"l{i}"),
            helper.make_node("Mul", [f"m{i}", f"l{i}.s"], [f"s{i}"], name=f"l{i}.mul"),
            helper.make_node("Add", [f"s{i}", f"l{i}.b"], [f"a{i}"], name=f"l{i}.add"),
            helper.make_node("Relu", [f"a{i}"], [f"r{i}"], name=f"l{i}.relu"),
        ]
        prev = f"r{i}"
    graph = helper.make_graph(
        nodes,
        "stack",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, width])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def largest_tensor(model: onnx.ModelProto) -> int:
    """Bytes of the model's largest initializer."""
    return max(len(t.raw_data) for t in model.graph.initializer)
