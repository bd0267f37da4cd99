"""``bnfold audit model.onnx``: the ONNX graph, emulated, audits like the .pt2 of the same model.

The model uses ReLU (one op in both graphs; SiLU would be one aten op but Sigmoid and Mul in
ONNX, rounded twice), so both programs compute the same ops in the same order: every cell of
the two audits agrees within 0.5 dB.  The fp32 profile of the traced ONNX program is checked
against ONNX Runtime running the original file, as are the .pt2 of the net and the ONNX emulator.
"""

import math

import numpy as np
import pytest
import torch
from numerics_helpers import onnx_keeping_batch_norms
from torch import nn

import bnfold
from bnfold.numerics import Emulator

onnx = pytest.importorskip("onnx")

CELL_DB = 0.5


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.dw, self.bn2 = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        x = torch.relu(self.bn2(self.dw(x)))
        return self.fc(x.mean((2, 3)))


def _net():
    torch.manual_seed(0)
    net = Net().train()
    with torch.no_grad():
        for _ in range(10):
            net(torch.randn(16, 3, 8, 8) + 1)
        net.bn2.running_mean.add_(3.0)  # a real kappa: the unfolded program loses precision here
    return net.eval()


def _onnx(net, x):
    model = onnx_keeping_batch_norms(net, x)
    assert "BatchNormalization" in {n.op_type for n in model.graph.node}  # kept for the audit to see
    return model


def _cells(rep):
    cells = {"out unfolded": rep.unfolded.output.sqnr_db, "out folded": rep.folded.output.sqnr_db}
    for i, r in enumerate(rep.layers):
        for key in ("unfolded", "folded", "local_unfolded", "local_folded"):
            cells[f"layer {i} {key}"] = getattr(r, key).sqnr_db
    for i, n in enumerate(rep.norms):
        cells[f"norm {i} kappa"] = n.kappa
        cells[f"norm {i} predicted loss"] = n.risk.effective.loss_db
        cells[f"norm {i} measured loss"] = n.risk.measured.loss_db
    return cells


@pytest.mark.parametrize("profile, bn_eps", [("fp16", None), ("htp", None), ("htp", 1e-9)])
def test_onnx_audit_equals_the_pt2_audit(profile, bn_eps):
    net = _net()
    torch.manual_seed(1)
    batches = [(torch.randn(8, 3, 8, 8) + 1,) for _ in range(3)]
    model = _onnx(net, batches[0][0])
    a = bnfold.audit(torch.export.export(net, batches[0]), batches, profile=profile, bn_eps=bn_eps)
    b = bnfold.audit(model, batches, profile=profile, bn_eps=bn_eps)  # a ModelProto, traced by the audit
    assert [r.kind for r in a.layers] == [r.kind for r in b.layers]
    assert len(a.norms) == len(b.norms) == 2 and [n.verdict for n in a.norms] == [n.verdict for n in b.norms]
    assert all(n.folded for n in b.norms)
    ca, cb = _cells(a), _cells(b)
    assert ca.keys() == cb.keys()
    for key in ca:
        assert math.isfinite(ca[key]) and abs(ca[key] - cb[key]) <= CELL_DB, (key, ca[key], cb[key])
    assert [r.title for r in b.layers][0] == "/conv/Conv"  # the ONNX node names


def test_fp32_profile_matches_onnx_runtime():
    ort = pytest.importorskip("onnxruntime")
    net = _net()
    x = torch.randn(8, 3, 8, 8) + 1
    model = _onnx(net, x)
    res = Emulator(torch.export.export(net, (x,)), "fp32").run(x)  # the same net as a torch program
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = sess.run(None, {"x": x.numpy()})
    np.testing.assert_allclose(res.outputs[0].numpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(res.reference[0].numpy(), want, rtol=1e-5, atol=1e-5)  # float64 vs ORT's float32
    from bnfold.numerics.onnx_program import OnnxEmulator

    direct = OnnxEmulator(model, "fp32").run(x)  # the emulator the ONNX audit runs
    np.testing.assert_allclose(direct.outputs[0].numpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(direct.reference[0].numpy(), want, rtol=1e-5, atol=1e-5)


def test_unsupported_ops_are_named():
    node = onnx.helper.make_node("Det", ["x"], ["y"], name="e", domain="com.example")
    graph = onnx.helper.make_graph(
        [node],
        "g",
        [onnx.helper.make_tensor_value_info("x", 1, [2, 2])],
        [onnx.helper.make_tensor_value_info("y", 1, [2, 2])],
    )
    from bnfold.numerics.onnx_program import OnnxEmulator

    opsets = [onnx.helper.make_opsetid("", 17), onnx.helper.make_opsetid("com.example", 1)]
    with pytest.raises(NotImplementedError, match="com.example.Det"):
        OnnxEmulator(onnx.helper.make_model(graph, opset_imports=opsets))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_runs_as_torch_computes_it(approximate):
    """Opset 20's Gelu (the dynamo exporter writes it for nn.GELU: timm's FastViT, ConvNeXt, PoolFormer)."""
    from onnx import helper

    from bnfold.numerics.onnx_program import OnnxEmulator

    node = helper.make_node("Gelu", ["x"], ["y"], name="gelu", approximate=approximate)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 5])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 5])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    x = torch.randn(2, 5) * 3
    res = OnnxEmulator(model, "fp32").run(x)
    torch.testing.assert_close(res.reference[0], torch.nn.functional.gelu(x.double(), approximate=approximate))


def test_castlike_of_a_constant_runs_like_a_cast():
    """The dynamo exporter casts scalar constants with ``CastLike(c, x)`` (every torchvision / timm export has one)."""
    from onnx import helper
    from onnx import numpy_helper as nh

    from bnfold.numerics.onnx_program import OnnxEmulator

    nodes = [
        helper.make_node("CastLike", ["c", "x"], ["c_like"], name="cast"),
        helper.make_node("Add", ["x", "c_like"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])],
        [nh.from_array(np.array(0.25, dtype=np.float64), "c")],
    )
    x = torch.randn(2, 3)
    for profile in ("fp32", "fp16"):
        res = OnnxEmulator(helper.make_model(graph), profile).run(x)
        # the reference computes in float64 under fp32 and in float32 under the profiles that store fp16
        assert res.reference[0].dtype == (torch.float64 if profile == "fp32" else torch.float32)
        torch.testing.assert_close(res.reference[0].double(), x.double() + 0.25, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(res.outputs[0].double(), x.double() + 0.25, rtol=1e-3, atol=1e-3)
