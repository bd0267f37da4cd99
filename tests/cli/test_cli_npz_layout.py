"""One ``.npz`` for every format: samples stacked along the batch axis (``[N*B, ...]``, the input's rank) are
taken the model's batch size B at a time, and batches stacked on a new first axis (``[N, B, ...]``) are N batches,
for a .pt2 and for its ONNX exports alike.  Before, a batch-1 ONNX refused 8 samples as ``[8, 3, 8, 8]``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cli_helpers as h
from bnfold.io import batches as cli_inputs

FORMATS = ["pt2", "onnx_ts", "onnx_dynamo"]


def _npz(path, shape):
    np.savez(path, x=np.random.default_rng(0).standard_normal(shape).astype(np.float32))
    return path


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", [(3, 3, 8, 8), (3, 1, 3, 8, 8)], ids=["samples", "batches"])
def test_one_npz_audits_every_format(run, long_names, tmp_path, fmt, shape):
    if fmt != "pt2":
        pytest.importorskip("onnx")
    code, out, err = run("audit", long_names[fmt], "--inputs", _npz(tmp_path / "in.npz", shape))
    assert code == 0, err
    assert out.splitlines()[0].endswith("3 samples in 3 batch(es)")


def test_samples_go_a_fixed_batch_at_a_time(tmp_path):
    onnx = pytest.importorskip("onnx")
    path = h.export_onnx_to(tmp_path / "b2.onnx", h.LongNames(), torch.randn(2, 3, 8, 8), dynamo=False)
    model = onnx.load(str(path))
    batches = cli_inputs.onnx_npz_batches(model, str(_npz(tmp_path / "six.npz", (6, 3, 8, 8))))
    assert [tuple(b[0].shape) for b in batches] == [(2, 3, 8, 8)] * 3


def test_samples_that_do_not_fill_the_batches_say_how_to_lay_them_out(run, tmp_path):
    pytest.importorskip("onnx")
    path = h.export_onnx_to(tmp_path / "b2.onnx", h.LongNames(), torch.randn(2, 3, 8, 8), dynamo=False)
    code, _, err = run("audit", path, "--inputs", _npz(tmp_path / "three.npz", (3, 3, 8, 8)))
    assert code == 2
    h.one_error_line(
        err,
        "holds 3 samples along the batch axis, not a multiple of input x's batch size 2",
        "[N*2, ...]",
        "[N, 2, ...]",
    )


def test_a_missing_npz_reads_right(run, long_names, tmp_path):
    code, _, err = run("audit", long_names["pt2"], "--inputs", tmp_path / "nope.npz")
    assert code == 2
    h.one_error_line(err, "no such file; check the path to the .npz file")  # was "to the an .npz file"
