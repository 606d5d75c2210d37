"""torch's global state and a graph: the default dtype and deterministic algorithms are part of
a call's mode; what a function sets and leaves set, or enters inside (torch.enable_grad() under
a caller's torch.no_grad(), torch.inference_mode()), is served as eagerly or refused at capture.

Differential: each test calls the plain function beside the wrapper on the same inputs."""

import contextlib

import pytest
import torch
from torch import nn

from graphmodule import CudaGraphModule, InputMismatchError, UnsupportedError


@contextlib.contextmanager
def default_dtype(dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@contextlib.contextmanager
def deterministic(on):
    previous = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(on)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])


LEFT_SET = (
    "CudaGraphModule(fn) cannot replay this call as a CUDA graph: expected torch's global state as before the call "
    "after it, got {}: the function sets it and leaves it set, which each eager call does and a replay would not.\n"
    "To fix: set it outside the wrapped function, or inside it in a with-block that restores it (torch.no_grad(), "
    "torch.enable_grad()) or with a try/finally that sets it back."
)


def _same(got, expected):
    assert type(got) is type(expected)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert got.requires_grad == expected.requires_grad
    assert got.is_inference() == expected.is_inference()
    torch.testing.assert_close(got.detach(), expected.detach())


def add_zeros(x):
    return x + torch.zeros(3)


def arange_plus(x):
    return torch.arange(3.0) * 2 + x.sum()


class TestDefaultDtype:
    """A different default dtype gets a graph of its own, as a different mode does."""

    @pytest.mark.parametrize("fn", [add_zeros, arange_plus])
    def test_served_under_another_default_dtype(self, graph_backend, fn):
        g = CudaGraphModule(fn, warmup=1, backend=graph_backend)
        x = torch.ones(3)
        for _ in range(3):
            _same(g(x), fn(x))
        with default_dtype(torch.float64):
            for _ in range(3):
                _same(g(x), fn(x))
        _same(g(x), fn(x))

    def test_refused_with_one_graph(self, graph_backend):
        g = CudaGraphModule(add_zeros, warmup=1, backend=graph_backend, max_graphs=1)
        x = torch.ones(3)
        for _ in range(3):
            _same(g(x), add_zeros(x))
        with default_dtype(torch.float64), pytest.raises(InputMismatchError) as info:
            g(x)
        assert [m.describe() for m in info.value.mismatches] == [
            "torch.get_default_dtype(): expected default_dtype torch.float32, got torch.float64"
        ]

    def test_deterministic_algorithms_refused_with_one_graph(self, graph_backend):
        g = CudaGraphModule(add_zeros, warmup=1, backend=graph_backend, max_graphs=1)
        x = torch.ones(3)
        for _ in range(3):
            _same(g(x), add_zeros(x))
        with deterministic(True), pytest.raises(InputMismatchError) as info:
            g(x)
        assert [m.describe() for m in info.value.mismatches] == [
            "torch.are_deterministic_algorithms_enabled(): expected deterministic False, got True"
        ]

    def test_deterministic_algorithms_served_by_default(self, graph_backend):
        g = CudaGraphModule(add_zeros, warmup=1, backend=graph_backend)
        x = torch.ones(3)
        for _ in range(2):
            _same(g(x), add_zeros(x))
        with deterministic(True):
            for _ in range(3):
                _same(g(x), add_zeros(x))


def _capture_error(fn, x, backend, reset, calls=4):
    """The capture's error for a caller that sets the state back (``reset()``) before each
    call, each served call compared with the plain one."""
    g = CudaGraphModule(fn, warmup=1, backend=backend)
    with pytest.raises(UnsupportedError) as info:
        for _ in range(calls):
            reset()
            expected = fn(x)
            reset()
            _same(g(x), expected)
    return str(info.value)


class TestEnableGradUnderNoGrad:
    """S3: torch.enable_grad() inside a function called under torch.no_grad(): eagerly its
    result requires grad; a replay runs no autograd, so the capture is refused."""

    def test_refused_at_capture_not_replayed_without_grad(self, graph_backend):
        net = nn.Linear(3, 3)

        def fn(x):
            with torch.enable_grad():
                return net(x)

        x = torch.ones(2, 3)
        with torch.no_grad():
            assert fn(x).requires_grad
            g = CudaGraphModule(fn, warmup=1, backend=graph_backend)
            got = []
            with pytest.raises(UnsupportedError) as info:
                for _ in range(4):
                    out = g(x)
                    _same(out, fn(x))  # every call served is as eager
                    got.append(out)
        assert str(info.value) == (
            "CudaGraphModule(fn) cannot replay this call as a CUDA graph: expected outputs that do not require grad "
            "from a call under torch.no_grad(), got outputs that require grad (the function enables grad inside, "
            "torch.enable_grad()): a replay runs no autograd, so its results would not track gradients as the eager "
            "call's do.\nTo fix: call the wrapper with grad enabled (its outputs then track gradients through the "
            "graph), or leave torch.enable_grad() out of the wrapped function.")

    def test_served_with_grad_enabled_inside_without_parameters(self, graph_backend):
        def fn(x):
            with torch.enable_grad():
                return x * 2

        x = torch.ones(3)
        with torch.no_grad():
            g = CudaGraphModule(fn, warmup=1, backend=graph_backend)
            for _ in range(4):
                _same(g(x), fn(x))


    def test_train_step_enabling_grad_inside_served(self, graph_backend):
        """A train step enables grad inside: eagerly its loss requires grad (and refuses a second
        backward); the replay's does too, and the parameters step as eagerly."""

        def make():
            torch.manual_seed(0)
            net = nn.Linear(3, 1)
            opt = torch.optim.SGD(net.parameters(), lr=0.1)

            def step(x):
                with torch.enable_grad():
                    opt.zero_grad()
                    loss = net(x).pow(2).mean()
                    loss.backward()
                opt.step()
                return loss

            return net, step

        net, step = make()
        ref_net, ref_step = make()
        g = CudaGraphModule(step, warmup=1, backend=graph_backend)
        x = torch.ones(4, 3)
        with torch.no_grad():
            for _ in range(4):
                _same(g(x), ref_step(x))
                for p, q in zip(net.parameters(), ref_net.parameters()):
                    torch.testing.assert_close(p, q)
                    torch.testing.assert_close(p.grad, q.grad)


class TestInferenceModeInside:
    """S7: torch.inference_mode() entered inside the function: eagerly the result is an
    inference tensor; a replay's is the graph's buffer, a normal tensor."""

    def test_refused_at_capture(self, graph_backend):
        def fn(x):
            with torch.inference_mode():
                y = x * 2
            return y, y[1:]

        x = torch.ones(3)
        y, view = fn(x)
        assert y.is_inference() and view._base is None
        g = CudaGraphModule(fn, warmup=1, backend=graph_backend)
        with pytest.raises(UnsupportedError) as info:
            for _ in range(4):
                out, out_view = g(x)
                _same(out, y)
                assert out_view._base is None
        assert str(info.value) == (
            "CudaGraphModule(fn) cannot replay this call as a CUDA graph: expected normal tensors as outputs of a call "
            "outside torch.inference_mode(), got inference tensors (the function enters torch.inference_mode() "
            "inside): a replay's outputs are normal tensors, and views of them keep their base, which the eager "
            "call's would not.\nTo fix: call the wrapper under torch.inference_mode() (its outputs are inference "
            "tensors then), or use torch.no_grad() inside the function.")

    def test_served_under_the_callers_inference_mode(self, graph_backend):
        def fn(x):
            with torch.inference_mode():
                return x * 2

        x = torch.ones(3)
        g = CudaGraphModule(fn, warmup=1, backend=graph_backend)
        with torch.inference_mode():
            x = torch.ones(3)
            for _ in range(4):
                _same(g(x), fn(x))


class TestStateLeftSet:
    """C5: torch's global state set inside the function and left set: eagerly each call sets
    it; a replay would not, so the capture is refused naming it."""

    def test_grad_disabled_and_left(self, graph_backend):
        def fn(x):
            torch.set_grad_enabled(False)
            return x * 2

        x = torch.ones(3)
        try:
            message = _capture_error(fn, x, graph_backend, lambda: torch.set_grad_enabled(True))
        finally:
            torch.set_grad_enabled(True)
        assert message == LEFT_SET.format("torch.set_grad_enabled: True before the call, False after it")

    def test_default_dtype_set_and_left(self, graph_backend):
        def fn(x):
            torch.set_default_dtype(torch.float64)
            return x + torch.zeros(3)

        x = torch.ones(3)
        with default_dtype(torch.float32):
            message = _capture_error(fn, x, graph_backend, lambda: torch.set_default_dtype(torch.float32))
        assert message == LEFT_SET.format(
            "torch.set_default_dtype: torch.float32 before the call, torch.float64 after it")

    def test_deterministic_algorithms_set_and_left(self, graph_backend):
        def fn(x):
            torch.use_deterministic_algorithms(True, warn_only=True)
            return x * 2

        x = torch.ones(3)
        with deterministic(False):
            message = _capture_error(fn, x, graph_backend, lambda: torch.use_deterministic_algorithms(False))
        assert message == LEFT_SET.format(
            "torch.use_deterministic_algorithms: False before the call, True (warn_only=True) after it")
