"""bnfold.io.atomic: a write that fails leaves the destination as it was and no temporary file."""

from __future__ import annotations

import os

import pytest

import cli_helpers as h
from bnfold.io import atomic, one_line


class Boom(Exception):
    pass


def _fail_half_way(f):
    f.write(b"half a file")
    raise Boom("write failed")


def test_failed_write_leaves_no_file(tmp_path):
    with pytest.raises(Boom):
        atomic.write_bytes(tmp_path / "new.bin", _fail_half_way)
    assert h.listing(tmp_path) == set()


def test_failed_write_keeps_the_old_file(tmp_path):
    old = tmp_path / "old.bin"
    old.write_bytes(b"old contents")
    with pytest.raises(Boom):
        atomic.write_bytes(old, _fail_half_way)
    assert old.read_bytes() == b"old contents"
    assert h.listing(tmp_path) == {"old.bin"}


def test_interrupted_write_leaves_no_file(tmp_path):
    def interrupted(f):
        f.write(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic.write_bytes(tmp_path / "x.bin", interrupted)
    assert h.listing(tmp_path) == set()


def test_files_written_together_are_all_or_nothing(tmp_path):
    first, second = tmp_path / "a.data", tmp_path / "a.onnx"
    second.write_bytes(b"old model")
    with pytest.raises(Boom), atomic.atomic_paths([first, second]) as (tmp_a, tmp_b):
        assert os.path.dirname(tmp_a) == str(tmp_path)  # temporary files live in the destination folder
        with open(tmp_a, "wb") as f:
            f.write(b"data")
        raise Boom("the second file failed")
    assert h.listing(tmp_path) == {"a.onnx"}
    assert second.read_bytes() == b"old model"

    with atomic.atomic_paths([first, second]) as (tmp_a, tmp_b):
        for tmp, text in ((tmp_a, b"data"), (tmp_b, b"model")):
            with open(tmp, "wb") as f:
                f.write(text)
    assert first.read_bytes() == b"data" and second.read_bytes() == b"model"
    assert h.listing(tmp_path) == {"a.data", "a.onnx"}


def test_modes_kept_or_given(tmp_path):
    p = tmp_path / "kept.txt"
    p.write_text("old")
    os.chmod(p, 0o640)
    atomic.write_text(p, "new")
    assert p.read_text() == "new" and h.mode_of(p) == 0o640
    umask = os.umask(0)
    os.umask(umask)
    atomic.write_text(tmp_path / "fresh.txt", "x")
    assert h.mode_of(tmp_path / "fresh.txt") == 0o666 & ~umask
    with atomic.atomic_path(tmp_path / "given.txt", mode=0o600) as tmp, open(tmp, "w") as f:
        f.write("x")
    assert h.mode_of(tmp_path / "given.txt") == 0o600


def test_missing_folder_is_an_error_and_writes_nothing(tmp_path):
    with pytest.raises(FileNotFoundError):
        atomic.write_text(tmp_path / "nope" / "x.txt", "x")
    assert h.listing(tmp_path) == set()


def test_one_line():
    assert one_line(ValueError("first\nsecond")) == "first"
    assert one_line(ValueError("")) == "ValueError"
    assert one_line(ValueError("x" * 1000)) == "x" * 297 + "..."
    assert one_line("a message\n  over two lines") == "a message over two lines"


def test_sigterm_during_a_write_cleans_up_like_ctrl_c(tmp_path):
    """SIGTERM while a temporary file exists raises KeyboardInterrupt; the file is removed, the old one kept."""
    import signal

    old = tmp_path / "old.bin"
    old.write_bytes(b"old contents")
    before = signal.getsignal(signal.SIGTERM)

    def killed_half_way(f):
        f.write(b"half a file")
        os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(KeyboardInterrupt):
        atomic.write_bytes(old, killed_half_way)
    assert h.listing(tmp_path) == {"old.bin"}
    assert old.read_bytes() == b"old contents"
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is only there during writes


def test_start_writeback_is_a_hint_that_never_fails(tmp_path):
    """Asking for the writeback of a temporary file's bytes changes none of them, and a descriptor that is no file
    (a pipe) raises nothing: it is only a hint, the sync before the move is what makes them durable."""
    r, w = os.pipe()
    try:
        atomic.start_writeback(w, 0, 4096)  # no file: the kernel refuses, nothing is raised
    finally:
        os.close(r), os.close(w)
    with open(tmp_path / "f", "wb") as f:
        f.write(b"kept" * 1024)
        f.flush()
        atomic.start_writeback(f.fileno(), 0, 4096)
    assert (tmp_path / "f").read_bytes() == b"kept" * 1024
