"""Faults on a real GPU: after each, the wrapper names its state, CUDA still works in the
process, and the next good call is correct.

Each test ends with :func:`_healthy`: random numbers on the GPU (a failed capture can
leave the generator in capture mode), a fresh wrapper capturing and replaying, and the
faulty wrapper's own next good call.
"""

import threading

import pytest
import torch
from torch import nn

from graphmodule import CaptureError, CudaGraphModule, GraphStateError
from tests.test_train_step import _step  # (zero_grad(), loss, backward, step; the loss returned)

pytestmark = pytest.mark.cuda


def _healthy(cuda):
    a, b = torch.rand(64, device=cuda), torch.rand(64, device=cuda)
    assert not torch.equal(a, b)
    g = CudaGraphModule(lambda x: x + torch.rand_like(x), warmup=1)
    outs = [g(torch.zeros(8, device=cuda)) for _ in range(4)]
    assert g.state == "captured" and not torch.equal(outs[-1], outs[-2])


class Switch:
    """A fault to turn on and off from the test (the function reads it on every run)."""

    def __init__(self, error=None):
        self.error = error

    def __call__(self):
        if self.error is not None:
            raise self.error


def _in_threads(worker, keys) -> dict:
    """``worker(k)`` in one thread per key, all at once: ``{k: what it returned, or the repr of
    what it raised}``."""
    results: dict = {}

    def run(k):
        try:
            results[k] = worker(k)
        except Exception as exc:  # noqa: BLE001 - reported by the caller
            results[k] = repr(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_exception_during_warmup(cuda):
    fault = Switch(RuntimeError("warmup fault"))
    g = CudaGraphModule(lambda x: (fault(), x * 2)[1], warmup=2)
    with pytest.raises(RuntimeError, match="warmup fault"):
        g(torch.ones(2, device=cuda))
    assert g.state == "warmup" and g.stats.warmup_calls == 0
    fault.error = None
    for _ in range(4):
        torch.testing.assert_close(g(torch.ones(2, device=cuda)), torch.full((2,), 2.0, device=cuda))
    assert g.state == "captured"
    _healthy(cuda)


@pytest.mark.parametrize("error", [ValueError("bad input"), KeyboardInterrupt()], ids=["error", "interrupt"])
def test_exception_during_capture(cuda, error):
    fault = Switch()
    g = CudaGraphModule(lambda x: (fault(), x * 2)[1], warmup=1)
    g(torch.ones(2, device=cuda))
    fault.error = error
    with pytest.raises(type(error)):
        g(torch.ones(2, device=cuda))
    assert g.state == "warmup" and g.stats.capture_failures == 0
    _healthy(cuda)
    fault.error = None
    torch.testing.assert_close(g(torch.full((2,), 3.0, device=cuda)), torch.full((2,), 6.0, device=cuda))
    assert g.state == "captured"


def test_host_sync_during_capture_then_reset_after_the_fix(cuda):
    sync = {"on": True}

    def f(x):
        if sync["on"]:
            x = x * (x.sum().item() > -1)
        return x + 1

    g = CudaGraphModule(f, warmup=1)
    g(torch.ones(2, device=cuda))
    with pytest.raises(CaptureError) as info:
        g(torch.ones(2, device=cuda))
    assert info.value.cause == "host-sync" and ".item()" in info.value.hint
    assert g.state == "failed"
    with pytest.raises(GraphStateError, match="does not retry"):
        g(torch.ones(2, device=cuda))
    _healthy(cuda)
    sync["on"] = False
    g.reset()
    for _ in range(3):
        out = g(torch.full((2,), 4.0, device=cuda))
    torch.testing.assert_close(out, torch.full((2,), 5.0, device=cuda))
    assert g.state == "captured"


def test_optimizer_without_capturable(cuda):
    net = nn.Linear(3, 1).to(cuda)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)  # not capturable
    x = torch.randn(8, 3, device=cuda)

    def step():
        opt.zero_grad(set_to_none=False)
        net(x).pow(2).mean().backward()
        opt.step()

    step()  # stepped before the wrapper: its step counts are on the host, so it is not made capturable
    g = CudaGraphModule(step, warmup=2)
    g()
    g()
    with pytest.raises(CaptureError) as info:
        g()
    assert info.value.cause == "optimizer-not-capturable" and "capturable=True" in info.value.hint
    assert g.state == "failed"
    _healthy(cuda)


def test_out_of_memory_during_capture(cuda):
    huge = {"on": True}

    def f(x):
        if huge["on"]:
            torch.empty(1 << 46, dtype=torch.uint8, device=x.device)  # 64 TiB
        return x * 3

    g = CudaGraphModule(f, warmup=1)
    huge["on"] = False
    g(torch.ones(2, device=cuda))
    huge["on"] = True
    with pytest.raises((CaptureError, torch.OutOfMemoryError)) as info:
        g(torch.ones(2, device=cuda))
    if isinstance(info.value, CaptureError):
        assert info.value.cause == "out-of-memory" and g.state == "failed"
        g.reset()
    else:  # raised eagerly as well: the function's own error, nothing changed
        assert g.state == "warmup"
    _healthy(cuda)
    huge["on"] = False
    for _ in range(3):
        out = g(torch.ones(2, device=cuda))
    torch.testing.assert_close(out, torch.full((2,), 3.0, device=cuda))


@pytest.mark.parametrize("max_graphs", [None, 1], ids=["variants", "one-graph"])
def test_interrupt_inside_a_call_leaves_replays_correct(cuda, max_graphs):
    # a KeyboardInterrupt raised by the call's own argument while the call checks it: against
    # the captured value (one graph), or while looking up its variant (max_graphs=None), where
    # equal values hash equal as Python requires

    class Mode:
        def __init__(self, armed: bool):
            self.armed = armed

        def __eq__(self, other):
            if self.armed or other.armed:
                raise KeyboardInterrupt
            return True

        def __hash__(self):
            return 0

    g = CudaGraphModule(lambda x, mode: x * 2, warmup=1, max_graphs=max_graphs)
    for _ in range(3):
        g(torch.ones(2, device=cuda), Mode(False))
    assert g.state == "captured"
    replays = g.stats.replays
    with pytest.raises(KeyboardInterrupt):
        g(torch.ones(2, device=cuda), Mode(True))
    assert g.state == "captured" and g.stats.captures == 1
    torch.testing.assert_close(g(torch.full((2,), 5.0, device=cuda), Mode(False)), torch.full((2,), 10.0, device=cuda))
    assert g.stats.replays == replays + 1  # the graph replayed, not a new variant
    _healthy(cuda)


@pytest.mark.parametrize("own_streams", [False, True], ids=["default-stream", "stream-per-thread"])
def test_two_threads_on_one_wrapper(cuda, own_streams):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 16)).to(cuda)
    g = CudaGraphModule(net, warmup=1)
    errors: list = []

    def worker(seed: int) -> None:
        stream = torch.cuda.Stream(cuda) if own_streams else torch.cuda.current_stream(cuda)
        gen = torch.Generator(device=cuda).manual_seed(seed)
        try:
            with torch.no_grad(), torch.cuda.stream(stream):
                for _ in range(200):
                    x = torch.randn(4, 16, device=cuda, generator=gen)
                    out = g(x)
                    want = net(x)
                    if not torch.allclose(out, want, rtol=1e-5, atol=1e-6):
                        errors.append("mismatch")
                        return
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))

    with torch.no_grad():
        for _ in range(3):
            g(torch.randn(4, 16, device=cuda))
    threads = [threading.Thread(target=worker, args=(seed,)) for seed in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    assert errors == []
    assert g.stats.captures == 1


def test_two_wrappers_capturing_in_two_threads_at_once(cuda):
    barrier = threading.Barrier(2)

    def worker(k: int) -> tuple:
        g = CudaGraphModule(lambda x: x * k + torch.rand_like(x) * 0, warmup=1)
        stream = torch.cuda.Stream(cuda)
        with torch.cuda.stream(stream):
            g(torch.ones(4, device=cuda))
            barrier.wait()
            outs = [g(torch.full((4,), float(i), device=cuda)) for i in range(20)]
            stream.synchronize()
        return g.stats.captures, [o.tolist() for o in outs]

    results = _in_threads(worker, (2, 3))
    for k in (2, 3):
        assert not isinstance(results[k], str), results[k]
        captures, outs = results[k]
        assert captures == 1
        assert outs == [[float(i * k)] * 4 for i in range(20)]
    _healthy(cuda)


def test_two_train_steps_keeping_every_loss_in_two_threads(cuda):
    # each step is captured again returning copies, in a pool of its own (it lends the .grad it
    # drops), and again when a .grad is kept: the graphs it replaces are released while the other
    # thread may be capturing, which must wait for that capture to end
    def worker(k: int) -> int:
        torch.manual_seed(k)
        net = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 1)).to(cuda)
        twin = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 1)).to(cuda)
        twin.load_state_dict(net.state_dict())
        opts = [torch.optim.Adam(m.parameters(), lr=1e-2, capturable=True) for m in (net, twin)]
        step, eager = _step(net, opts[0], zero_inside=True), _step(twin, opts[1], zero_inside=True)
        g = CudaGraphModule(step, warmup=1)
        stream, gen = torch.cuda.Stream(cuda), torch.Generator(device=cuda).manual_seed(k)
        losses, kept = [], []
        with torch.cuda.stream(stream):
            for i in range(40):
                x, y = torch.randn(8, 4, device=cuda, generator=gen), torch.randn(8, 1, device=cuda, generator=gen)
                losses.append((g(x, y), eager(x, y)))
                if i in (10 + k, 25 + k):
                    kept.append((net[0].weight.grad, twin[0].weight.grad.clone()))
            stream.synchronize()
        assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in losses + kept), "values"
        assert all(torch.allclose(p, q, rtol=1e-4, atol=1e-5) for p, q in zip(net.parameters(), twin.parameters()))
        return g.stats.copy_recaptures

    results = _in_threads(worker, (0, 1))
    assert results == {0: 2, 1: 2}, results
    _healthy(cuda)
