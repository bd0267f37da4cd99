"""``bnfold audit`` on the trained PaddleOCR models the rapidocr wheels ship (a test dependency).

The CLI runs all five (the v2.0 angle classifier, the PP-OCRv4 and PP-OCRv6 detectors and
recognizers) under ``fp16`` with ``--input-shape`` and under ``htp --bn-eps 1e-9`` with ``--inputs``,
each with the smallest input it takes; the two recognizers also run through the API, under both.  Every
BatchNormalization is listed with a verdict, and the folded side is the ONNX ``bnfold fold`` writes.
"""

import json

import numpy as np
import pytest
from paddleocr_models import model_path

import bnfold
from bnfold.cli import main

onnx = pytest.importorskip("onnx")

SHAPES = {
    "cls": (1, 3, 48, 96),
    "v4-det": (1, 3, 64, 64),
    "v6-det": (1, 3, 64, 64),
    "v4-rec": (1, 3, 48, 64),
    "v6-rec": (1, 3, 48, 64),
}
VERDICTS = {"safe", "degrades", "overflows", "input NaN"}


@pytest.fixture(scope="module")
def folded():
    """``bnfold.fold`` of each model: what ``bnfold fold m.onnx`` writes."""
    return {k: bnfold.fold(onnx.load(model_path(k))) for k in SHAPES}


def _batch_norms(path):
    return sorted(n.name for n in onnx.load(path).graph.node if n.op_type == "BatchNormalization")


def _check(doc, key, folded):
    path = model_path(key)
    assert sorted(n["node"] for n in doc["normalizations"]) == _batch_norms(path)
    assert all(n["risk"]["verdict"] in VERDICTS for n in doc["normalizations"])
    fold = folded[key]
    assert len(doc["fold_report"]["folded"]) == len(fold.report.folded)
    values = {o for n in fold.model.graph.node for o in n.output} | {i.name for i in fold.model.graph.input}
    measured = {t["node"] for t in doc["tensors"]["folded"]}
    assert measured and measured <= values  # the folded side ran the ONNX that fold writes
    unfolded_only = {o for n in onnx.load(path).graph.node for o in n.output} - values
    assert not measured & unfolded_only
    assert doc["end_to_end"]["folded"]["elements"] == doc["end_to_end"]["unfolded"]["elements"]


def _run(capsys, *argv):
    code = main(["audit", *argv, "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


@pytest.mark.parametrize("key", list(SHAPES))
def test_cli_fp16_with_input_shape(key, folded, capsys):
    shape = ",".join(map(str, SHAPES[key]))
    doc = _run(capsys, model_path(key), "--profile", "fp16", "--input-shape", f"x:{shape}", "--random", "1")
    _check(doc, key, folded)
    assert doc["profile"] == "fp16" and doc["random_inputs"]


@pytest.mark.parametrize("key", list(SHAPES))
def test_cli_htp_eps_1e9_with_inputs(key, folded, capsys, tmp_path):
    x = np.random.default_rng(0).standard_normal((1, *SHAPES[key])).astype(np.float32)  # one batch
    np.savez(tmp_path / "x.npz", x=x)
    doc = _run(capsys, model_path(key), "--profile", "htp", "--bn-eps", "1e-9", "--inputs", str(tmp_path / "x.npz"))
    _check(doc, key, folded)
    assert doc["bn_eps"] == 1e-9 and not doc["random_inputs"]


@pytest.mark.parametrize("key", ["v4-rec", "v6-rec"])
def test_recognizers_through_the_api(key, folded):
    model = onnx.load(model_path(key))
    for profile, eps in (("fp16", None), ("htp", 1e-9)):
        rep = bnfold.audit(model, input_shapes={"x": SHAPES[key]}, profile=profile, bn_eps=eps)
        _check(json.loads(json.dumps(rep.to_dict(), allow_nan=False)), key, folded)
        assert rep.folded is not None and rep.unfolded.output.count > 0


def test_wrong_shape_and_unknown_op_exit_2(capsys, tmp_path):
    code = main(["audit", model_path("cls"), "--input-shape", "x:1,3,48"])
    err = capsys.readouterr().err
    assert code == 2 and "gives 3 dims, the model's input has 4" in err and "Traceback" not in err
    node = onnx.helper.make_node("Foo", ["x", "x"], ["y"], name="e", domain="com.example")
    graph = onnx.helper.make_graph(
        [node],
        "g",
        [onnx.helper.make_tensor_value_info("x", 1, [2, 2])],
        [onnx.helper.make_tensor_value_info("y", 1, [2, 2])],
    )
    opsets = [onnx.helper.make_opsetid("", 17), onnx.helper.make_opsetid("com.example", 1)]
    onnx.save(onnx.helper.make_model(graph, opset_imports=opsets), tmp_path / "e.onnx")
    code = main(["audit", str(tmp_path / "e.onnx")])
    err = capsys.readouterr().err
    assert code == 2 and "com.example.Foo" in err and "custom domain" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_open_dims_need_a_shape(capsys):
    code = main(["audit", model_path("v4-rec")])
    assert code == 2 and "--input-shape" in capsys.readouterr().err


def test_runtime_next_to_the_emulation(capsys):
    doc = _run(capsys, model_path("cls"), "--input-shape", "x:4,3,48,96", "--random", "1", "--runtime", "torch")
    rt = doc["runtime"]
    assert rt["runtime"] == "torch" and rt["matches_profile"] == "fp16"
    assert rt["unfolded"]["elements"] == doc["end_to_end"]["unfolded"]["elements"]
    assert rt["folded"] is not None


@pytest.mark.parametrize("key", list(SHAPES))
def test_fp32_emulation_is_onnxruntime(key):
    """The ONNX emulator computes what ONNX Runtime computes (Erf, Resize, Shape chains, SAME pools...)."""
    import onnxruntime as ort
    import torch

    from bnfold.numerics.onnx_program import OnnxEmulator

    path = model_path(key)
    x = torch.from_numpy(np.random.default_rng(1).uniform(-1, 1, SHAPES[key]).astype(np.float32))
    res = OnnxEmulator(onnx.load(path), "fp32").run(x)
    (want,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})
    scale = max(float(np.abs(want).max()), 1e-2)  # a detector on noise outputs ~1e-7: compare on its 0..1 scale
    np.testing.assert_allclose(res.outputs[0].numpy(), want, rtol=0, atol=1e-4 * scale)  # float32 vs float32
    np.testing.assert_allclose(res.reference[0].numpy(), want, rtol=0, atol=1e-4 * scale)  # float64 vs float32
