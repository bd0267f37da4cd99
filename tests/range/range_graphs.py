"""Hand-built ONNX graphs for the range rewrite's bounds and refusals: a conv whose output is too large for fp16
(its bias 1e5), what follows it, and a conv that brings it back; and the same chain as a torch module."""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

SHAPE = (2, 3, 4, 4)


def _model(nodes: list, inits: dict, channels: int = 4) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = {
        "wa": rng.standard_normal((channels, SHAPE[1], 1, 1)).astype(np.float32),
        "ba": np.full(channels, 1e5, np.float32),
        "wb": (rng.standard_normal((channels, channels, 1, 1)) / 1e5).astype(np.float32),
        **inits,
    }
    last = nodes[-1].output[0] if nodes else "h0"
    nodes = [helper.make_node("Conv", ["x", "wa", "ba"], ["h0"]), *nodes, helper.make_node("Conv", [last, "wb"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "range",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [nh.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def relu_add_chain(n: int) -> onnx.ModelProto:
    """``n`` times ``relu(h) + 1`` after the hot conv: ``2n`` ops, each value a little larger than the one before
    (the last is tried first, and its walk back to the conv is ``2n`` ops deep)."""
    nodes = []
    for i in range(n):
        nodes.append(helper.make_node("Relu", [f"h{i}"], [f"r{i}"]))
        nodes.append(helper.make_node("Add", [f"r{i}", "one"], [f"h{i + 1}"]))
    return _model(nodes, {"one": np.ones(1, np.float32)})


def plus_scaled_constant(c: list[float]) -> onnx.ModelProto:
    """``conv(x) + x[:, :1] * c``: its plan scales the conv's weights and the constant ``c`` together."""
    nodes = [
        helper.make_node("Slice", ["x", "s0", "s1", "s_axis"], ["x1"]),
        helper.make_node("Mul", ["x1", "c"], ["xc"]),
        helper.make_node("Add", ["h0", "xc"], ["h1"]),
    ]
    c = np.asarray(c, np.float32).reshape(1, -1, 1, 1)
    ints = {k: np.array([v], np.int64) for k, v in (("s0", 0), ("s1", 1), ("s_axis", 1))}
    return _model(nodes, {"c": c, **ints})


def power_chain(op: str, n: int, exponent: float | None = None) -> onnx.ModelProto:
    """``n`` times ``op`` (``Sqrt``, or ``Pow`` by the constant ``exponent``) after the hot conv."""
    nodes, inits = [], {}
    if exponent is not None:
        inits["p"] = np.array(exponent, np.float32)
    for i in range(n):
        nodes.append(helper.make_node(op, [f"h{i}", *(["p"] if exponent is not None else [])], [f"h{i + 1}"]))
    return _model(nodes, inits)


def layer_norm(eps: float) -> onnx.ModelProto:
    """A LayerNormalization of epsilon ``eps`` reading the hot conv: the scale moves into its eps."""
    nodes = [helper.make_node("LayerNormalization", ["h0", "g"], ["h1"], axis=-1, epsilon=eps)]
    return _model(nodes, {"g": np.ones(4, np.float32)})


def batches(n: int = 2, seed: int = 0) -> list[tuple[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(SHAPE, generator=g),) for _ in range(n)]


class ReluAddChain(torch.nn.Module):
    """:func:`relu_add_chain` as a torch module."""

    shapes = (SHAPE,)

    def __init__(self, n: int):
        super().__init__()
        self.n = n
        self.a = torch.nn.Conv2d(3, 4, 1)
        self.b = torch.nn.Conv2d(4, 4, 1, bias=False)
        with torch.no_grad():
            self.a.bias.fill_(1e5)
            self.b.weight.div_(1e5)

    def forward(self, x):
        y = self.a(x)
        for _ in range(self.n):
            y = y.relu() + 1.0
        return self.b(y)


class PlusScaledConstant(torch.nn.Module):
    """:func:`plus_scaled_constant` as a torch module (``c`` a buffer: a constant tensor of the program)."""

    def __init__(self, c: list[float]):
        super().__init__()
        self.a = torch.nn.Conv2d(3, 4, 1)
        self.b = torch.nn.Conv2d(4, 4, 1, bias=False)
        self.register_buffer("c", torch.tensor(c).reshape(1, -1, 1, 1))
        with torch.no_grad():
            self.a.bias.fill_(1e5)
            self.b.weight.div_(1e5)

    def forward(self, x):
        return self.b(self.a(x) + x[:, :1] * self.c)
