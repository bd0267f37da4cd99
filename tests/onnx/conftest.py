"""The ONNX tests run torch single-threaded: on a small shared machine torch's
thread pool makes the fold math's elementwise ops many times slower."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
