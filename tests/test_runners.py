"""Runners: one protocol, answered in full by each runner; what a capture returns.

The wrapper calls its runner without asking which one it has (no ``isinstance`` or
``hasattr``): each runner must answer every part of :class:`~graphmodule._runners.Runner`.
The CUDA tests check what only real graphs show: the graph and pool a wrapper exposes,
and what a capture reports.
"""

import inspect

import pytest
import torch
from torch import nn

from graphmodule import CudaGraphModule
from graphmodule._runner_cuda import CudaRunner
from graphmodule._runner_simulate import SimulatedRunner
from graphmodule._runners import CaptureResult, EagerRunner, Runner

_MEMBERS = sorted(
    {name for name, _ in inspect.getmembers(Runner, inspect.isfunction) if not name.startswith("_")}
    | set(Runner.__annotations__)
)


@pytest.mark.parametrize("runner", [EagerRunner, SimulatedRunner, CudaRunner], ids=lambda r: r.__name__)
def test_every_runner_answers_the_whole_protocol(runner):
    missing = [name for name in _MEMBERS if not hasattr(runner, name) and name not in ("device",)]
    assert missing == [], f"{runner.__name__} lacks {missing}"
    assert "device" in _MEMBERS and "capture" in _MEMBERS and "on_capture_stream" in _MEMBERS


def test_a_simulated_capture_returns_what_it_made():
    runner = SimulatedRunner()
    result = runner.capture(lambda: torch.ones(2) * 3, "test")
    assert isinstance(result, CaptureResult)
    torch.testing.assert_close(result.out, torch.full((2,), 3.0))
    assert result.bytes == 0 and result.seconds >= 0
    runner.release(result.handle)


def test_a_wrapper_without_cuda_has_no_graph_and_no_pool():
    g = CudaGraphModule(lambda x: x + 1, warmup=1, backend="simulate")
    for _ in range(3):
        g(torch.zeros(2))
    assert g.state == "captured" and g.graph is None and g.pool is None and g.stats.pool_bytes == 0
    assert g.stats.capture_seconds > 0


@pytest.mark.cuda
def test_a_cuda_wrapper_shows_its_graph_and_pool(cuda):
    a = CudaGraphModule(lambda x: x * 2 + 1, warmup=1)
    b = CudaGraphModule(lambda x: x * 3 + 1, warmup=1, pool=a.pool)
    x = torch.ones(1024, device=cuda)
    for _ in range(2):
        a(x)
        b(x)
    assert isinstance(a.graph, torch.cuda.CUDAGraph) and isinstance(b.graph, torch.cuda.CUDAGraph)
    assert a.graph.pool() == b.graph.pool() == getattr(a.pool, "id", a.pool)  # one pool
    assert a.stats.pool_bytes > 0 and a.stats.capture_seconds > 0


@pytest.mark.cuda
def test_a_graph_that_launches_nothing_has_no_cuda_graph(cuda):
    g = CudaGraphModule(lambda x: x[1:], warmup=1)
    x = torch.arange(4.0, device=cuda)
    for _ in range(3):
        torch.testing.assert_close(g(x), x[1:])
    assert g.state == "captured" and g.graph is None


@pytest.mark.cuda
def test_a_layers_capture_counts_its_backward(cuda):
    """A layer's entry reports its forward's and its backward's capture together."""
    layer = nn.Linear(256, 256).to(cuda)
    g = CudaGraphModule(layer, warmup=1)
    x = torch.randn(64, 256, device=cuda, requires_grad=True)
    for _ in range(3):
        g(x).sum().backward()
    assert "a forward and a backward graph" in g.explain()
    assert g.stats.capture_seconds > 0 and g.stats.graph_bytes[0] >= 0
