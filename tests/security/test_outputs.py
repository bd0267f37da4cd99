"""Channel 5: bnfold never writes over its input, a file its input reads, or an existing file
without ``--force``, and a failed write is one line with nothing left behind."""

from __future__ import annotations

import crafted as c
import numpy as np
import pytest
from onnx import numpy_helper


def _onnx_with_external(folder, location: str):
    """m.onnx whose weight W lives in ``location`` beside it."""
    m = c.onnx_conv_bn()
    w = m.graph.initializer[0]
    raw = numpy_helper.to_array(w).astype(np.float32).tobytes()
    (folder / location).write_bytes(raw)
    c.set_external(w, location, 0, len(raw))
    return c.save_onnx(m, folder / "m.onnx")


CASES = [
    "report-on-external-data", "output-is-external-data", "existing-report", "existing-plot", "full-disk",
]  # fmt: skip


@pytest.fixture(scope="module")
def runs(programs, tmp_path_factory):
    """All five commands in one subprocess with RLIMIT_FSIZE: a write past 4 KiB fails with EFBIG, as on a
    full disk.  Returns ``{case: result}`` and the folder."""
    tmp_path = tmp_path_factory.mktemp("outputs")
    src = _onnx_with_external(tmp_path, "w.data")
    src2_dir = tmp_path / "two"
    src2_dir.mkdir()
    src2 = _onnx_with_external(src2_dir, "x.onnx")  # its external data file has a model's name
    report = tmp_path / "r.json"
    report.write_text("precious")
    plot = tmp_path / "p.png"
    plot.write_text("precious")
    full = tmp_path / "full"
    full.mkdir()
    before = {"w.data": (tmp_path / "w.data").read_bytes(), "x.onnx": (src2_dir / "x.onnx").read_bytes()}
    results = c.run_bnfold(
        tmp_path,
        ["fold", src, "-o", tmp_path / "o.onnx", "--report", tmp_path / "w.data", "--force"],
        ["fold", src2, "-o", src2_dir / "x.onnx", "--force"],
        ["fold", programs["conv_bn"], "-o", tmp_path / "o.pt2", "--report", report],
        ["audit", programs["conv_bn"], "--random", "1", "--plot", plot],
        ["fold", programs["conv_bn"], "-o", full / "o.pt2", "--report", full / "r.json"],
        fsize=4096,
    )
    return dict(zip(CASES, results, strict=True)), tmp_path, before


EXPECTED = {
    "report-on-external-data": ("w.data", "external data"),
    "output-is-external-data": ("x.onnx", "external data"),
    "existing-report": ("r.json", "already exists", "--force"),
    "existing-plot": ("p.png", "already exists"),
    "full-disk": ("o.pt2", "cannot write"),
}


@pytest.mark.parametrize("case", CASES)
def test_outputs_never_clobber_and_a_full_disk_is_one_line(case, runs):
    results, tmp_path, before = runs
    c.assert_refused(results[case], *EXPECTED[case])
    assert (tmp_path / "w.data").read_bytes() == before["w.data"]
    assert (tmp_path / "two" / "x.onnx").read_bytes() == before["x.onnx"]
    assert (tmp_path / "r.json").read_text() == (tmp_path / "p.png").read_text() == "precious"
    assert c.listing(tmp_path) == {"m.onnx", "w.data", "two", "r.json", "p.png", "full"}
    assert c.listing(tmp_path / "full") == set()  # no temporary file left behind
