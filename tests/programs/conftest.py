import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matrices: one intra-op thread is faster, and far faster on a loaded machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def healthy_cuda_random():
    """Keep one test's broken CUDA generator from failing the next ones.

    A capture that fails inside ``tensordict.nn.CudaGraphModule`` (it refuses the
    published PPO update, which these tests compare against) leaves the process's CUDA
    generator in capture mode: every later ``torch.randn`` on the GPU raises "Offset
    increment outside graph capture". graphmodule heals that after its own failed
    captures; here the same healing runs after any test that left it broken, so each
    test reports its own result.
    """
    yield
    if not torch.cuda.is_available():
        return
    try:
        torch.randn(1, device="cuda")
    except RuntimeError:
        from graphmodule._runner_cuda import heal_generator

        heal_generator(torch.device("cuda", torch.cuda.current_device()))
        torch.randn(1, device="cuda")
