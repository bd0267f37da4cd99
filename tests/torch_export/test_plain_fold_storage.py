"""The plain fold ``bnfold.fold(ep)`` builds its program once, from a copy of the graph that shares what the fold did
not change: the input's unchanged tensors are the result's (the same objects), every folded tensor is new storage, no
node or ``meta`` dict is shared, so nothing done to the result (its tensors written in place, its graph edited) reaches
the input."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import bnfold
from bnfold_testutil import assert_matches, export, norm_nodes, randomize_bn, reference, run

X = (torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0)),)


class Mixed(nn.Module):
    """A conv + BN that folds (its weight replaced, a bias added), a conv that stays as it is, a BN over a user input
    that cannot fold, a buffer and a lifted constant that the fold does not read."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4)
        self.plain = nn.Conv2d(4, 4, 1)
        self.lone = nn.BatchNorm2d(3)
        self.register_buffer("floor", torch.randn(4, 1, 1))
        self.scale = torch.randn(3, 1, 1)  # a plain tensor attribute: a lifted constant

    def forward(self, x):
        y = self.plain(torch.relu(self.bn(self.conv(x))))
        return torch.maximum(y, self.floor), self.lone(x) * self.scale


def _tensors(ep) -> dict:
    return {k: v for k, v in {**ep.state_dict, **ep.constants}.items() if isinstance(v, torch.Tensor)}


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


@pytest.mark.parametrize("ir", ["default", "decomposed"])
def test_the_result_shares_only_what_the_fold_did_not_change(ir):
    model = randomize_bn(Mixed()).eval()
    ep = export(model, X, ir)
    before = {k: v.detach().clone() for k, v in _tensors(ep).items()}
    code, nodes = ep.graph_module.code, list(ep.graph.nodes)
    result = bnfold.fold(ep)
    folded = result.model
    assert norm_nodes(folded) and len(result.report.folded) == 1  # the lone BN stays: the graph is checked as well
    assert not any("running_mean" in k and "lone" not in k for k in _tensors(folded))

    inputs, outputs = _tensors(ep), _tensors(folded)
    changed = {k for k in outputs if k not in inputs or not torch.equal(outputs[k], inputs[k])}
    assert {"conv.weight", "conv.bias"} <= changed, changed
    kept = set(outputs) - changed
    assert {"plain.weight", "plain.bias", "floor", "scale", "lone.weight"} <= kept
    # unchanged tensors are shared, not copied; a folded one is new storage, in no tensor of the input
    assert all(outputs[k] is inputs[k] for k in kept)
    input_storage = {_storage(t) for t in inputs.values()}
    assert not any(_storage(outputs[k]) in input_storage for k in changed)

    # no node, no meta dict in common
    assert not set(map(id, folded.graph.nodes)) & set(map(id, nodes))
    assert not {id(n.meta) for n in folded.graph.nodes} & {id(n.meta) for n in nodes}
    assert [n.name for n in ep.graph.nodes] == [n.name for n in nodes]

    # what is done to the result stays there
    with torch.no_grad():
        for k in changed:
            outputs[k].add_(1.0)
    for node in folded.graph.nodes:
        node.meta["bnfold_test"] = True
    relu = next(n for n in folded.graph.nodes if n.op == "call_function" and "relu" in str(n.target))
    relu.replace_all_uses_with(relu.args[0])
    folded.graph.erase_node(relu)
    assert ep.graph_module.code == code
    assert not any("bnfold_test" in n.meta for n in ep.graph.nodes)
    after = _tensors(ep)
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    for out, ref in zip(run(ep, *X), reference(model, *X)):
        assert_matches(out, ref)


def test_node_names_fx_would_not_pick_are_kept():
    """A user input named ``input`` (a Python builtin: fx would call a new node ``input_1``) keeps its name: the graph
    signature refers to it."""

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)

        def forward(self, input):
            return self.bn(self.conv(input))

    model = randomize_bn(M()).eval()
    ep = torch.export.export(model, X)
    assert "input" in [n.name for n in ep.graph.nodes]
    folded = bnfold.fold(ep).model
    assert "input" in [n.name for n in folded.graph.nodes]
    assert [s.arg.name for s in folded.graph_signature.input_specs][-1] == "input"
    assert_matches(run(folded, *X), reference(model, *X))


@pytest.mark.parametrize("dynamic", [False, True])
def test_the_program_is_the_constructors_verified_with_its_code_made_on_first_use(monkeypatch, dynamic):
    """``build`` makes the program ``ExportedProgram(...)`` makes (code, signature, guards, call graph, outputs), runs
    every verifier over it, and generates its module's code once, when the code is first read or run."""
    from torch._export.verifier import Verifier

    from bnfold.torch_export import program

    model = randomize_bn(Mixed()).eval()
    shapes = {"x": {0: torch.export.Dim("batch", min=2, max=64)}} if dynamic else None
    ep = torch.export.export(model, X, dynamic_shapes=shapes)
    checks, check = [], Verifier.check
    monkeypatch.setattr(Verifier, "check", lambda self, p: (checks.append(p), check(self, p))[1])
    folded = bnfold.fold(ep).model
    assert folded in checks  # verified as the constructor verifies
    assert "_code" not in vars(folded.graph_module)  # no code generated yet

    monkeypatch.setattr(program, "_lazy_program", lambda *a: None)
    built = bnfold.fold(ep).model  # through the constructor
    assert folded.graph_module.code == built.graph_module.code
    assert "_code" in vars(folded.graph_module)
    assert str(folded.graph_signature) == str(built.graph_signature)
    assert folded._guards_code == built._guards_code
    assert folded.range_constraints == built.range_constraints
    assert [e.fqn for e in folded.module_call_graph] == [e.fqn for e in built.module_call_graph]
    assert [str(e.signature) for e in folded.module_call_graph] == [str(e.signature) for e in built.module_call_graph]
    x = torch.randn(5 if dynamic else 2, 3, 8, 8)
    for a, b in zip(run(folded, x), run(built, x), strict=True):
        assert torch.equal(a, b)
    args = [
        *(
            folded.state_dict[s.target] if s.target in folded.state_dict else folded.constants[s.target]
            for s in folded.graph_signature.input_specs
            if s.target is not None
        ),
        x,
    ]
    for a, b in zip(folded.graph_module(*args), run(built, x), strict=True):
        assert torch.equal(a, b)
