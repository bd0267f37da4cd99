"""An external tensor is read whole however many bytes each read returns: Linux returns at most 2147479552 bytes
a ``pread``, so a tensor over 2 GiB (a large model's embedding) came back short and was refused as a changed file."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bnfold.errors import ModelFileError
from bnfold.io import onnx_external
from bnfold.io.onnx import load_onnx


@pytest.fixture
def short_reads(monkeypatch):
    """``os.pread`` returning at most 7 bytes a call, as the kernel does past its per-call cap."""
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, offset: real(fd, min(n, 7), offset))


def test_a_read_cut_short_by_the_kernel_is_read_on(tmp_path, short_reads):
    path = tmp_path / "d.bin"
    data = bytes(range(256)) * 3
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert onnx_external.read_exactly(fd, str(path), 5, 700, "m.onnx") == data[5:705]
        with pytest.raises(ModelFileError, match="changed while it was read"):  # past the end: the file changed
            onnx_external.read_exactly(fd, str(path), 100, 700, "m.onnx")
    finally:
        os.close(fd)


def test_a_model_whose_tensors_come_back_in_short_reads_loads_whole(tmp_path, short_reads):
    w = np.arange(4096, dtype=np.float32).reshape(64, 64)
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [numpy_helper.from_array(w, "w")],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph), path, save_as_external_data=True, location="m.data", size_threshold=0)
    model = load_onnx(str(path)).model
    (init,) = model.graph.initializer
    np.testing.assert_array_equal(numpy_helper.to_array(init), w)
