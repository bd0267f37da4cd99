"""``bnfold.audit`` is one API with ``fold`` and ``check``: it takes the path of a .pt2 or .onnx file, draws
random batches (flagged as weak evidence) when given no inputs, refuses a training-mode program with the
exported ``TrainingModeError``, and notes when it audited an eval-mode copy of a module in training mode."""

import pytest
import torch
from numerics_helpers import onnx_keeping_batch_norms, small_net

import bnfold


def _net():
    return small_net()


X = torch.randn(1, 3, 8, 8)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("audit_api")
    net = _net()
    torch.export.save(torch.export.export(net, (X,)), str(d / "m.pt2"))
    pytest.importorskip("onnx").save(onnx_keeping_batch_norms(net, X), str(d / "m.onnx"))
    return d


@pytest.mark.parametrize("name", ["m.pt2", "m.onnx"])
def test_a_path_is_audited_as_fold_reads_it(files, name):
    rep = bnfold.audit(str(files / name), [(X,)], local=False)
    assert rep.name == name and len(rep.norms) == 2 and rep.folded is not None
    rep = bnfold.audit(files / name, [(X,)], local=False)  # a PathLike too
    assert rep.name == name


def test_a_path_that_is_no_model_is_one_line(tmp_path):
    bad = tmp_path / "m.pt2"
    bad.write_text("not a zip")
    with pytest.raises(bnfold.ModelFileError):
        bnfold.audit(str(bad))


@pytest.mark.parametrize("name", ["m.pt2", "m.onnx"])
def test_no_inputs_draws_random_batches_and_flags_them(files, name):
    rep = bnfold.audit(str(files / name), local=False)
    assert rep.random_inputs and rep.batches == 8 and rep.samples == 8
    assert "weak evidence" in rep.table()
    assert rep.to_dict()["random_inputs"] is True


def test_no_inputs_for_a_program():
    rep = bnfold.audit(torch.export.export(_net(), (X,)), local=False)
    assert rep.random_inputs and rep.batches == 8


def test_a_module_needs_inputs():
    with pytest.raises(TypeError, match="needs input batches"):
        bnfold.audit(_net())


def test_a_training_mode_program_raises_the_exported_error():
    ep = torch.export.export(_net().train(), (torch.randn(2, 3, 8, 8),))
    with pytest.raises(bnfold.TrainingModeError, match="training mode"):
        bnfold.audit(ep, [(torch.randn(2, 3, 8, 8),)])


def test_a_training_mode_module_is_audited_as_an_eval_copy_with_a_note():
    net = _net().train()
    rep = bnfold.audit(net, [(X,)], local=False)
    assert net.training  # left as it was
    assert any("audited an eval-mode copy" in n for n in rep.notes)
    assert rep.to_dict()["notes"] == rep.notes and "note: the module was in training mode" in rep.table()
    assert bnfold.audit(net.eval(), [(X,)], local=False).notes == []
