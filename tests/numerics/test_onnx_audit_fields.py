"""The ONNX audit's hooks (:class:`bnfold.numerics.onnx_program.OnnxAudit`): the cost plan reads each node's fields
once, and a program reads the model as it is when it is made, so a model edited after the plan or after a program
is read again."""

import pytest
import torch
from numerics_helpers import onnx_keeping_batch_norms, small_net

import bnfold.numerics.onnx_program as onnx_program_module
from bnfold.frontends import frontend_for
from bnfold.numerics.audit_memory import AuditHold

onnx = pytest.importorskip("onnx")


@pytest.fixture
def model():
    net = small_net()
    return onnx_keeping_batch_norms(net, torch.randn(1, 3, 8, 8))


def test_each_caller_gets_its_own_hooks(model):
    fe = frontend_for(model)
    assert fe.numerics() is not fe.numerics()


def test_the_plan_reads_the_fields_once_and_each_program_reads_the_model(model, monkeypatch):
    reads = []
    real = onnx_program_module.node_fields

    def counting(m):
        reads.append(m)
        return real(m)

    monkeypatch.setattr(onnx_program_module, "node_fields", counting)
    fmt = frontend_for(model).numerics()
    fmt.plan(model, [(torch.randn(1, 3, 8, 8),)], runs=3, name=None, hold=AuditHold.of(3, torch.float32, False))
    assert reads == [model]
    first, again = fmt.program(model), fmt.program(model)
    assert [s.op for s in first.steps] == [s.op for s in again.steps]


def test_a_model_edited_after_its_program_is_read_again(model):
    fmt = frontend_for(model).numerics()
    x = torch.randn(1, 3, 8, 8)
    fmt.plan(model, [(x,)], runs=3, name=None, hold=AuditHold.of(3, torch.float32, False))
    before = fmt.program(model)
    sigmoid = next(n for n in model.graph.node if n.op_type == "Sigmoid")
    sigmoid.op_type = "Tanh"  # in place, after the program of the plan's read
    after = fmt.program(model)
    assert "Tanh" not in [s.op for s in before.steps]
    assert [s.op for s in after.steps].count("Tanh") == 1


@pytest.mark.parametrize("edit", ["op_type", "input", "removed"])
def test_a_model_edited_between_plan_and_program_is_read_again(model, edit):
    """A node edited in place, rewired or removed after the plan is read by the program (a plan's read handed to
    the program by the model's identity alone ran its stale op types and inputs)."""
    fmt = frontend_for(model).numerics()
    fmt.plan(model, [(torch.randn(1, 3, 8, 8),)], runs=3, name=None, hold=AuditHold.of(3, torch.float32, False))
    nodes = model.graph.node
    i, sigmoid = next((i, n) for i, n in enumerate(nodes) if n.op_type == "Sigmoid")
    if edit == "op_type":
        sigmoid.op_type = "Tanh"
    elif edit == "input":
        sigmoid.input[0] = model.graph.input[0].name  # reads the graph input instead
    else:
        reader = next(n for n in nodes if sigmoid.output[0] in n.input)
        reader.input[list(reader.input).index(sigmoid.output[0])] = sigmoid.input[0]
        del nodes[i]
    steps = fmt.program(model).steps
    assert [(s.op, list(s.ins), list(s.outs)) for s in steps] == [
        (n.op_type, list(n.input), list(n.output)) for n in model.graph.node if n.op_type != "Constant"
    ]
