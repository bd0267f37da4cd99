"""What the fx adapter keeps of the constants it hands out: a tensor of the program is given as it is (nothing
copied); a value computed from such tensors (``weight_norm``'s weight, ``w * 2``) is evaluated in float64 and
kept for the next call only under ``fold_math.LARGE_BYTES``, as the ONNX adapter keeps its float64 copies
(tests/onnx/test_stream_range.py)."""

from __future__ import annotations

import torch

from bnfold import fold_math
from bnfold.torch_export.fold import range_edit_program


class _Operands(torch.nn.Module):
    """``(linear(x) + big * 2) * (small * 3)``, the linear's weight computed by ``weight_norm`` (512 x 512: 1 MiB in
    float32, 2 MiB in float64, as ``big * 2``)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(512, 512))
        self.big = torch.nn.Parameter(torch.randn(512, 512, generator=torch.Generator().manual_seed(0)))
        self.small = torch.nn.Parameter(torch.full((512,), 0.5))

    def forward(self, x):
        return (self.linear(x) + self.big * 2.0) * (self.small * 3.0)


def _held(g) -> list[int]:
    return [(n.name, t.nbytes) for n, t in g.editor._computed.items() if isinstance(t, torch.Tensor)]


def test_the_adapter_keeps_no_large_float64_computed_constant():
    model = _Operands().eval()
    ep = torch.export.export(model, (torch.randn(512, 512),))
    seen = {}

    def edit(g):
        add = next(n for n in g.ordered_nodes() if n.target == torch.ops.aten.add.Tensor)
        (mul,) = add.users
        big, small = add.args[1], mul.args[1]  # ``big * 2`` and ``small * 3``: computed constants
        seen["big"] = (g.constant(big), g.constant(big))
        seen["small"] = (g.constant(small), g.constant(small))
        seen["is_constant"] = [g.is_constant(v) for v in (big, small, add, add.args[0], 2.0, True)]
        layer = next(iter(g.layers()))
        seen["weights"] = (g.weights(layer).weight, g.weights(layer).weight)
        seen["held"] = _held(g)
        return []

    range_edit_program(ep, edit)
    a, b = seen["big"]
    assert a is not b and torch.equal(a, b) and torch.equal(a, model.big.detach().double() * 2.0)
    a, b = seen["small"]
    assert a is b and a.dtype == torch.float64 and bool((a == 1.5).all())
    assert seen["is_constant"] == [True, True, False, False, True, False]
    a, b = seen["weights"]  # weight_norm's weight, computed in float64 and cast back to float32
    assert a is not b and torch.equal(a, b) and a.dtype == torch.float32
    assert torch.allclose(a, model.linear.weight.detach(), rtol=1e-6, atol=0)
    assert seen["held"] and max(n for _, n in seen["held"]) < fold_math.LARGE_BYTES, seen["held"]


def test_a_constant_computed_from_parameters_records_no_autograd_graph():
    """The evaluator computes from the program's Parameters (``requires_grad``) without autograd: no ``grad_fn``
    kept on a computed value, nor the graph of its float64 inputs behind it."""
    ep = torch.export.export(_Operands().eval(), (torch.randn(512, 512),))
    seen = []

    def edit(g):
        add = next(n for n in g.ordered_nodes() if n.target == torch.ops.aten.add.Tensor)
        seen.extend(g.constant(v) for v in (add.args[1], next(iter(add.users)).args[1]))  # big * 2, small * 3
        seen.append(g.editor.constant_value(next(iter(g.layers())).node.args[1]))  # weight_norm's weight
        return []

    range_edit_program(ep, edit)
    assert len(seen) == 3 and all(v is not None and v.dtype == torch.float64 for v in seen)
    assert [(v.grad_fn, v.requires_grad) for v in seen] == [(None, False)] * 3


class _LargeComputedScale(torch.nn.Module):
    """``bn(conv(x) * exp(p * 2))``: a computed constant of 1 MiB (16 x 128 x 128 in float32) that is no
    per-channel vector, so the chain from the BatchNorm stops at the multiply."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(16)
        self.p = torch.nn.Parameter(torch.rand(16, 128, 128, generator=torch.Generator().manual_seed(0)) + 0.5)

    def forward(self, x):
        return self.bn(self.conv(x) * (self.p * 2.0).exp())


def test_a_large_computed_constant_the_chain_rule_refuses_is_evaluated_once(monkeypatch):
    """The chain rule asks for an elementwise op's constant once: a large computed one, which the adapter does not
    keep (:func:`test_the_adapter_keeps_no_large_float64_computed_constant`), is evaluated once, not once to learn
    that it is a constant and again for its shape (twice after 10a22e0)."""
    import bnfold
    from bnfold.torch_export.tensors import FxTensors

    ep = torch.export.export(_LargeComputedScale().eval(), (torch.randn(1, 8, 128, 128),))
    evaluated, real = [], FxTensors._evaluate

    def counting(self, node):
        evaluated.append(node.name)
        return real(self, node)

    monkeypatch.setattr(FxTensors, "_evaluate", counting)
    result = bnfold.fold(ep)
    assert [s.code.value for s in result.report.skipped] == ["no_layer"], result.report.skipped
    assert sum(name.startswith("exp") for name in evaluated) == 1, evaluated
