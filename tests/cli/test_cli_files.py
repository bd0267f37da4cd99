"""Output rules (--force, --in-place, atomic writes) and bad input files, in-process."""

from __future__ import annotations

import io
import json
import os
import zipfile

import pytest
import torch

import cli_helpers as h


def test_existing_output_is_kept_without_force(run, models, tmp_path):
    src = h.copy_to(models["conv_bn"], tmp_path)
    out = tmp_path / "out.pt2"
    out.write_bytes(b"precious")
    code, _, err = run("fold", src, "-o", out)
    assert code == 2
    h.one_error_line(err, str(out), "--force")
    assert out.read_bytes() == b"precious"
    code, _, _ = run("fold", src, "-o", out, "--force")
    assert code == 0
    assert h.norm_count(torch.export.load(str(out))) == 0


def test_input_is_not_overwritten_without_in_place(run, models, tmp_path):
    src = h.copy_to(models["conv_bn"], tmp_path)
    before = src.read_bytes()
    for extra in ([], ["--force"]):
        code, _, err = run("fold", src, "-o", src, *extra)
        assert code == 2
        h.one_error_line(err, "--in-place")
        assert src.read_bytes() == before
    # another spelling of the same file is caught as well
    code, _, _ = run("fold", src, "-o", tmp_path / "." / src.name, "--force")
    assert code == 2 and src.read_bytes() == before


def test_in_place(run, models, tmp_path):
    src = h.copy_to(models["conv_bn"], tmp_path)
    os.chmod(src, 0o640)
    code, stdout, err = run("fold", src, "--in-place")
    assert code == 0, err
    assert h.norm_count(torch.export.load(str(src))) == 0
    assert h.listing(tmp_path) == {src.name}
    assert h.mode_of(src) == 0o640  # the replaced file keeps its permissions


def test_in_place_with_a_different_output_is_refused(run, models, tmp_path):
    src = h.copy_to(models["conv_bn"], tmp_path)
    code, _, err = run("fold", src, "--in-place", "-o", tmp_path / "other.pt2")
    assert code == 2
    h.one_error_line(err, "--in-place")


def test_output_is_required(run, models, tmp_path):
    src = h.copy_to(models["conv_bn"], tmp_path)
    code, _, err = run("fold", src)
    assert code == 2
    h.one_error_line(err, "-o OUT")


@pytest.mark.parametrize("name", ["out.onnx", "out.pt", "out"])
def test_output_format_must_match(run, models, tmp_path, name):
    src = h.copy_to(models["conv_bn"], tmp_path)
    code, _, err = run("fold", src, "-o", tmp_path / name)
    assert code == 2
    h.one_error_line(err, name)
    assert h.listing(tmp_path) == {src.name}


def test_output_folder_must_exist(run, models, tmp_path):
    src = h.copy_to(models["conv_bn"], tmp_path)
    code, _, err = run("fold", src, "-o", tmp_path / "nope" / "out.pt2")
    assert code == 2
    h.one_error_line(err, "does not exist")
    assert h.listing(tmp_path) == {src.name}


def test_new_output_gets_default_permissions(run, models, tmp_path):
    out = tmp_path / "out.pt2"
    assert run("fold", models["conv_bn"], "-o", out)[0] == 0
    umask = os.umask(0)
    os.umask(umask)
    assert h.mode_of(out) == 0o666 & ~umask


def test_failed_write_leaves_no_file(run, models, tmp_path, monkeypatch):
    """A save that dies half way leaves neither OUT, nor the report, nor a temporary file."""
    src = h.copy_to(models["conv_bn"], tmp_path)

    def broken_save(ep, f, **kw):
        f.write(b"PK\x03\x04 half an archive")
        raise OSError("disk full")

    monkeypatch.setattr(torch.export, "save", broken_save)
    code, _, err = run("fold", src, "-o", tmp_path / "out.pt2", "--report", tmp_path / "r.json")
    assert code == 2
    h.one_error_line(err, "out.pt2", "disk full")
    assert h.listing(tmp_path) == {src.name}

    old = tmp_path / "old.pt2"
    old.write_bytes(b"old contents")
    code, _, _ = run("fold", src, "-o", old, "--force")
    assert code == 2
    assert old.read_bytes() == b"old contents"
    assert h.listing(tmp_path) == {src.name, old.name}


def test_report_may_not_overwrite_a_model(run, models, tmp_path):
    src = h.copy_to(models["conv_bn"], tmp_path)
    before = src.read_bytes()
    code, _, err = run("fold", src, "-o", tmp_path / "out.pt2", "--report", src)
    assert code == 2
    h.one_error_line(err, "report")
    assert src.read_bytes() == before
    assert h.listing(tmp_path) == {src.name}


# ----------------------------------------------------------------------------- bad input files


def _truncated(models, folder):
    data = models["conv_bn"].read_bytes()
    p = folder / "truncated.pt2"
    p.write_bytes(data[: len(data) // 2])
    return p


def _corrupted(models, folder):
    """Garbage in the middle of the program's JSON (the zip directory is intact)."""
    entries = h.read_entries(models["conv_bn"])
    root = h.root_of(entries)
    entries[f"{root}/models/model.json"] = b"{\x00\x9f not json"
    return h.write_entries(folder / "corrupted.pt2", entries)


def _text(models, folder):
    p = folder / "text.pt2"
    p.write_text("this is not a model\n")
    return p


def _empty(models, folder):
    p = folder / "empty.pt2"
    p.write_bytes(b"")
    return p


def _zip_without_model(models, folder):
    return h.write_entries(folder / "nomodel.pt2", {"stuff/readme.txt": b"hi", "stuff/data.bin": b"\x00" * 10})


def _pt2_without_model(models, folder):
    """A real pt2 archive with the program removed."""
    entries = {k: v for k, v in h.read_entries(models["conv_bn"]).items() if "/models/" not in k}
    return h.write_entries(folder / "noprogram.pt2", entries)


def _checkpoint(models, folder):
    p = folder / "checkpoint.pt2"
    torch.save({"weight": torch.zeros(3)}, str(p))
    return p


def _missing(models, folder):
    return folder / "missing.pt2"


def _directory(models, folder):
    p = folder / "dir.pt2"
    p.mkdir()
    return p


def _wrong_extension(models, folder):
    return h.copy_to(models["conv_bn"], folder, "model.txt")


def _random_onnx(models, folder):
    p = folder / "random.onnx"
    p.write_bytes(os.urandom(4096))
    return p


def _truncated_onnx(models, folder):
    p = folder / "truncated.onnx"
    data = h.onnx_conv_bn().SerializeToString()
    p.write_bytes(data[: len(data) // 3])
    return p


def _future_opset_onnx(models, folder):
    p = folder / "opset.onnx"
    p.write_bytes(h.onnx_conv_bn(opset=999).SerializeToString())
    return p


BAD_INPUTS = {
    "missing": (_missing, "no such file"),
    "empty": (_empty, "empty"),
    "directory": (_directory, "directory"),
    "text file": (_text, "not a .pt2 archive"),
    "truncated": (_truncated, "truncated or corrupted"),
    "corrupted": (_corrupted, "not valid JSON"),
    "zip without a model": (_zip_without_model, "not a torch.export .pt2 archive"),
    "pt2 without a program": (_pt2_without_model, "no exported program"),
    "torch.save checkpoint": (_checkpoint, "torch.save checkpoint"),
    "wrong extension": (_wrong_extension, "unsupported model file"),
    "random bytes .onnx": (_random_onnx, "random.onnx"),
    "truncated .onnx": (_truncated_onnx, "truncated.onnx"),
    "unsupported opset": (_future_opset_onnx, "opset 999"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
@pytest.mark.parametrize("command", ["fold", "check"])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(run, models, tmp_path, case, command):
    if "onnx" in case or case == "unsupported opset":
        pytest.importorskip("bnfold.onnx")
    make, problem = BAD_INPUTS[case]
    folder = tmp_path / "in"
    folder.mkdir()
    bad = make(models, folder)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    ext = os.path.splitext(str(bad))[1] if str(bad).endswith((".onnx", ".pt2")) else ".pt2"
    argv = [command, bad] + (["-o", out_dir / f"out{ext}"] if command == "fold" else [])
    before = h.listing(folder)
    code, stdout, err = run(*argv)
    assert code == 2
    h.one_error_line(err, bad.name, problem)
    assert h.listing(out_dir) == set()
    assert h.listing(folder) == before


def test_audit_of_a_broken_onnx_is_one_line(run, tmp_path):
    p = tmp_path / "m.onnx"
    p.write_bytes(b"whatever")
    code, _, err = run("audit", p)
    assert code == 2
    h.one_error_line(err, "m.onnx", "not an ONNX model")


def test_inspection_reads_the_file_once(models, tmp_path, monkeypatch):
    """The bytes that were inspected are the bytes that are loaded (no re-open between check and load)."""
    from bnfold.io.pt2 import load_pt2

    src = h.copy_to(models["conv_bn"], tmp_path)
    opened = []
    real_open = open

    def counting_open(file, *a, **kw):
        if os.fspath(file) == str(src):
            opened.append(file)
        return real_open(file, *a, **kw)

    monkeypatch.setattr("builtins.open", counting_open)
    real_os_open = os.open

    def counting_os_open(file, *a, **kw):
        if os.fspath(file) == str(src):
            opened.append(file)
        return real_os_open(file, *a, **kw)

    monkeypatch.setattr(os, "open", counting_os_open)
    loaded = []
    real_load = torch.export.load

    def recording_load(f, **kw):
        loaded.append(f)
        return real_load(f, **kw)

    monkeypatch.setattr(torch.export, "load", recording_load)
    ep = load_pt2(str(src))
    assert isinstance(ep, torch.export.ExportedProgram)
    assert len(opened) == 1
    assert len(loaded) == 1 and isinstance(loaded[0], io.BytesIO)
    assert loaded[0].getvalue() == src.read_bytes()
    assert zipfile.is_zipfile(io.BytesIO(loaded[0].getvalue()))


def test_low_memory_writes_the_same_file_and_report(run, models, tmp_path):
    """--low-memory folds the program it read in place: the same bytes, the same report (but the time)."""
    outs = {}
    for extra in ([], ["--low-memory"]):
        out, report = tmp_path / f"out{len(extra)}.pt2", tmp_path / f"report{len(extra)}.json"
        code, _, err = run("fold", models["conv_bn"], "-o", out, "--report", report, *extra)
        assert code == 0, err
        payload = json.loads(report.read_text())
        payload["summary"].pop("seconds")
        payload.pop("output")
        outs[bool(extra)] = (out.read_bytes(), payload)
    assert outs[True][1] == outs[False][1] and outs[True][1]["summary"]["folded"] == 1
    assert outs[True][0] == outs[False][0]


def test_low_memory_folds_onnx_streamed_and_refuses_training_programs(run, models, tmp_path):
    """--low-memory on an ONNX model is the streamed fold (tests/onnx/test_onnx_stream.py): the same file."""
    onnx_path = tmp_path / "m.onnx"
    onnx_path.write_bytes(h.onnx_conv_bn().SerializeToString())
    for name, extra in (("a.onnx", []), ("b.onnx", ["--low-memory"])):
        code, _, err = run("fold", onnx_path, "-o", tmp_path / name, *extra)
        assert code == 0, err
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
    src = tmp_path / "train.pt2"
    torch.export.save(torch.export.export(h.randomize_bn(h.ConvBN()).train(), (torch.randn(h.EXAMPLE_SHAPE),)), src)
    code, _, err = run("fold", src, "-o", tmp_path / "out.pt2", "--low-memory", "--trust")
    assert code == 2 and not (tmp_path / "out.pt2").exists()
    h.one_error_line(err, "train.pt2", "in training mode")
