"""bnfold fold / check on ONNX models, external data in and out, and external data that escapes the folder."""

from __future__ import annotations

import json

import numpy as np
import pytest

import cli_helpers as h

pytest.importorskip("bnfold.onnx")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

X = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)


def _ops(path) -> list[str]:
    return [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]


def _external_locations(path) -> set[str]:
    model = onnx.load(str(path), load_external_data=False)
    return {
        e.value
        for t in model.graph.initializer
        if t.data_location == onnx.TensorProto.EXTERNAL
        for e in t.external_data
        if e.key == "location"
    }


@pytest.fixture
def conv_bn_onnx(tmp_path):
    p = tmp_path / "model.onnx"
    p.write_bytes(h.onnx_conv_bn().SerializeToString())
    return p


def test_fold_onnx(run, conv_bn_onnx, tmp_path):
    out = tmp_path / "folded.onnx"
    code, stdout, err = run("fold", conv_bn_onnx, "-o", out, "--json")
    assert code == 0, err
    assert json.loads(stdout)["summary"]["folded"] == 1
    assert "BatchNormalization" not in _ops(out)
    np.testing.assert_allclose(h.run_onnx(out, X), h.run_onnx(conv_bn_onnx, X), rtol=1e-4, atol=1e-5)
    assert h.listing(tmp_path) == {"model.onnx", "folded.onnx"}


def test_check_onnx(run, conv_bn_onnx, tmp_path):
    code, stdout, _ = run("check", conv_bn_onnx)
    assert code == 1 and "foldable: run bnfold fold" in stdout
    out = tmp_path / "folded.onnx"
    assert run("fold", conv_bn_onnx, "-o", out)[0] == 0
    assert run("check", out)[0] == 0


def test_external_data_is_read_and_written_as_such(run, tmp_path):
    src = h.save_onnx_external(h.onnx_conv_bn(), tmp_path / "ext.onnx", "weights.bin")
    assert _external_locations(src) == {"weights.bin"}
    out = tmp_path / "folded.onnx"
    code, _, err = run("fold", src, "-o", out)
    assert code == 0, err
    assert _external_locations(out) == {"folded.onnx.data"}
    assert (tmp_path / "folded.onnx.data").is_file()
    assert "BatchNormalization" not in _ops(out)
    np.testing.assert_allclose(h.run_onnx(out, X), h.run_onnx(src, X), rtol=1e-4, atol=1e-5)
    assert (tmp_path / "weights.bin").is_file()  # the input's data is untouched


@pytest.mark.parametrize("location", ["../outside.bin", "/etc/passwd", "sub/../../outside.bin"])
def test_external_data_outside_the_folder_is_refused(run, tmp_path, location):
    folder = tmp_path / "m"
    folder.mkdir()
    src = h.save_onnx_external(h.onnx_conv_bn(), folder / "ext.onnx", "weights.bin")
    (tmp_path / "outside.bin").write_bytes((folder / "weights.bin").read_bytes())
    h.set_external_location(src, location)
    out = folder / "folded.onnx"
    for argv in (["fold", src, "-o", out], ["check", src]):
        code, _, err = run(*argv)
        assert code == 2
        h.one_error_line(err, "ext.onnx", location)
    assert not out.exists() and not (folder / "folded.onnx.data").exists()


def test_existing_external_data_file_needs_force(run, tmp_path):
    src = h.save_onnx_external(h.onnx_conv_bn(), tmp_path / "ext.onnx", "weights.bin")
    data = tmp_path / "folded.onnx.data"
    data.write_bytes(b"someone else's")
    code, _, err = run("fold", src, "-o", tmp_path / "folded.onnx")
    assert code == 2
    h.one_error_line(err, "folded.onnx.data", "--force")
    assert data.read_bytes() == b"someone else's"
    assert run("fold", src, "-o", tmp_path / "folded.onnx", "--force")[0] == 0


def test_output_data_file_that_the_input_reads_is_refused(run, tmp_path):
    """Writing OUT.data must not clobber the input's own external data, even with --force."""
    src = h.save_onnx_external(h.onnx_conv_bn(), tmp_path / "a.onnx", "b.onnx.data")
    before = (tmp_path / "b.onnx.data").read_bytes()
    code, _, err = run("fold", src, "-o", tmp_path / "b.onnx", "--force")
    assert code == 2
    h.one_error_line(err, "b.onnx.data", "input")
    assert (tmp_path / "b.onnx.data").read_bytes() == before


def test_in_place_onnx_with_external_data(run, tmp_path):
    src = h.save_onnx_external(h.onnx_conv_bn(), tmp_path / "ext.onnx", "weights.bin")
    expected = h.run_onnx(src, X)
    code, _, err = run("fold", src, "--in-place")
    assert code == 0, err
    assert "BatchNormalization" not in _ops(src)
    np.testing.assert_allclose(h.run_onnx(src, X), expected, rtol=1e-4, atol=1e-5)
