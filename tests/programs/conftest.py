import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matrices: one intra-op thread is faster, and far faster on a loaded machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
