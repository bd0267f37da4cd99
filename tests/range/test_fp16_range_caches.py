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

    def checking(self, nodes, touched=(), added=()):
        forget(self, nodes, touched, added)
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


class _Softmaxed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Conv2d(3, 3, 1), torch.nn.Conv2d(3, 3, 1)

    def forward(self, x):
        y = self.a(x).relu()
        return self.b(y + torch.softmax(x, 1)) + y


def test_a_multiply_in_a_program_takes_its_place_in_the_planners_order():
    """torch.export: a multiply goes before its value's first reader (after the placeholders where that is the first
    node); the key ``Planner.place`` gives each, from the node ``mul_placed`` names, sorts the call_function nodes as
    the graph does, and the order is not numbered again."""
    from bnfold.torch_export.fold import range_edit_program

    checked = []

    def edit(g):
        planner = range_planner.Planner(g, {}, range_planner.Limits(4094.0, 1e4))
        relisted = planner.relisted
        values = {n.name: n for n in g.ordered_nodes()}
        x = next(n for n in g.graph.nodes if n.op == "placeholder" and n.name == "x")
        relu = next(n for n in values.values() if n.users and "relu" in n.name)
        add = next(
            n for n in relu.users if "add" in n.name and len(n.users) == 1 and "conv" in next(iter(n.users)).name
        )
        for value, readers in ((x, None), (x, None), (relu, [add]), (relu, None), (add, None)):
            made = g.producer(g.insert_mul(value, 2.0, readers))
            assert planner.place(made) == [made]
        nodes = g.ordered_nodes()
        assert set(planner.order) == set(nodes) and planner.in_order(reversed(nodes)) == nodes
        assert planner.relisted == relisted
        checked.append(len(nodes))
        return []

    range_edit_program(torch.export.export(_Softmaxed().eval(), (torch.randn(1, 3, 4, 4),)), edit)
    assert checked


def test_a_constant_written_in_place_keeps_no_span(monkeypatch):
    """W is read by a Mul (a constant operand) and by a MatMul (its weight).  The first rewrite scales the Mul's
    operand (a new value, W_range: the Mul's reader reads it), the second the MatMul's weight, now W's only reader:
    in place, under W's name.  The span the planner kept for W from the first was W's old one (2^8 times the
    constant it names now); every span the planner keeps after an edit is its value's constant's now."""
    rng = np.random.default_rng(0)
    n = 64
    inits = {"W": (rng.standard_normal((n, n)) * 3e4).astype(np.float32), "g": np.ones(n, np.float32)}
    nodes = [
        helper.make_node("Mul", ["x2", "W"], ["z"], name="N"),
        helper.make_node("LayerNormalization", ["z", "g"], ["z2"], axis=-1, name="ln2"),
        helper.make_node("MatMul", ["x", "W"], ["h"], name="L"),
        helper.make_node("LayerNormalization", ["h", "g"], ["y"], axis=-1, name="ln1"),
    ]
    inputs = [helper.make_tensor_value_info(v, TensorProto.FLOAT, s) for v, s in (("x", [1, n]), ("x2", [n, n]))]
    outputs = [helper.make_tensor_value_info(v, TensorProto.FLOAT, None) for v in ("z2", "y")]
    graph = helper.make_graph(nodes, "in_place", inputs, outputs, [nh.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    seen, stale = [], []
    forget = range_planner.Planner.forget

    def checking(self, nodes, touched=(), added=()):
        forget(self, nodes, touched, added)
        for value, kept in self._const_spans.items():
            seen.append(value.name)
            if kept != range_planner.span(self._const(value)):
                stale.append(value.name)

    monkeypatch.setattr(range_planner.Planner, "forget", checking)
    batches = [(torch.randn(1, n), torch.randn(n, n) * 100) for _ in range(2)]
    result = bnfold.fold(model, fp16_range=batches)
    names = {i: list(node.input) for i, node in enumerate(result.model.graph.node) if node.op_type in ("Mul", "MatMul")}
    assert sorted(names.values()) == [["x", "W"], ["x2", "W_range"]], names  # W written in place for the MatMul
    assert "W" in seen or "W_range" in seen
    assert stale == []
