"""onnx-ir's pass contract for bnfold's public entry points: ``fold``, ``check``, ``audit`` and ``measure`` never
change the model they are given, in any format (a torch program, an ``nn.Module`` with example inputs, an ONNX
model).  Each model is compared, after every call, with what it was before: the graph, every tensor's values, the
module's mode and parameters, the ONNX bytes."""

from __future__ import annotations

import copy

import pytest
import torch

import bnfold
from bnfold_testutil import Pair, onnx_conv_bn, randomize_bn

onnx = pytest.importorskip("onnx")

X = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))


def _module() -> torch.nn.Module:
    return randomize_bn(Pair(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))).eval()


def _snapshot(model) -> object:
    """What a call must leave as it was."""
    if isinstance(model, onnx.ModelProto):
        return model.SerializeToString()
    if isinstance(model, torch.export.ExportedProgram):
        tensors = {**model.state_dict, **model.constants}
        return (
            model.graph_module.code,
            str(model.graph_signature),
            {k: v.detach().clone() for k, v in tensors.items() if isinstance(v, torch.Tensor)},
        )
    return (model.training, {k: v.detach().clone() for k, v in model.state_dict().items()})


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(u, v) for u, v in zip(a, b))
    return a == b


def _calls(kind: str):
    """``(name, call)`` of every public entry point for a model of ``kind``."""
    inputs = (X,) if kind == "nn_module" else None
    batches = [(X,)] if kind != "onnx" else [(X[:1],), (X[1:],)]
    calls = [
        ("fold", lambda m: bnfold.fold(m, inputs)),
        ("fold lower_unfoldable", lambda m: bnfold.fold(m, inputs, lower_unfoldable=True)),
        ("check", lambda m: bnfold.check(m, inputs)),
        ("audit", lambda m: bnfold.audit(m, batches, profile="htp", bn_eps=1e-9)),
        ("audit fold=False", lambda m: bnfold.audit(m, batches, fold=False, local=False)),
    ]
    if kind != "nn_module":  # bnfold.measure reads a program or an ONNX model
        calls.append(("measure", bnfold.measure))
    if kind == "onnx":
        calls.append(("audit runtime", lambda m: bnfold.audit(m, batches, runtime="torch")))
    return calls


def _model(kind: str):
    if kind == "onnx":
        return onnx_conv_bn()
    module = _module()
    return module if kind == "nn_module" else torch.export.export(module, (X,))


@pytest.mark.parametrize("kind", ["exported_program", "nn_module", "onnx"])
def test_no_public_entry_point_changes_its_input(kind):
    model = _model(kind)
    assert bnfold.frontends.frontend_for(model).name == kind
    before = _snapshot(model)
    for name, call in _calls(kind):
        call(model)
        assert _same(_snapshot(model), before), f"{name} changed the {kind} it was given"


def test_a_module_in_training_mode_stays_in_training_mode():
    module = _module().train()
    before = _snapshot(copy.deepcopy(module))
    bnfold.fold(module, (X,))
    bnfold.audit(module, [(X,)], local=False)
    assert module.training and _same(_snapshot(module), before)
