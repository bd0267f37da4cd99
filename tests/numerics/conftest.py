"""The numerics tests run torch single-threaded (``bnfold_testutil.one_torch_thread``)."""

import pytest

from bnfold_testutil import one_torch_thread


@pytest.fixture(autouse=True)
def _one_torch_thread():
    with one_torch_thread():
        yield
