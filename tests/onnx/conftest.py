"""The ONNX tests run torch single-threaded: on a small shared machine torch's
thread pool makes the fold math's elementwise ops many times slower."""

import pytest

from bnfold_testutil import one_torch_thread


@pytest.fixture(autouse=True)
def _one_torch_thread():
    with one_torch_thread():
        yield
