import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """The tensors here are small; on a shared 2-core machine extra threads only contend."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
