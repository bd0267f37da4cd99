"""Channel 5: bnfold never writes over its input, a file its input reads, or an existing file
without ``--force``, and a failed write is one line with nothing left behind."""

from __future__ import annotations

import crafted as c
import numpy as np
from onnx import numpy_helper


def _onnx_with_external(folder, location: str):
    """m.onnx whose weight W lives in ``location`` beside it."""
    m = c.onnx_conv_bn()
    w = m.graph.initializer[0]
    raw = numpy_helper.to_array(w).astype(np.float32).tobytes()
    (folder / location).write_bytes(raw)
    c.set_external(w, location, 0, len(raw))
    return c.save_onnx(m, folder / "m.onnx")


def test_outputs_never_clobber_and_a_full_disk_is_one_line(programs, tmp_path):
    """The process runs with RLIMIT_FSIZE: a write past 4 KiB fails with EFBIG, as on a full disk."""
    src = _onnx_with_external(tmp_path, "w.data")
    data_before = (tmp_path / "w.data").read_bytes()
    src2_dir = tmp_path / "two"
    src2_dir.mkdir()
    src2 = _onnx_with_external(src2_dir, "x.onnx")  # its external data file has a model's name
    x_before = (src2_dir / "x.onnx").read_bytes()
    report = tmp_path / "r.json"
    report.write_text("precious")
    plot = tmp_path / "p.png"
    plot.write_text("precious")
    full = tmp_path / "full"
    full.mkdir()
    runs = c.run_bnfold(
        tmp_path,
        ["fold", src, "-o", tmp_path / "o.onnx", "--report", tmp_path / "w.data", "--force"],
        ["fold", src2, "-o", src2_dir / "x.onnx", "--force"],
        ["fold", programs["conv_bn"], "-o", tmp_path / "o.pt2", "--report", report],
        ["audit", programs["conv_bn"], "--random", "1", "--plot", plot],
        ["fold", programs["conv_bn"], "-o", full / "o.pt2", "--report", full / "r.json"],
        fsize=4096,
    )
    c.assert_refused(runs[0], "w.data", "external data")
    c.assert_refused(runs[1], "x.onnx", "external data")
    c.assert_refused(runs[2], "r.json", "already exists", "--force")
    c.assert_refused(runs[3], "p.png", "already exists")
    c.assert_refused(runs[4], "o.pt2", "cannot write")
    assert (tmp_path / "w.data").read_bytes() == data_before
    assert (src2_dir / "x.onnx").read_bytes() == x_before
    assert report.read_text() == plot.read_text() == "precious"
    assert c.listing(tmp_path) == {"m.onnx", "w.data", "two", "r.json", "p.png", "full"}
    assert c.listing(full) == set()  # no temporary file left behind
