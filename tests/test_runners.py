"""Runners: one narrow protocol, answered in full by each runner; what a capture returns; the
process's capture scope (``_runners``, ``_runner_cuda``, ``_runner_simulate``, ``_scope``).

The wrapper calls its runner without asking which one it has (no ``isinstance`` or
``hasattr``): each runner answers every part of :class:`~graphmodule._runners.Runner`, and
what only one runner has (the CUDA graph, its structure) comes back as values in the
:class:`~graphmodule._runners.CaptureResult`. The CUDA tests check what only real graphs
show: the graph and pool a wrapper exposes, and what a capture reports.
"""

import inspect
import os
import re
import threading

import pytest
import torch
from torch import nn

import graphmodule
from graphmodule import CaptureError, CudaGraphModule, GraphStateError
from graphmodule._runner_cuda import CudaRunner
from graphmodule._runner_simulate import SimulatedRunner
from graphmodule._runners import NO_POOL, CaptureResult, EagerRunner, Kind, Pool, Runner
from graphmodule._scope import SCOPE

_METHODS = sorted(name for name, _ in inspect.getmembers(Runner, inspect.isfunction) if not name.startswith("_"))
_MEMBERS = sorted(set(_METHODS) | set(Runner.__annotations__))
_POOL = sorted(name for name, _ in inspect.getmembers(Pool, inspect.isfunction) if not name.startswith("_"))


def _parameters(fn):
    return [p.name for p in inspect.signature(fn).parameters.values()]


class TestProtocol:
    def test_it_is_narrow(self):
        """Run eagerly, capture, replay, release, the pool, the streams: and what the runner is."""
        assert _MEMBERS == ["capture", "device", "kind", "new_caller", "on_capture_stream", "pool", "release",
                            "replay", "run_eager"]
        assert _POOL == ["bytes", "handle", "in_use"]

    @pytest.mark.parametrize("make", [EagerRunner, lambda: EagerRunner(Kind.NO_CUDA), SimulatedRunner],
                             ids=["eager", "no-cuda", "simulate"])
    def test_every_runner_answers_all_of_it(self, make):
        runner = make()
        assert [name for name in _MEMBERS if not hasattr(runner, name)] == []
        for name in _METHODS:
            assert _parameters(getattr(runner, name)) == _parameters(getattr(Runner, name))[1:], name
        for name in _POOL:
            assert _parameters(getattr(runner.pool, name)) == [], name
        assert isinstance(runner.kind, Kind) and runner.device is None

    def test_the_cuda_runner_defines_every_method(self):
        """(Its instance needs CUDA: see the cuda tests for its pool and device.)"""
        for name in _METHODS:
            assert _parameters(getattr(CudaRunner, name)) == _parameters(getattr(Runner, name)), name
        assert CudaRunner.kind is Kind.CUDA

    def test_callers_use_only_the_protocol(self):
        """Outside the runners' own modules, code reads of a runner only what the protocol has."""
        package = os.path.dirname(graphmodule.__file__)
        own = {"_runners.py", "_runner_cuda.py", "_runner_simulate.py", "_backend.py"}
        used = {}
        for name in sorted(os.listdir(package)):
            if name.endswith(".py") and name not in own:
                with open(os.path.join(package, name)) as f:
                    for member in re.findall(r"(?<![A-Za-z0-9])_?runner\.(\w+)", f.read()):
                        used.setdefault(member, set()).add(name)
        assert set(used) <= set(_MEMBERS), {m: sorted(f) for m, f in used.items() if m not in _MEMBERS}
        assert {"capture", "replay", "release", "run_eager", "pool", "kind", "device", "new_caller"} <= set(used)


class TestKind:
    def test_which_kinds_capture(self):
        assert [kind for kind in Kind if kind.captures] == [Kind.CUDA, Kind.SIMULATED]

    def test_an_eager_runner_refuses_to_capture_saying_why(self):
        with pytest.raises(GraphStateError) as info:
            EagerRunner(Kind.NO_CUDA).capture(lambda: None, "CudaGraphModule(f)")
        assert str(info.value) == "CudaGraphModule(f) runs every call eagerly (no CUDA: it runs eagerly): it captures no graph."
        assert EagerRunner().pool is NO_POOL and (NO_POOL.in_use(), NO_POOL.bytes(), NO_POOL.handle()) == (False, 0, None)


class TestSimulatedRunner:
    def test_a_capture_returns_what_it_made(self):
        runner = SimulatedRunner()
        result = runner.capture(lambda: torch.ones(2) * 3, "test")
        assert isinstance(result, CaptureResult)
        torch.testing.assert_close(result.out, torch.full((2,), 3.0))
        assert result.bytes == 0 and result.seconds >= 0
        assert result.cuda_graph is None and result.dump is None  # (no CUDA graph, no structure)
        runner.release(result.handle)

    def test_its_pool_holds_what_a_shared_pool_would(self):
        runner = SimulatedRunner()
        assert not runner.pool.in_use()
        first = runner.capture(lambda: torch.ones(2), "test")
        assert runner.pool.in_use() and runner.pool.bytes() == 0 and runner.pool.handle() is None
        alone = runner.capture(lambda: torch.ones(2), "test", alone=True)  # (a pool of its own: not counted)
        runner.release(first.handle)
        assert not runner.pool.in_use()
        runner.release(alone.handle)


class TestScope:
    def test_a_capture_is_inside_the_scope_and_leaves_it(self):
        seen = []

        def body():
            seen.append((SCOPE.inside(), SCOPE.depth))
            return torch.ones(1)

        runner = SimulatedRunner()
        runner.release(runner.capture(body, "test").handle)
        assert seen == [(True, 1)] and not SCOPE.inside() and SCOPE.depth == 0

    def test_a_failed_capture_leaves_it_too(self):
        def body():
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

        with pytest.raises(CaptureError):
            SimulatedRunner().capture(body, "test")
        assert not SCOPE.inside() and SCOPE.depth == 0

    def test_the_collection_before_the_next_capture_is_asked_once(self):
        SCOPE.collect_before_next_capture()
        assert SCOPE.must_collect() and not SCOPE.must_collect()

    def test_another_threads_capture_is_not_this_ones(self):
        inside = []
        with SCOPE.capture():
            thread = threading.Thread(target=lambda: inside.append((SCOPE.inside(), SCOPE.depth)))
            thread.start()
            thread.join()
        assert inside == [(False, 1)]  # (the process counts it; the thread is not inside)


def test_a_wrapper_without_cuda_has_no_graph_and_no_pool():
    g = CudaGraphModule(lambda x: x + 1, warmup=1, backend="simulate")
    for _ in range(3):
        g(torch.zeros(2))
    assert g.state == "captured" and g.graph is None and g.pool is None and g.stats.pool_bytes == 0
    assert g.stats.capture_seconds > 0


@pytest.mark.cuda
def test_a_cuda_runner_answers_all_of_the_protocol(cuda):
    runner = CudaRunner(cuda)
    assert [name for name in _MEMBERS if not hasattr(runner, name)] == []
    for name in _POOL:
        assert _parameters(getattr(runner.pool, name)) == [], name
    assert runner.device == cuda and not runner.pool.in_use()


@pytest.mark.cuda
def test_a_cuda_capture_returns_its_graph_as_a_value(cuda):
    runner = CudaRunner(cuda)
    x = torch.ones(4, device=cuda)
    result = runner.capture(lambda: x * 2, "test")
    assert isinstance(result.cuda_graph, torch.cuda.CUDAGraph) and result.dump is None  # (debug=False)
    assert runner.pool.in_use() and result.bytes >= 0
    runner.release(result.handle)
    assert not runner.pool.in_use()
    empty = runner.capture(lambda: x[1:], "test")  # launches nothing: no CUDA graph
    assert empty.cuda_graph is None
    runner.release(empty.handle)


@pytest.mark.cuda
def test_a_debug_capture_returns_what_writes_its_structure(cuda, tmp_path):
    runner = CudaRunner(cuda, debug=True)
    x = torch.ones(4, device=cuda)
    result = runner.capture(lambda: x * 2, "test")
    result.dump(str(tmp_path / "g.dot"))
    assert (tmp_path / "g.dot").stat().st_size > 0
    runner.release(result.handle)
    empty = runner.capture(lambda: x[1:], "test")
    with pytest.raises(GraphStateError, match="recorded no kernel"):
        empty.dump(str(tmp_path / "e.dot"))
    runner.release(empty.handle)


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
