import os
import sys

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (on a machine with one: bash scripts/gpu_check.sh)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def cuda():
    """The CUDA device; tests using it carry the ``cuda`` marker."""
    return torch.device("cuda", torch.cuda.current_device())


@pytest.fixture
def make():
    """Build a CudaGraphModule for CPU tests, on a named backend, without the no-CUDA warning."""
    from graphmodule import CudaGraphModule

    def _make(module, *args, backend="simulate", **kwargs):
        return CudaGraphModule(module, *args, backend=backend, **kwargs)

    return _make


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


@pytest.fixture(params=["simulate", pytest.param("cuda", marks=pytest.mark.cuda)])
def graph_backend(request):
    """Simulated replays on CPU, and real CUDA graphs on a GPU (where tensors the test creates
    land by default): one test body, proven both ways."""
    if request.param == "simulate":
        yield "simulate"
        return
    previous = torch.get_default_device()
    torch.set_default_device("cuda")
    try:
        yield "cuda"
    finally:
        torch.set_default_device(previous)


@pytest.fixture
def ones(graph_backend):
    """``torch.ones(2, 3)`` on the device a ``graph_backend`` test runs on (CUDA under "cuda"):
    a tensor made at import is on the CPU, whatever the backend."""
    return torch.ones(2, 3)


@pytest.fixture
def slow_calls(monkeypatch):
    """``slow_calls(g)``: a list that grows by one at each call of ``g`` that leaves the hot path
    (a warmup call, a capture, a graph switch, a mismatch to explain)."""

    def count(g):
        calls = []
        slow = g._slow

        def counted(args, kwargs):
            calls.append(1)
            return slow(args, kwargs)

        monkeypatch.setattr(g, "_slow", counted)
        return calls

    return count
