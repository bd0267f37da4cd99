"""Tensors held as get_attr attributes (how ExecuTorch passes register them)."""

import torch

import bnfold
from bnfold.torch_export.program import ProgramEditor
from bnfold_testutil import TwoPaths, assert_matches, export, norm_nodes, randomize_bn, reference, run


def _weight_as_get_attr_per_user(ep):
    """The conv weight moved to one buffer attribute, read by a separate get_attr node per user."""
    editor = ProgramEditor(ep)
    weight = editor.placeholder_for_target("conv.weight")
    editor.gm.register_buffer("shared_w", editor.tensor(weight).detach().clone())
    for user in list(weight.users):
        with editor.graph.inserting_before(user):
            attr = editor.graph.get_attr("shared_w")
        attr.meta = dict(weight.meta)
        user.replace_input_with(weight, attr)
    editor.drop_if_unused(weight)
    return editor.build()


def test_one_attribute_read_by_two_get_attr_nodes_is_shared():
    model = randomize_bn(TwoPaths()).eval()
    x = (torch.randn(2, 3, 8, 8),)
    ep = _weight_as_get_attr_per_user(export(model, x, "edge"))
    attrs = [n for n in ep.graph.nodes if n.op == "get_attr"]
    assert len(attrs) == 2 and all(len(n.users) == 1 for n in attrs)
    original = ep.graph_module.shared_w.clone()
    result = bnfold.fold(ep)
    assert norm_nodes(result.model) == []
    # Each path got its own folded weight; the one attribute both read was never scaled in place.
    for out, ref in zip(run(result.model, *x), reference(model, *x)):
        assert_matches(out, ref)
    assert torch.equal(ep.graph_module.shared_w, original)
