"""``bnfold.fold(ep, inplace=True)``: the input is consumed, the result is the plain fold's.

The plain fold never touches its input (graph, signature, tensors: checked on every real-architecture
case in every IR); the in-place fold gives the same program (the same generated code, signature,
tensors bit for bit, constants) and the same report, keeps no second copy of a tensor it replaced,
and is refused where it is not offered (an ONNX model, an ``nn.Module``)."""

from __future__ import annotations

import copy
import gc
import weakref

import pytest
import torch

import bnfold
from bnfold_testutil import onnx_conv_bn, randomize_bn
from fold_cases import REAL_CASES, variants
from zoo import ConvBn

pytest.importorskip("executorch.exir")

IRS = ["default", "decomposed", "edge"]


def _conv_bn() -> ConvBn:
    return ConvBn(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))


def _program_state(ep) -> dict:
    """What a program is: its code, node names and targets, signature, tensors (by identity and value)."""
    return {
        "code": ep.graph_module.code,
        "nodes": [(n.name, n.op, str(n.target), str(n.args)) for n in ep.graph.nodes],
        "signature": str(ep.graph_signature),
        "state_ids": {k: id(v) for k, v in ep.state_dict.items()},
        "state": {k: v.detach().clone() for k, v in ep.state_dict.items()},
        "constants": {k: v.detach().clone() for k, v in ep.constants.items() if isinstance(v, torch.Tensor)},
    }


def _same_state(a: dict, b: dict) -> bool:
    plain = ("code", "nodes", "signature", "state_ids")
    return (
        all(a[k] == b[k] for k in plain)
        and a["state"].keys() == b["state"].keys()
        and all(torch.equal(a["state"][k], b["state"][k]) for k in a["state"])
        and a["constants"].keys() == b["constants"].keys()
        and all(torch.equal(a["constants"][k], b["constants"][k]) for k in a["constants"])
    )


def _report(result) -> dict:
    out = result.report.to_dict()
    out["summary"].pop("seconds", None)  # the time of the call
    return out


@pytest.mark.parametrize("ir", IRS)
@pytest.mark.parametrize("case, dynamic", variants(REAL_CASES))
def test_inplace_fold_equals_the_plain_fold_which_leaves_its_input(case, dynamic, ir):
    ep = case.program(ir, dynamic)
    consumed = copy.deepcopy(ep)
    before = _program_state(ep)
    plain = bnfold.fold(ep)
    assert _same_state(_program_state(ep), before), "the plain fold modified its input"
    inplace = bnfold.fold(consumed, inplace=True)
    folded, again = _program_state(plain.model), _program_state(inplace.model)
    folded.pop("state_ids"), again.pop("state_ids")  # distinct tensors, equal values
    assert folded["code"] == again["code"]
    assert folded["nodes"] == again["nodes"]
    assert folded["signature"] == again["signature"]
    assert list(folded["state"]) == list(again["state"])
    assert all(torch.equal(folded["state"][k], again["state"][k]) for k in folded["state"])
    assert list(folded["constants"]) == list(again["constants"])
    assert all(torch.equal(folded["constants"][k], again["constants"][k]) for k in folded["constants"])
    assert _report(plain) == _report(inplace)
    x = case.inputs()
    with torch.no_grad():
        for a, b in zip(
            torch.utils._pytree.tree_leaves(plain.model.module()(*x)),
            torch.utils._pytree.tree_leaves(inplace.model.module()(*x)),
            strict=True,
        ):
            assert torch.equal(a, b)


def test_inplace_fold_releases_what_it_replaced():
    """The folded weight replaces the input's in its own state_dict: once the module that shared it is
    gone, the old tensor is freed during the fold.  The plain fold keeps the input's tensor."""
    model = randomize_bn(_conv_bn()).eval()
    x = (torch.randn(2, 3, 8, 8),)
    for inplace in (False, True):
        ep = torch.export.export(copy.deepcopy(model), x)
        key = next(k for k in ep.state_dict if k.endswith("weight") and ep.state_dict[k].dim() == 4)
        old = weakref.ref(ep.state_dict[key])
        gc.collect()
        result = bnfold.fold(ep, inplace=inplace)
        gc.collect()
        assert result.report.folded
        if inplace:
            assert old() is None, "the in-place fold kept the weight it replaced"
            assert ep.state_dict is result.model.state_dict  # the input's dict is the result's
        else:
            assert old() is not None and ep.state_dict[key] is old()


def test_inplace_is_refused_where_the_fold_makes_a_copy():
    with pytest.raises(TypeError, match="inplace=True folds an ExportedProgram"):
        bnfold.fold(onnx_conv_bn(), inplace=True)
    with pytest.raises(TypeError, match="inplace=True folds an ExportedProgram"):
        bnfold.fold(_conv_bn().eval(), (torch.randn(1, 3, 8, 8),), inplace=True)


def test_the_api_says_the_input_is_consumed():
    doc = bnfold.fold.__doc__
    assert "inplace=True" in doc and "CONSUMES the input" in doc and "must not be used again" in doc


def test_a_value_computed_from_a_user_input_copies_no_weight(monkeypatch):
    """A residual add after a linear reads the embedding's output: the chain walk asks whether it is a
    constant, and the embedding reads the token ids (a user input), so it is not.  No weight is copied
    to float64 to find that out (the table of a 1B model's embedding was: 0.5 GB for nothing)."""

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.lin = torch.nn.Embedding(1000, 16), torch.nn.Linear(16, 16)

        def forward(self, ids):
            x = self.emb(ids)
            return x + self.lin(x)

    ep = torch.export.export(M().eval(), (torch.randint(0, 1000, (2, 5)),))
    copied = []
    double = torch.Tensor.double

    def spy(t, *args, **kwargs):
        copied.append(tuple(t.shape))
        return double(t, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "double", spy)
    bnfold.fold(ep)
    assert (1000, 16) not in copied, copied


def test_a_pt2_path_folds_in_place_to_the_same_program(tmp_path, monkeypatch):
    """``bnfold.fold(path)`` reads the program itself, so it folds it in place: the same program as the plain
    fold of the program read from the same file."""
    import bnfold.torch_export.fold as fold_module

    path = tmp_path / "m.pt2"
    x = (torch.randn(2, 3, 8, 8),)
    torch.export.save(torch.export.export(randomize_bn(_conv_bn()).eval(), x), str(path))
    plain = bnfold.fold(torch.export.load(str(path)))
    seen = []
    real = fold_module.fold_program

    def spy(ep, *args, **kwargs):
        seen.append(kwargs.get("inplace"))
        return real(ep, *args, **kwargs)

    monkeypatch.setattr("bnfold.torch_export.fold_program", spy)
    from_path = bnfold.fold(str(path))
    assert seen == [True]
    assert from_path.model.graph_module.code == plain.model.graph_module.code
    assert all(torch.equal(from_path.model.state_dict[k], v) for k, v in plain.model.state_dict.items())
    assert _report(from_path) == _report(plain)
