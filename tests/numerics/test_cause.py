"""The audit's cause, verdict and prescription on models that break in fp16 by range (``tests/range_models.py``), as
torch programs and ONNX: the op where damage starts is named, the verdict rejects the model, and the float32 nodes it
prescribes make the verdict hold in the emulation and, through onnxconverter-common, in ONNX Runtime."""

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import bnfold
from bnfold.cli import main
from bnfold.numerics import block_list

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import range_models as rm  # noqa: E402

onnx = pytest.importorskip("onnx")

#: the op where each model's damage starts: torch op, ONNX op (TorchScript exporter, opset 14)
CAUSES = {
    "attention": ("matmul", "MatMul"),
    "residual": ("linear", "MatMul"),
    "hot_channels": ("conv2d", "Conv"),
    "sum_mean": ("sum", "ReduceSum"),
    "layer_norm": ("pow", "Pow"),
}


def _model(name, fmt):
    m = rm.build(name) if name != "raw_scores" else _raw_scores()
    return (rm.program(m) if fmt == "pt2" else rm.onnx_model(m)), rm.batches(m)


class _RawScores(rm.AttentionScores):
    """The attention model with its ``1/sqrt(d)`` left out (as if folded into ``q``): the matmul's output is the
    softmax's input and passes 65504 itself, so no exact rewrite changes anything (softmax is not homogeneous) and
    the prescription is a float32 island of the model as given.  (Where a rewrite fixes part of a model, the island
    is searched on the rewritten one: ``test_prescribe_on_rewrite.py``.)"""

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        return self.head(((q @ k.transpose(-2, -1)).softmax(dim=-1) @ v).mean(dim=1))


def _raw_scores():
    return _RawScores().eval()


@pytest.mark.parametrize("fmt", ["pt2", "onnx"])
@pytest.mark.parametrize("name", sorted(CAUSES))
def test_range_model_cause_verdict_and_rewrite(name, fmt):
    """Each range model: the overflow named where it starts, the verdict rejects the model, and the prescription is
    the exact range rewrite (``--fp16-range``), verified by emulating the rewritten model: no float32 island."""
    model, xs = _model(name, fmt)
    rep = bnfold.audit(model, xs)
    d = rep.to_dict()
    assert rep.deploy is False and d["verdict"]["deploy"] is False and d["verdict"]["failures"]
    cause = d["cause"]
    assert cause["kind"] == "overflow" and cause["op"] == CAUSES[name][fmt == "onnx"]
    assert cause["value"] > cause["limit"] == 65504.0
    first = rep.advice()[0]
    assert first.startswith("verdict: do not deploy under fp16 as is: `")
    assert f"reaches {cause['value']:.3g} > 65504: overflow" in first
    if fmt == "onnx":  # named by its node name
        assert f"`{cause['node']}` ({cause['op']})" in first
        assert cause["node"] in {n.name for n in model.graph.node}
    ops = {r["node"]: r for r in d["ops"]}
    assert ops[cause["node"]]["peak"] == cause["value"] and ops[cause["node"]]["headroom"] < 1
    pres = d["prescription"]
    assert pres["rewrite"] == ["fp16_range"] and pres["holds"] and pres["fp32_nodes"] == []
    tried = {t["name"]: t for t in pres["tried"]}
    assert tried["fp16_range"]["holds"] and tried["fp16_range"]["nonfinite_share"] == 0.0
    assert tried["fp16_range"]["output_sqnr_db"] >= rep.floor.min_sqnr_db
    assert rep.advice()[1].startswith("prescription: --fp16-range INPUTS.npz (verified")


@pytest.mark.parametrize("fmt", ["pt2", "onnx"])
def test_island_where_no_rewrite_holds(fmt):
    """Scores past 65504 at the softmax's input, straight from the matmul: the range rewrite changes nothing, so the
    prescription is the float32 island of the model as given, grown from the cause until the verdict holds."""
    model, xs = _model("raw_scores", fmt)
    rep = bnfold.audit(model, xs)
    d = rep.to_dict()
    assert rep.deploy is False and d["cause"]["kind"] == "overflow" and d["cause"]["op"] in ("matmul", "MatMul")
    pres = d["prescription"]
    assert "fp16_range" not in {t["name"] for t in pres["tried"]}  # it rescaled nothing
    assert (
        pres["rewrite"] == []
        and pres["base"] == "unfolded"
        and pres["holds"]
        and d["cause"]["node"] in pres["fp32_nodes"]
    )
    assert 0 < len(pres["fp32_nodes"]) < pres["nodes"]
    assert rep.prescription.end_to_end is not None and not rep.prescription.end_to_end.output.nonfinite


def _classifier():
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 5),
    )
    with torch.no_grad():
        net[1].running_mean.uniform_(-0.5, 0.5)
        net[1].running_var.uniform_(0.5, 2.0)
    return net.eval()


def test_a_safe_model_keeps_deploy_and_no_island():
    g = torch.Generator().manual_seed(0)
    xs = [(torch.randn(4, 3, 8, 8, generator=g),) for _ in range(2)]
    rep = bnfold.audit(_classifier(), xs)
    d = rep.to_dict()
    assert rep.deploy and d["verdict"] == {**d["verdict"], "deploy": True, "model": "folded", "failures": []}
    assert rep.advice()[0].startswith("verdict: deploy the folded model under fp16: no NaN/inf")
    assert d["cause"] is None
    assert d["prescription"]["fp32_nodes"] == [] and d["prescription"]["rewrite"] == ["fold"]
    # nothing folds: the verdict does not speak of a folded model
    plain = nn.Sequential(nn.Flatten(), nn.Linear(192, 5)).eval()
    rep = bnfold.audit(plain, xs)
    assert rep.deploy and rep.advice()[0].startswith("verdict: deploy the model as is under fp16")
    assert rep.prescription.rewrite == [] and rep.prescription.fp32_nodes == []


def test_thresholds_are_options():
    model, xs = _model("layer_norm", "onnx")
    rep = bnfold.audit(model, xs, min_sqnr_db=1.0, min_agreement=0.2, prescribe=False)
    assert rep.shipped.output.sqnr_db > 1.0 and rep.shipped.top1_agreement >= 0.2
    assert rep.deploy and rep.cause is not None and rep.cause.kind == "overflow"  # the overflow is still named
    with pytest.raises(ValueError, match="min_agreement"):
        bnfold.audit(model, xs, min_agreement=2.0)


def _sqnr(out, ref):
    return 10 * math.log10(float((ref**2).sum()) / float(((out - ref) ** 2).sum()))


def test_block_list_round_trip_through_onnxconverter_common(tmp_path):
    """The prescribed nodes, written for onnxconverter-common and given to ``convert_float_to_float16``: the converter
    keeps exactly those nodes in float32 (a name it does not know it ignores silently), and ONNX Runtime's output is
    finite and within the floor.  (ONNX Runtime's CPU provider computes fp16 MatMul in float32, so its plain fp16
    model does not overflow here: the ``fp16`` profile is a GPU's or NPU's storage, not ORT CPU's.)"""
    ort = pytest.importorskip("onnxruntime")
    f16 = pytest.importorskip("onnxconverter_common.float16")
    model, xs = _model("raw_scores", "onnx")
    rep = bnfold.audit(model, xs)
    listed = json.loads(block_list.render(rep.prescription, "onnxconverter-common", onnx=True))
    nodes = listed["node_block_list"]
    assert nodes == rep.prescription.fp32_nodes == ["/MatMul", "/Softmax"] and listed["base"] == "unfolded"
    blocked = f16.convert_float_to_float16(model, keep_io_types=True, node_block_list=nodes)
    producer = {o: n for n in blocked.graph.node for o in n.output}
    for node in (
        n for n in blocked.graph.node if n.name in nodes
    ):  # each reads float32: a Cast to FLOAT or a kept node
        src = producer[node.input[0]]
        assert src.name in nodes or (src.op_type == "Cast" and src.attribute[0].i == onnx.TensorProto.FLOAT)
    assert sum(n.name in nodes for n in blocked.graph.node) == len(nodes)

    def run(m):
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        return np.concatenate([sess.run(None, {"x0": x.numpy()})[0] for (x,) in xs])

    ref, out = run(model), run(blocked)
    assert np.isfinite(out).all()
    assert _sqnr(out, ref) >= rep.floor.min_sqnr_db
    assert (out.argmax(1) == ref.argmax(1)).mean() >= rep.floor.min_agreement


def _cli(capsys, *argv):
    code = main(list(map(str, argv)))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_writes_each_block_list_format(tmp_path, capsys):
    model, xs = _model("raw_scores", "onnx")
    path, npz = tmp_path / "attn.onnx", tmp_path / "attn.npz"
    onnx.save(model, path)
    np.savez(npz, x0=np.stack([x.numpy() for (x,) in xs]))
    texts = {}
    for fmt in block_list.ONNX_FORMATS:
        out = tmp_path / f"{fmt}.txt"
        code, stdout, err = _cli(
            capsys, "audit", path, "--inputs", npz, "--block-list", out, "--block-list-format", fmt, "-q"
        )
        assert code == 0, err
        assert "verdict: do not deploy under fp16 as is: `/MatMul` (MatMul) reaches" in stdout
        texts[fmt] = out.read_text()
    nodes = json.loads(texts["onnxconverter-common"])["node_block_list"]
    assert nodes and nodes[0] == "/MatMul"
    assert json.loads(texts["modelopt"])["nodes_to_exclude"] == ["^" + __import__("re").escape(n) + "$" for n in nodes]
    assert json.loads(texts["openvino"]) == {
        "rt_info": "disable_fp16_compression_0",
        "nodes": nodes,
        "base": "unfolded",
        "rewrite": [],
    }
    assert (
        texts["tensorrt"]
        == "--precisionConstraints=obey --layerPrecisions=" + ",".join(f"{n}:fp32" for n in nodes) + "\n"
    )
    code, _, err = _cli(
        capsys, "audit", path, "--inputs", npz, "--block-list", tmp_path / "t", "--block-list-format", "torch"
    )
    assert code == 2 and err.count("\n") == 1 and "not for an ONNX model" in err
    assert not (tmp_path / "t").exists()


def test_cli_torch_block_list_holds_module_paths(tmp_path, capsys):
    m = nn.Sequential(_raw_scores()).eval()  # its attention ops under the module path "0"
    m.shapes = m[0].shapes
    path, npz = tmp_path / "scores.pt2", tmp_path / "scores.npz"
    torch.export.save(rm.program(m), path)
    np.savez(npz, arr_0=np.stack([b[0].numpy() for b in rm.batches(m)]))
    out = tmp_path / "fp32.json"
    code, stdout, err = _cli(capsys, "audit", path, "--inputs", npz, "--block-list", out, "--json")
    assert code == 0, err
    doc, listed = json.loads(stdout), json.loads(out.read_text())
    assert doc["block_list"] == str(out) and listed["nodes"] == doc["prescription"]["fp32_nodes"]
    assert listed["nodes"] == ["matmul", "softmax"] and listed["module_paths"] == ["0"]


def _page(seed: int, size: int = 128) -> tuple:
    """A white page with dark strokes (text lines), normalized as PaddleOCR's detector takes it."""
    g = torch.Generator().manual_seed(seed)
    x = torch.ones(1, 3, size, size)
    for _ in range(12):
        r, c = torch.randint(4, size - 18, (2,), generator=g).tolist()
        x[..., r : r + 6, c : c + int(torch.randint(8, 40, (1,), generator=g))] = 0.1
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    return ((x - mean) / std,)


def test_ppocr_v4_det_prescribes_fold_and_no_island():
    """The trained PP-OCRv4 detector on text-like pages: its unfolded batch norms break it under fp16 (mask IoU 0),
    the folded model keeps the map: the prescription is the fold, with no float32 island."""
    from paddleocr_models import model_path

    model = onnx.load(model_path("v4-det"))
    rep = bnfold.audit(model, [_page(0), _page(1)], threshold=0.3)
    assert rep.unfolded.mask_iou < 0.5 and rep.folded.mask_iou >= 0.99
    assert rep.deploy and rep.ship == "folded" and rep.advice()[0].startswith("verdict: deploy the folded model")
    pres = rep.to_dict()["prescription"]
    assert pres["rewrite"] == ["fold"] and pres["fp32_nodes"] == [] and pres["runs"] == 0


class _FeaturesThenLogits(nn.Module):
    """Returns the feature map first and the class scores second (a detector's map, then its head)."""

    def __init__(self):
        super().__init__()
        self.conv, self.head = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 5)

    def forward(self, x):
        f = self.conv(x)
        return f, self.head(f.mean((2, 3)))


def test_the_task_reads_the_output_named(tmp_path, capsys):
    torch.manual_seed(0)
    net = _FeaturesThenLogits().eval()
    g = torch.Generator().manual_seed(0)
    xs = [(torch.randn(4, 3, 8, 8, generator=g),) for _ in range(2)]
    first = bnfold.audit(net, xs)
    assert first.unfolded.top1_agreement is None and first.unfolded.output_index is None  # a feature map comes first
    path = tmp_path / "two.onnx"
    torch.onnx.export(net, xs[0], path, dynamo=False, input_names=["x"], output_names=["features", "logits"])
    model = onnx.load(path)
    for m, which in ((net, 1), (model, "logits"), (model, 1)):
        rep = bnfold.audit(m, xs, output=which)
        e2e = rep.to_dict()["end_to_end"]["unfolded"]
        assert e2e["output"] == 1 and e2e["top1_agreement"] is not None and e2e["class_axis"] == 1
        assert [o["index"] for o in e2e["outputs"]] == [0, 1] and e2e["outputs"][1]["elements"] == 2 * 4 * 5
        assert e2e["output_sqnr_db"] == e2e["outputs"][1]["sqnr_db"] != e2e["outputs"][0]["sqnr_db"]
        assert "output 1 SQNR (dB)" in rep.table()
    with pytest.raises(ValueError, match="no output named 'boxes'"):
        bnfold.audit(model, xs, output="boxes")
    npz = tmp_path / "x.npz"
    np.savez(npz, x=np.stack([x.numpy() for (x,) in xs]))
    code, out, err = _cli(capsys, "audit", path, "--inputs", npz, "--output", "logits", "--json")
    assert code == 0, err
    assert json.loads(out)["end_to_end"]["folded"]["output"] == 1
    code, out, err = _cli(capsys, "audit", path, "--inputs", npz, "--output", "7")
    assert code == 2 and err.count("\n") == 1 and "--output: output '7' is out of range" in err


def test_a_model_without_float_outputs_is_judged_on_what_it_has():
    class ArgMax(nn.Module):
        def forward(self, x):
            return (x * 2).argmax(1)

    rep = bnfold.audit(ArgMax(), [(torch.randn(4, 5),)])
    assert rep.unfolded.output.count == 0 and rep.deploy and rep.floor.failures(rep.shipped) == []
