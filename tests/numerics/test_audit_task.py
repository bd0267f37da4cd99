"""The audit's agreement with fp32 on the task: top-1 along a class axis (``class_axis=`` / ``--class-axis``),
the mask IoU of a probability map (``threshold=`` / ``--threshold``) and the user's metric (``metric=``).

The models are built so that the answer is known: fp16 rounding of the inputs (what every profile does
before an op reads them) flips exactly 3 of 10 predictions, or drops exactly 4 of 16 mask pixels.
"""

import json

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from torch import nn

import bnfold
from bnfold.cli import main

U = 2.0**-10  # fp16's spacing in [1, 2)
# rows (x0, x1) of a 2-class linear classifier logits = (x0, 2 x1 - 1): fp32 predicts class 1 for FLIP,
# fp16 rounds x0 up to 1 + U and x1 down to 1 and predicts class 0 (no tie); KEEP1 / KEEP0 are exact in fp16
FLIP, KEEP1, KEEP0 = [1 + 0.6 * U, 1 + 0.45 * U], [1.0, 1 + 2 * U], [1 + 4 * U, 1.0]
ROWS = torch.tensor([FLIP] * 3 + [KEEP1] * 4 + [KEEP0] * 3)  # 3 of 10 flip: top-1 agreement 0.7


class Classifier(nn.Module):
    def __init__(self, transpose: bool = False):
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.transpose = transpose
        with torch.no_grad():
            self.fc.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0]]))
            self.fc.bias.copy_(torch.tensor([0.0, -1.0]))

    def forward(self, x):
        y = self.fc(x)
        return y.t() if self.transpose else y  # transposed: classes along axis 0


def test_the_classifier_flips_three_of_ten_under_fp16_rounding():
    """The construction itself, without bnfold: fp16-rounded inputs flip exactly the FLIP rows."""
    m = Classifier().eval()
    with torch.no_grad():
        fp32 = m(ROWS).argmax(1)
        half_inputs = m(ROWS.half().float()).argmax(1)
    assert fp32.tolist() == [1] * 7 + [0] * 3
    assert (fp32 != half_inputs).tolist() == [True] * 3 + [False] * 7


@pytest.mark.parametrize("transpose, axis", [(False, None), (False, 1), (False, -1), (True, 0), (True, -2)])
def test_top1_agreement_with_known_flips(transpose, axis):
    m = Classifier(transpose)
    labels = torch.tensor([1] * 7 + [0, 0, 1])  # fp32 gets 9 right, fp16 6 (the 3 flips are errors)
    rep = bnfold.audit(m, [(ROWS,)], profile="fp16", class_axis=axis, labels=labels)
    assert rep.unfolded.top1_agreement == 0.7 and rep.folded.top1_agreement == 0.7
    assert rep.fp32_accuracy == 0.9 and rep.unfolded.accuracy == 0.6
    assert rep.unfolded.class_axis == (1 if axis is None else axis)
    assert rep.unfolded.predictions.tolist() == [0] * 3 + [1] * 4 + [0] * 3
    exact = bnfold.audit(m, [(ROWS,)], profile="fp32", class_axis=axis)
    assert exact.unfolded.top1_agreement == 1.0
    e2e = rep.to_dict()["end_to_end"]["unfolded"]
    assert e2e["top1_agreement"] == 0.7 and e2e["mask_iou"] is None and e2e["metric"] is None


# -- probability maps ---------------------------------------------------------------------------------

H = 2.0**-11  # fp16's spacing in [0.5, 1)


def prob_map(above: int, marginal: int, side: tuple = (4, 8)) -> torch.Tensor:
    """``[1, 1, *side]``: ``above`` pixels at 0.9, ``marginal`` pixels at 0.5 + 0.2 H (above 0.5 in fp32,
    exactly 0.5 in fp16: they leave the mask ``> 0.5``), the rest 0.1."""
    x = torch.full((1, 1, *side), 0.1).flatten()
    x[:above] = 0.9
    x[above : above + marginal] = 0.5 + 0.2 * H
    return x.reshape(1, 1, *side)


def identity_conv_onnx(side: tuple = (4, 8)) -> onnx.ModelProto:
    """An ONNX model whose output is its input, through a 1x1 conv (weight 1, bias 0)."""
    shape = [1, 1, *side]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv")],
        "prob_map",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [
            helper.make_tensor("w", TensorProto.FLOAT, [1, 1, 1, 1], [1.0]),
            helper.make_tensor("b", TensorProto.FLOAT, [1], [0.0]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def identity_conv_module() -> nn.Module:
    conv = nn.Conv2d(1, 1, 1)
    with torch.no_grad():
        conv.weight.fill_(1.0)
        conv.bias.zero_()
    return conv.eval()


@pytest.mark.parametrize("kind", ["onnx", "torch"])
def test_mask_iou_with_a_known_value(kind):
    model = identity_conv_onnx() if kind == "onnx" else identity_conv_module()
    x = prob_map(above=12, marginal=4)
    assert ((x > 0.5) & ~(x.half() > 0.5)).sum() == 4  # the construction: 4 pixels leave the fp16 mask
    rep = bnfold.audit(model, [(x,)], profile="fp16", threshold=0.5)
    assert rep.unfolded.mask_iou == 0.75 and rep.folded.mask_iou == 0.75  # 12 / (12 + 4)
    assert rep.unfolded.threshold == 0.5
    assert bnfold.audit(model, [(x,)], profile="fp32", threshold=0.5).unfolded.mask_iou == 1.0
    # pooled over batches: an empty batch adds nothing (a per-batch mean would say 0.875)
    empty = prob_map(above=0, marginal=0)
    assert bnfold.audit(model, [(x,), (empty,)], profile="fp16", threshold=0.5).unfolded.mask_iou == 0.75
    # both masks empty: they agree that nothing is there
    assert bnfold.audit(model, [(empty,)], profile="fp16", threshold=0.5).unfolded.mask_iou == 1.0


def test_mask_iou_in_the_table_json_and_verdict():
    x = prob_map(above=12, marginal=4)
    rep = bnfold.audit(identity_conv_onnx(), [(x,)], profile="fp16", threshold=0.5, name="map")
    e2e = rep.to_dict()["end_to_end"]
    assert e2e["unfolded"]["mask_iou"] == 0.75 and e2e["folded"]["mask_iou"] == 0.75
    assert e2e["unfolded"]["threshold"] == 0.5 and e2e["unfolded"]["top1_agreement"] is None
    table = rep.table()
    assert "mask IoU w/ fp32 (>0.5)" in table and "0.750" in table
    # real inputs: the verdict judges the task number and cites it next
    assert rep.advice()[0].startswith("verdict: do not deploy under fp16 as is") and not rep.deploy
    assert "mask IoU 75.0% < 99%" in rep.advice()[0]
    assert "on these inputs, agreement with fp32: mask IoU (>0.5) unfolded 0.750, folded 0.750." in rep.advice()
    rand = bnfold.audit(identity_conv_onnx(), [(x,)], profile="fp16", threshold=0.5, random_inputs=True)
    assert not any("on these inputs" in a for a in rand.advice()) and "weak evidence" in rand.advice()[0]
    assert "mask IoU w/ fp32 (>0.5)*" in rand.table() and "weak evidence" in rand.table()


def test_mask_iou_of_a_real_runtime():
    x = prob_map(above=12, marginal=4)
    rep = bnfold.audit(identity_conv_onnx(), [(x,)], profile="fp16", threshold=0.5, runtime="torch")
    # torch half stores the input in fp16: the marginal pixels become 0.5, as under the profile
    assert rep.runtime.unfolded.mask_iou == 0.75 and rep.runtime.folded.mask_iou == 0.75
    assert rep.runtime.to_dict()["unfolded"]["mask_iou"] == 0.75
    assert "real torch IoU>0.5" in rep.table()


# -- the user's metric ------------------------------------------------------------------------------


def test_user_metric_through_the_api_is_weighted_by_batch_size():
    calls = []

    def agreement(output, reference):
        calls.append((output, reference))
        return float((output.argmax(1) == reference.argmax(1)).double().mean())

    batches = [(ROWS[:3],), (ROWS[3:4],)]  # 3 flips, then 1 kept: per batch 0.0 and 1.0
    rep = bnfold.audit(Classifier(), batches, profile="fp16", metric=agreement)
    assert rep.unfolded.metric == 0.25 and rep.folded.metric == 0.25  # (3 * 0.0 + 1 * 1.0) / 4, not 0.5
    assert rep.unfolded.metric == rep.unfolded.top1_agreement
    assert rep.unfolded.metric_name == "agreement"
    assert len(calls) == 4  # once per batch, unfolded and folded
    out, ref = calls[0]
    assert out.dtype == ref.dtype == torch.float32 and out.shape == ref.shape == (3, 2)
    with torch.no_grad():
        want = Classifier()(ROWS[:3])
    torch.testing.assert_close(ref, want, rtol=1e-6, atol=1e-6)  # the reference is the float model's output
    e2e = rep.to_dict()["end_to_end"]["folded"]
    assert e2e["metric"] == 0.25 and e2e["metric_name"] == "agreement"
    assert "metric agreement" in rep.table()
    assert any(
        a.startswith("on these inputs, agreement with fp32: top-1 agreement unfolded 25.0%") for a in rep.advice()
    )


def test_user_metric_on_an_onnx_model_and_a_bad_return():
    x = prob_map(above=12, marginal=4)
    rep = bnfold.audit(identity_conv_onnx(), [(x,)], profile="fp32", metric=lambda o, r: float((o - r).abs().max()))
    assert 0 <= rep.unfolded.metric < 1e-6 and rep.unfolded.metric_name == "<lambda>"
    with pytest.raises(TypeError, match="must return a float"):
        bnfold.audit(identity_conv_onnx(), [(x,)], profile="fp32", metric=lambda o, r: "good")


@pytest.mark.parametrize(
    "kw, error, words",
    [
        ({"threshold": 0}, ValueError, "threshold must lie in"),
        ({"threshold": 1.0}, ValueError, "threshold must lie in"),
        ({"threshold": -0.2}, ValueError, "threshold must lie in"),
        ({"threshold": "high"}, TypeError, "threshold must be a number"),
        ({"class_axis": 2}, ValueError, "class axis 2 is out of range"),
        ({"class_axis": -3}, ValueError, "class axis -3 is out of range"),
        ({"class_axis": 1.0}, TypeError, "class_axis must be an int"),
        ({"metric": 3}, TypeError, "metric must be a function"),
    ],
)
def test_bad_values_through_the_api(kw, error, words):
    ep = torch.export.export(Classifier().eval(), (ROWS,))
    with pytest.raises(error, match=words):
        bnfold.audit(ep, [(ROWS,)], **kw)
    with pytest.raises(error, match=words):  # an nn.Module: the rank is known once it ran
        bnfold.audit(Classifier(), [(ROWS,)], **kw)


# -- the CLI ------------------------------------------------------------------------------------------


def classifier_onnx() -> onnx.ModelProto:
    """The flip classifier as ONNX: Gemm(x, W, b) with W and b as in :class:`Classifier`."""
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["logits"], name="fc", transB=1)],
        "clf",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [10, 2])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [10, 2])],
        [
            helper.make_tensor("w", TensorProto.FLOAT, [2, 2], [1.0, 0.0, 0.0, 2.0]),
            helper.make_tensor("b", TensorProto.FLOAT, [2], [0.0, -1.0]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def files(tmp_path):
    onnx.save(identity_conv_onnx(), tmp_path / "map.onnx")
    np.savez(tmp_path / "map.npz", x=prob_map(above=12, marginal=4).numpy())
    onnx.save(classifier_onnx(), tmp_path / "clf.onnx")
    np.savez(tmp_path / "clf.npz", x=ROWS.numpy())
    torch.export.save(torch.export.export(Classifier().eval(), (ROWS,)), tmp_path / "clf.pt2")
    return tmp_path


def _cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_threshold_and_class_axis(capsys, files):
    code, out, err = _cli(
        capsys, "audit", files / "map.onnx", "--inputs", files / "map.npz", "--threshold", "0.5", "--json"
    )
    assert code == 0, err
    e2e = json.loads(out)["end_to_end"]
    assert e2e["unfolded"]["mask_iou"] == 0.75 and e2e["folded"]["mask_iou"] == 0.75
    assert {"top1_agreement", "mask_iou", "metric"} <= set(e2e["unfolded"])
    code, out, err = _cli(
        capsys, "audit", files / "map.onnx", "--inputs", files / "map.npz", "--threshold", "0.5", "-q"
    )
    assert code == 0, err
    assert "mask IoU w/ fp32 (>0.5)" in out
    assert "what to do:\n  - verdict: do not deploy under fp16 as is" in out
    assert "\n  - on these inputs, agreement with fp32: mask IoU (>0.5) unfolded 0.750" in out
    for axis in ("1", "-1"):
        code, out, err = _cli(
            capsys, "audit", files / "clf.onnx", "--inputs", files / "clf.npz", "--class-axis", axis, "--json"
        )
        assert code == 0, err
        e2e = json.loads(out)["end_to_end"]
        assert e2e["unfolded"]["top1_agreement"] == 0.7 and e2e["unfolded"]["class_axis"] == int(axis)


@pytest.mark.parametrize(
    "model, flags, words",
    [
        ("map.onnx", ["--threshold", "1.5"], "--threshold: threshold must lie in (0, 1)"),
        ("map.onnx", ["--threshold", "0"], "--threshold: threshold must lie in (0, 1)"),
        ("clf.onnx", ["--class-axis", "2"], "--class-axis: class axis 2 is out of range"),
        ("clf.onnx", ["--class-axis", "-3"], "--class-axis: class axis -3 is out of range"),
        ("clf.pt2", ["--class-axis", "2"], "--class-axis: class axis 2 is out of range"),
        ("clf.pt2", ["--threshold", "1"], "--threshold: threshold must lie in (0, 1)"),
    ],
)
def test_cli_bad_values_are_one_line_exit_2(capsys, files, model, flags, words):
    code, out, err = _cli(capsys, "audit", files / model, *flags)
    lines = err.strip().splitlines()
    assert code == 2 and out == ""
    assert len(lines) == 1 and lines[0].startswith("bnfold: error: ") and words in lines[0]
