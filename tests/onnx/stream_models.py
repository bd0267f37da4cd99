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


def edge_cases(dtype=np.float32, width: int = 512, seed: int = 0) -> onnx.ModelProto:
    """Weights of ``width``² (several blocks and stages of a deferred product) in ``dtype``, each MatMul stored
    ``[in, out]``, on the cases a streamed fold must write as the plain fold does:

    * ``chain``: MatMul -> Mul(1.5) -> Mul(8): the composed product overflows one channel, the far Mul is
      dropped and the chain retried on the same weight (a refusal mid-chain), the near Mul folds;
    * ``shared_a`` / ``shared_b``: two MatMuls read one weight, each followed by its own Mul (a private copy);
    * ``refused``: the product overflows (a value at a quarter of the dtype's max, times 8): nothing folds;
    * ``under``: a subnormal weight times 2^-8 underflows to zero: nothing folds;
    * ``fan_a`` / ``fan_b``: one Mul feeds two MatMuls, the second's product overflows: neither folds;
    * ``conv``: a Conv [128, 32, 3, 3] and a BatchNormalization (its output channels).
    """
    rng = np.random.default_rng(seed)
    kind = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    top, tiny = float(np.finfo(dtype).max), float(np.finfo(dtype).smallest_subnormal)

    def weight(shape, big_at=None, value=0.0):
        w = (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(dtype)
        if big_at is not None:
            w[big_at] = value
        return w

    def scales(big_at=None, value=1.0, base=None):
        s = rng.uniform(0.75, 1.5, width) if base is None else np.full(width, base)
        if big_at is not None:
            s[big_at] = value
        return s.astype(dtype)

    n = width
    inits = {
        "w.chain": weight((n, n), (3, 7), top / 4),
        "s.chain1": scales(base=1.5),
        "s.chain2": scales(7, 8.0, base=1.0),
        "w.shared": weight((n, n)),
        "s.shared_a": scales(),
        "s.shared_b": scales(),
        "w.refused": weight((n, n), (5, 9), top / 4),
        "s.refused": scales(9, 8.0),
        "w.under": weight((n, n), (2, 11), 4 * tiny),
        "s.under": scales(11, 2.0**-8),
        "s.fan": scales(13, 4.0),
        "w.fan_a": weight((n, n)),
        "w.fan_b": weight((n, n), (13, 1), top / 2),
        "conv.w": weight((128, 32, 3, 3)),
        "bn.scale": rng.uniform(0.5, 2.0, 128).astype(dtype),
        "bn.bias": rng.standard_normal(128).astype(dtype),
        "bn.mean": rng.standard_normal(128).astype(dtype),
        "bn.var": rng.uniform(0.5, 2.0, 128).astype(dtype),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w.chain"], ["chain.m"], name="chain"),
        helper.make_node("Mul", ["chain.m", "s.chain1"], ["chain.s1"], name="chain.mul1"),
        helper.make_node("Mul", ["chain.s1", "s.chain2"], ["y.chain"], name="chain.mul2"),
        helper.make_node("MatMul", ["x", "w.shared"], ["shared_a.m"], name="shared_a"),
        helper.make_node("Mul", ["shared_a.m", "s.shared_a"], ["y.shared_a"], name="shared_a.mul"),
        helper.make_node("MatMul", ["x", "w.shared"], ["shared_b.m"], name="shared_b"),
        helper.make_node("Mul", ["shared_b.m", "s.shared_b"], ["y.shared_b"], name="shared_b.mul"),
        helper.make_node("MatMul", ["x", "w.refused"], ["refused.m"], name="refused"),
        helper.make_node("Mul", ["refused.m", "s.refused"], ["y.refused"], name="refused.mul"),
        helper.make_node("MatMul", ["x", "w.under"], ["under.m"], name="under"),
        helper.make_node("Mul", ["under.m", "s.under"], ["y.under"], name="under.mul"),
        helper.make_node("Mul", ["x", "s.fan"], ["fan.x"], name="fan.mul"),
        helper.make_node("MatMul", ["fan.x", "w.fan_a"], ["y.fan_a"], name="fan_a"),
        helper.make_node("MatMul", ["fan.x", "w.fan_b"], ["y.fan_b"], name="fan_b"),
        helper.make_node("Conv", ["img", "conv.w"], ["conv.y"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node(
            "BatchNormalization",
            ["conv.y", *(f"bn.{k}" for k in ("scale", "bias", "mean", "var"))],
            ["y.conv"],
            name="bn",
        ),
    ]
    outputs = ["y.chain", "y.shared_a", "y.shared_b", "y.refused", "y.under", "y.fan_a", "y.fan_b"]
    graph = helper.make_graph(
        nodes,
        "edge_cases",
        [helper.make_tensor_value_info("x", kind, [2, n]), helper.make_tensor_value_info("img", kind, [1, 32, 4, 4])],
        [helper.make_tensor_value_info(o, kind, [2, n]) for o in outputs]
        + [helper.make_tensor_value_info("y.conv", kind, [1, 128, 4, 4])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
