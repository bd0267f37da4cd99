"""Channel 6: Python keywords are not names, and ``training_info`` tensors are checked like initializers."""

from __future__ import annotations

import crafted as c
from onnx import helper, numpy_helper


def _keyword_name(doc):
    graph = doc["graph_module"]["graph"]
    spec = graph["inputs"][0]["as_tensor"]
    old = spec["name"]
    spec["name"] = "lambda"  # isidentifier() is true, but it cannot be a parameter name
    graph["tensor_values"]["lambda"] = graph["tensor_values"].pop(old)


def test_keyword_names_and_training_info_are_refused(programs, tmp_path):
    bad = c.edit_program(programs["conv_bn"], tmp_path / "kw.pt2", _keyword_name)

    m = c.onnx_conv_bn()
    t = numpy_helper.from_array(numpy_helper.to_array(m.graph.initializer[0]), "secret")
    c.set_external(t, "../outside.bin", 0, 432)
    (tmp_path.parent / "outside.bin").write_bytes(bytes(432))
    info = m.training_info.add()
    info.initialization.CopyFrom(helper.make_graph([], "init", [], [], [t]))
    onnx_bad = c.save_onnx(m, tmp_path / "train.onnx")

    runs = c.run_bnfold(
        tmp_path,
        ["fold", bad, "-o", tmp_path / "o.pt2"],
        ["check", bad],
        ["audit", bad, "--random", "1"],
        ["fold", onnx_bad, "-o", tmp_path / "o.onnx"],
        ["check", onnx_bad],
    )
    for r in runs[:3]:
        c.assert_refused(r, "kw.pt2", "keyword", "'lambda'")
    for r in runs[3:]:
        c.assert_refused(r, "train.onnx", "secret", "escapes the model's folder")
    assert c.listing(tmp_path) == {"kw.pt2", "train.onnx"}
