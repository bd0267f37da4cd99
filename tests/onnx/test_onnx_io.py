"""load_onnx / save_onnx: external data kept (through an explicit layout) and
read safely, broken or unsafe files refused with one-line messages, atomic writes."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx_testkit import G, compare, ops, ort_run

import bnfold
from bnfold.errors import ModelFileError
from bnfold.onnx import ExternalLayout, fold_onnx, load_onnx, save_onnx


def _model():
    g = G(seed=11)
    x = g.input("x", [2, 8, 6, 6])
    y = g.node("Conv", [x, g.randn("W", 16, 8, 3, 3), g.randn("B", 16)], "c", name="conv", pads=[1, 1, 1, 1])
    y = g.node("Relu", [g.bn(y, 16, "bn")], "r", name="relu")
    y = g.node("Conv", [y, g.randn("W2", 8, 16, 3, 3)], "c2", name="conv2")
    g.output(g.bn(y, 8, "bn2", out="y"))
    return g.model(), g.feeds


def _save_external(m, path, location="weights.bin", threshold=0):
    """onnx's own external-data save (on a copy: onnx.save_model converts the model it is given)."""
    m = onnx.ModelProto.FromString(m.SerializeToString())
    onnx.save_model(
        m,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=location,
        size_threshold=threshold,
    )


def _refused(path, *words):
    with pytest.raises(ModelFileError) as e:
        load_onnx(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg
    for w in words:
        assert w in msg, msg
    return msg


def _external_tensors(m):
    return [t.name for t in m.graph.initializer if t.data_location == TensorProto.EXTERNAL]


def test_external_data_round_trip(tmp_path):
    m, feeds = _model()
    src = tmp_path / "src" / "model.onnx"
    src.parent.mkdir()
    _save_external(m, src)
    assert os.path.getsize(src) < 2000  # the weights really are outside
    loaded, layout = load_onnx(src)
    res = fold_onnx(loaded)
    assert len(res.report.folded) == 2
    assert not _external_tensors(res.model)  # in memory, the data is loaded
    assert fold_onnx(src).model == res.model  # folding the path reads the same data
    out = tmp_path / "out" / "folded.onnx"
    out.parent.mkdir()
    save_onnx(res.model, out, layout=layout)
    assert sorted(os.listdir(out.parent)) == ["folded.onnx", "folded.onnx.data"]
    on_disk = onnx.load(str(out), load_external_data=False)
    # the source stored every tensor outside (size_threshold=0): so does the folded model
    assert sorted(_external_tensors(on_disk)) == ["B", "W", "W2", "conv2_bias"]
    onnx.checker.check_model(str(out), full_check=True)
    again = load_onnx(out).model
    assert "BatchNormalization" not in ops(again)
    compare(m, again, feeds)
    # ONNX Runtime reads the saved external data by itself as well
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(out), so, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, feeds)[0], ort_run(again, feeds)[0], rtol=0, atol=0)


def test_load_then_save_keeps_external_and_threshold(tmp_path):
    m, _ = _model()
    _save_external(m, tmp_path / "m.onnx", threshold=1024)
    loaded, layout = load_onnx(tmp_path / "m.onnx")
    before = loaded.SerializeToString()
    save_onnx(loaded, tmp_path / "copy.onnx", layout=layout)
    assert loaded.SerializeToString() == before  # save does not mutate the model
    on_disk = onnx.load(str(tmp_path / "copy.onnx"), load_external_data=False)
    big = {t.name for t in m.graph.initializer if len(t.raw_data) >= 1024}
    assert set(_external_tensors(on_disk)) == big
    save_onnx(loaded, tmp_path / "inline.onnx")  # no layout: one file
    assert not _external_tensors(onnx.load(str(tmp_path / "inline.onnx"), load_external_data=False))
    assert not os.path.exists(tmp_path / "inline.onnx.data")


def test_in_memory_model_saves_inline_unless_asked(tmp_path):
    m, feeds = _model()
    save_onnx(m, tmp_path / "a.onnx")
    assert os.listdir(tmp_path) == ["a.onnx"]
    save_onnx(m, tmp_path / "b.onnx", layout=ExternalLayout())
    assert (tmp_path / "b.onnx.data").exists()
    compare(m, load_onnx(tmp_path / "b.onnx").model, feeds)


def test_save_is_atomic_and_keeps_permissions(tmp_path):
    m, _ = _model()
    p = tmp_path / "m.onnx"
    p.write_bytes(b"old")
    os.chmod(p, 0o640)
    save_onnx(m, p, layout=ExternalLayout())
    assert (os.stat(p).st_mode & 0o777) == 0o640
    assert (os.stat(tmp_path / "m.onnx.data").st_mode & 0o777) == 0o640  # the data file gets the model's
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data"]  # no temporary files left
    assert load_onnx(p).model.graph.node[0].name == "conv"


def test_save_into_missing_folder(tmp_path):
    m, _ = _model()
    with pytest.raises(ModelFileError, match="does not exist"):
        save_onnx(m, tmp_path / "nope" / "m.onnx")


def test_missing_empty_truncated_and_foreign_files(tmp_path):
    _refused(tmp_path / "missing.onnx", "no such file")
    (tmp_path / "empty.onnx").write_bytes(b"")
    _refused(tmp_path / "empty.onnx", "empty")
    m, _ = _model()
    blob = m.SerializeToString()
    (tmp_path / "cut.onnx").write_bytes(blob[: len(blob) // 2])
    _refused(tmp_path / "cut.onnx", "truncated")
    (tmp_path / "text.onnx").write_text("this is not a model\n" * 10)
    _refused(tmp_path / "text.onnx", "not an ONNX model")
    (tmp_path / "dir.onnx").mkdir()
    _refused(tmp_path / "dir.onnx", "is a directory")
    with pytest.raises(ModelFileError):
        bnfold.fold(str(tmp_path / "missing.onnx"))


def _with_location(tmp_path, location: str):
    """A model saved with external data whose weight ``W`` claims ``location``."""
    m, _ = _model()
    folder = tmp_path / "model_dir"
    folder.mkdir(exist_ok=True)
    _save_external(m, folder / "m.onnx")
    on_disk = onnx.load(str(folder / "m.onnx"), load_external_data=False)
    t = next(t for t in on_disk.graph.initializer if t.name == "W")
    for e in t.external_data:
        if e.key == "location":
            e.value = location
    with open(folder / "m.onnx", "wb") as f:
        f.write(on_disk.SerializeToString())
    return folder / "m.onnx"


def test_refuses_absolute_location(tmp_path):
    outside = tmp_path / "secret.bin"
    outside.write_bytes(b"\0" * 10000)
    _refused(_with_location(tmp_path, str(outside)), "absolute path")


def test_refuses_parent_location(tmp_path):
    (tmp_path / "secret.bin").write_bytes(b"\0" * 10000)
    _refused(_with_location(tmp_path, "../secret.bin"), "escapes the model's folder")
    _refused(_with_location(tmp_path, "sub/../../secret.bin"), "escapes the model's folder")


def test_refuses_symlink_out(tmp_path):
    (tmp_path / "secret.bin").write_bytes(b"\0" * 10000)
    p = _with_location(tmp_path, "link.bin")
    os.symlink(tmp_path / "secret.bin", p.parent / "link.bin")
    _refused(p, "outside the model's folder")


def test_refuses_missing_and_short_data(tmp_path):
    p = _with_location(tmp_path, "weights.bin")
    data = p.parent / "weights.bin"
    data.write_bytes(data.read_bytes()[:100])
    _refused(p, "truncated")
    data.unlink()
    _refused(p, "missing")


def test_symlink_inside_folder_is_fine(tmp_path):
    p = _with_location(tmp_path, "alias.bin")
    os.symlink("weights.bin", p.parent / "alias.bin")
    assert len(fold_onnx(p).report.folded) == 2


def test_save_refuses_unloaded_external_references(tmp_path):
    m, _ = _model()
    _save_external(m, tmp_path / "m.onnx")
    lazy = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    with pytest.raises(ModelFileError, match="never loaded"):
        save_onnx(lazy, tmp_path / "elsewhere.onnx")
    assert not os.path.exists(tmp_path / "elsewhere.onnx")


def test_layout_is_returned_by_the_loader(tmp_path):
    m, _ = _model()
    save_onnx(m, tmp_path / "inline.onnx")
    assert load_onnx(tmp_path / "inline.onnx").layout is None
    _save_external(m, tmp_path / "m.onnx", threshold=1024)
    big = frozenset(t.name for t in m.graph.initializer if len(t.raw_data) >= 1024)
    assert load_onnx(tmp_path / "m.onnx").layout == ExternalLayout(big, 1024)


def test_plain_onnx_load_with_the_layout_saves_the_same(tmp_path):
    """Nothing is remembered about a model: a plain onnx.load plus the same layout gives the same files."""
    m, _ = _model()
    _save_external(m, tmp_path / "m.onnx", threshold=1024)
    ours = load_onnx(tmp_path / "m.onnx")
    plain = onnx.load(str(tmp_path / "m.onnx"))
    explicit = ExternalLayout(names={"W", "W2"}, threshold=1024)
    assert explicit == ours.layout
    for folder, model, layout in (("a", ours.model, ours.layout), ("b", plain, explicit)):
        (tmp_path / folder).mkdir()
        save_onnx(model, tmp_path / folder / "out.onnx", layout=layout)
    for name in ("out.onnx", "out.onnx.data"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert set(_external_tensors(onnx.load(str(tmp_path / "b" / "out.onnx"), load_external_data=False))) == {"W", "W2"}
    # without a layout the same model is one file, whichever way it was read
    save_onnx(plain, tmp_path / "c.onnx")
    save_onnx(ours.model, tmp_path / "d.onnx")
    assert (tmp_path / "c.onnx").read_bytes() == (tmp_path / "d.onnx").read_bytes()
    assert not (tmp_path / "c.onnx.data").exists()


def test_layout_names_missing_from_the_model_are_ignored(tmp_path):
    m, feeds = _model()
    save_onnx(m, tmp_path / "m.onnx", layout=ExternalLayout(names={"B", "gone"}, threshold=10**9))
    on_disk = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    assert _external_tensors(on_disk) == ["B"]
    compare(m, load_onnx(tmp_path / "m.onnx").model, feeds)
    with pytest.raises(ValueError, match="threshold"):
        ExternalLayout(threshold=-1)


def test_failed_save_leaves_both_files_as_they_were(tmp_path, monkeypatch):
    """The data file is written first; when the model file then fails, neither is replaced."""
    import bnfold.io.onnx as io_onnx

    m, _ = _model()
    p = tmp_path / "m.onnx"
    p.write_bytes(b"old model")
    (tmp_path / "m.onnx.data").write_bytes(b"old data")

    def broken_write(path, blob):
        with open(path, "wb") as f:
            f.write(blob[:10])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(io_onnx, "_write", broken_write)
    with pytest.raises(ModelFileError, match="No space left") as e:
        save_onnx(m, p, layout=ExternalLayout())
    assert "\n" not in str(e.value) and str(p) in str(e.value)
    assert p.read_bytes() == b"old model"
    assert (tmp_path / "m.onnx.data").read_bytes() == b"old data"
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data"]  # no temporary files left
