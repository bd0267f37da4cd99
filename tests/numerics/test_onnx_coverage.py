"""Which ONNX models the audit runs: a classic model-zoo graph (opset 9: BatchNorm weights made by
``ConstantOfShape``, ``Upsample``, attribute-form ``Pad`` and ``Clip``, a 2-D-coerced ``Softmax``)
audits with its BatchNorm listed; an op with no implementation of its own runs through
``onnx.reference`` in float32 and is named as not emulated; a custom domain is refused (in
``test_paddleocr_audit.py``).  The fp32 profile's outputs match ONNX Runtime on the original file."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bnfold.cli import main
from bnfold.numerics.onnx_program import OnnxEmulator

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402

REL = 1e-5


def _zoo_model(opset: int = 9, extra: str | None = None) -> onnx.ModelProto:
    """conv -> BN (scale and bias from ConstantOfShape) -> Clip -> [extra] -> reflect Pad -> MaxPool ->
    Upsample -> AveragePool -> Flatten -> Gemm -> Softmax."""
    rng = np.random.default_rng(0)
    c = 4
    inits = [
        nh.from_array((rng.standard_normal((c, 3, 3, 3)) * 0.3).astype(np.float32), "w"),
        nh.from_array(np.array([c], np.int64), "cshape"),
        nh.from_array(rng.uniform(-1, 1, c).astype(np.float32), "mean"),
        nh.from_array(rng.uniform(0.5, 2, c).astype(np.float32), "var"),
        nh.from_array(rng.standard_normal((10, c * 4)).astype(np.float32), "fc"),
        nh.from_array(np.zeros(10, np.float32), "fcb"),
        nh.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
    ]
    one = h.make_tensor("v", TP.FLOAT, [1], [1.0])
    nodes = [
        h.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        h.make_node("ConstantOfShape", ["cshape"], ["gamma"], name="ones", value=one),
        h.make_node("ConstantOfShape", ["cshape"], ["beta"], name="zeros"),
        h.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["b"], name="bn"),
        h.make_node("Clip", ["b"], ["r"], name="relu6", min=0.0, max=6.0),
        h.make_node("Pad", ["r"], ["p"], name="pad", pads=[0, 0, 1, 1, 0, 0, 1, 1], mode="reflect"),
        h.make_node("MaxPool", ["p"], ["m"], name="pool", kernel_shape=[3, 3], strides=[2, 2]),
        h.make_node("Upsample", ["m", "scales"], ["u"], name="up", mode="nearest"),
        h.make_node("AveragePool", ["u"], ["a"], name="avg", kernel_shape=[4, 4], strides=[4, 4]),
        h.make_node("Flatten", ["a"], ["f"], name="flat"),
        h.make_node("Gemm", ["f", "fc", "fcb"], ["g"], name="fc", transB=1),
        h.make_node("Softmax", ["g"], ["y"], name="softmax"),
    ]
    if extra:
        nodes.insert(5, h.make_node(extra, ["r"], ["r2"], name="extra", lambd=0.2))
        nodes[6].input[0] = "r2"
    graph = h.make_graph(
        nodes,
        "zoo",
        [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 8, 8])],
        [h.make_tensor_value_info("y", TP.FLOAT, [1, 10])],
        inits,
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    model.ir_version = 4
    onnx.checker.check_model(model)
    return model


def _check_against_ort(model: onnx.ModelProto) -> OnnxEmulator:
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    emu = OnnxEmulator(model, "fp32")
    result = emu.run(torch.from_numpy(x))
    got = result.outputs[0].numpy()
    assert np.abs(got - want).max() <= REL * max(1.0, np.abs(want).max())
    assert np.abs(result.reference[0].numpy() - want).max() <= REL * max(1.0, np.abs(want).max())
    return emu


def test_classic_opset9_model_audits(capsys, tmp_path):
    model = _zoo_model()
    assert _check_against_ort(model).not_emulated == []
    onnx.save(model, tmp_path / "zoo9.onnx")
    code = main(["audit", str(tmp_path / "zoo9.onnx"), "--random", "2", "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    doc = json.loads(out.out)
    assert [n["node"] for n in doc["normalizations"]] == ["bn"]  # its weights are ConstantOfShape fills


def test_an_op_without_an_implementation_runs_and_is_named(capsys, tmp_path):
    model = _zoo_model(extra="Shrink")
    emu = _check_against_ort(model)
    assert emu.not_emulated == [("extra", "Shrink", "no implementation")]
    fp16 = OnnxEmulator(model, "fp16")
    result = fp16.run(torch.randn(1, 3, 8, 8))
    assert "r2" in result.errors and result.outputs[0].dtype == torch.float32
    onnx.save(model, tmp_path / "shrink.onnx")
    assert main(["audit", str(tmp_path / "shrink.onnx"), "--random", "2"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("op", ["RandomNormalLike", "Bernoulli"])
def test_an_op_outside_the_reference_allowlist_refuses_the_model(capsys, tmp_path, op):
    """An op without an implementation runs through onnx.reference only when it is on REFERENCE_OPS: a random
    op (or image decoding, a size read from the data) refuses the model in one line, exit 2."""
    graph = h.make_graph(
        [h.make_node("Relu", ["x"], ["r"], name="relu"), h.make_node(op, ["r"], ["y"], name="extra")],
        "g",
        [h.make_tensor_value_info("x", TP.FLOAT, [1, 3])],
        [h.make_tensor_value_info("y", TP.FLOAT, [1, 3])],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    with pytest.raises(NotImplementedError, match=f"ONNX op {op} .*reference evaluator may run"):
        OnnxEmulator(model, "fp16")
    onnx.save(model, tmp_path / "m.onnx")
    assert main(["audit", str(tmp_path / "m.onnx"), "--random", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert op in err and len(err.splitlines()) == 1, err


class _VitBlock(torch.nn.Module):
    """A pre-norm transformer block (LayerNorm, scaled dot-product attention, GELU MLP)."""

    def __init__(self, d: int = 16, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 2 * d), torch.nn.Linear(2 * d, d)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d)
        x = x + self.proj(att)
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm2(x))))


def _export(model: torch.nn.Module, x: torch.Tensor, exporter: str) -> onnx.ModelProto:
    import io
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            return torch.onnx.export(model.eval(), (x,), dynamo=True, verbose=False).model_proto
        f = io.BytesIO()
        torch.onnx.export(model.eval(), (x,), f, dynamo=False, opset_version=17)
        return onnx.load_from_string(f.getvalue())


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_every_op_the_exporters_write_for_the_suite_is_emulated(exporter):
    """The real-architecture cases (exported as the ONNX fold tests export them, BatchNorm kept) and a
    transformer block: every node runs under the profile, none through the reference evaluator."""
    pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")
    from fold_cases import REAL_CASES

    torch.manual_seed(0)
    models = [(case.name, case.onnx(exporter), case.inputs()) for case in REAL_CASES]
    x = torch.randn(2, 5, 16)
    models.append(("vit_block", _export(_VitBlock(), x, exporter), (x,)))
    for name, model, inputs in models:
        emu = OnnxEmulator(model, "fp16")
        assert emu.not_emulated == [], name
        result = emu.run(*inputs)
        assert all(torch.isfinite(o).all() for o in result.outputs), name
