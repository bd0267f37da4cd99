"""The planner's caches after a rewrite inserts a multiply: every op it keeps is the graph's op now.  A scaled
value that is also a graph output gets a multiply before that output; the ONNX adapter then renames the
producer's value, so readers it was not handed (here the Relu) read another value, and their cached ops must
be read again (``Planner.forget``'s ``touched``)."""

from __future__ import annotations

import numpy as np
import torch
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

import bnfold
from bnfold.engine import range_planner


def _output_and_reader():
    """``z = conv_a(x) * sigmoid(conv_g(x)) * 1e-3``, a graph output and read by ``relu`` then ``conv_b``; conv_a's
    bias 1e5 puts its output past fp16."""
    rng = np.random.default_rng(0)
    inits = {
        "wa": rng.standard_normal((4, 3, 1, 1)).astype(np.float32),
        "ba": np.full(4, 1e5, np.float32),
        "wg": rng.standard_normal((4, 3, 1, 1)).astype(np.float32),
        "k": np.array([1e-3], np.float32),
        "wb": (rng.standard_normal((4, 4, 1, 1)) / 1e5).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "wa", "ba"], ["h0"]),
        helper.make_node("Conv", ["x", "wg"], ["g"]),
        helper.make_node("Sigmoid", ["g"], ["sg"]),
        helper.make_node("Mul", ["sg", "k"], ["sk"]),
        helper.make_node("Mul", ["h0", "sk"], ["z"]),
        helper.make_node("Relu", ["z"], ["r"]),
        helper.make_node("Conv", ["r", "wb"], ["y"]),
    ]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "z")]
    graph = helper.make_graph(
        nodes,
        "output_and_reader",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 4])],
        outputs,
        [nh.from_array(v, n) for n, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_multiply_before_a_graph_output_leaves_no_stale_op_in_the_planner(monkeypatch):
    stale, checked = [], []
    forget = range_planner.Planner.forget

    def checking(self, nodes, touched=()):
        forget(self, nodes, touched)
        for key, op in list(self._ops.items()):
            if isinstance(key, tuple) and key[0] == "op" and op is not None and key[1] in self.order:
                checked.append(key[1])
                if repr(self.g.range_op(key[1])) != repr(op):
                    stale.append(self.g.node_name(key[1]))

    monkeypatch.setattr(range_planner.Planner, "forget", checking)
    model = _output_and_reader()
    result = bnfold.fold(model, fp16_range=[(torch.randn(2, 3, 4, 4),) for _ in range(2)])
    assert len(result.model.graph.node) == len(model.graph.node) + 1  # the multiply before the output z
    assert checked
    assert stale == []
