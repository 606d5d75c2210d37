"""A failed capture ends cleanly, names its cause, and is not retried."""

import threading

import pytest
import torch
from torch import nn

from graphmodule import CaptureError, CudaGraphModule, GraphStateError

pytestmark = pytest.mark.cuda


def _healthy(cuda):
    assert not torch.cuda.is_current_stream_capturing()
    torch.randn(8, device=cuda).sum().item()  # raised "Offset increment outside graph capture" before
    ok = CudaGraphModule(lambda x: x + torch.rand_like(x), warmup=1)
    outs = [ok(torch.zeros(64, device=cuda)) for _ in range(3)]
    assert ok.stats.replays == 2
    for out in outs:
        assert out.shape == (64,) and bool(((out >= 0) & (out < 1)).all())
    # the generator still advances at each replay: two replays draw different values
    assert not torch.equal(outs[1], outs[2])


def test_host_sync_is_named_and_not_retried(cuda):
    calls = []

    def fn(x):
        calls.append(1)
        if x.sum().item() > 1e9:  # a host sync: fine eagerly, illegal under capture
            return x
        return x * 2 + torch.randn_like(x)

    g = CudaGraphModule(fn)
    x = torch.ones(4, device=cuda)
    g(x)
    g(x)
    with pytest.raises(CaptureError) as info:
        g(x)
    err = info.value
    assert err.cause == "host-sync"
    assert "test_cuda_capture_failures.py" in err.where and ".item()" in err.where
    assert isinstance(err.__cause__, RuntimeError)
    _healthy(cuda)
    n = len(calls)
    with pytest.raises(GraphStateError, match="does not retry"):
        g(x)
    assert len(calls) == n  # the failing capture was not tried again
    assert g.stats.capture_failures == 1 and g.state == "failed"


def test_optimizer_without_capturable_is_named(cuda):
    net = nn.Linear(4, 1).to(cuda)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)  # capturable=False

    def step(x):
        opt.zero_grad()
        net(x).pow(2).mean().backward()
        opt.step()

    x = torch.randn(8, 4, device=cuda)
    step(x)  # stepped before the wrapper: its step counts are on the host, so it is not made capturable
    g = CudaGraphModule(step, warmup=2)
    g(x)
    g(x)
    with pytest.raises(CaptureError) as info:
        g(x)
    assert info.value.cause == "optimizer-not-capturable"
    assert "capturable=True" in str(info.value)
    _healthy(cuda)


def test_cpu_to_gpu_copy_is_named(cuda):
    def fn(x):
        return x + torch.tensor([1.0, 2.0]).to(x.device)

    g = CudaGraphModule(fn, warmup=1)
    x = torch.ones(2, device=cuda)
    g(x)
    with pytest.raises(CaptureError) as info:
        g(x)
    assert info.value.cause == "cpu-to-gpu-copy", str(info.value)
    assert "pass it as an input" in str(info.value)
    _healthy(cuda)


def test_eager_fallback_policy_warns_once_then_runs_eagerly(cuda):
    g = CudaGraphModule(lambda x: x * x.sum().item(), warmup=1, on_capture_failure="eager")
    x = torch.full((2,), 2.0, device=cuda)
    g(x)
    with pytest.warns(UserWarning, match="runs eagerly from now on"):
        out = g(x)
    torch.testing.assert_close(out, x * 4)
    for _ in range(3):
        torch.testing.assert_close(g(x), x * 4)
    assert g.state == "eager" and g.stats.eager_calls == 4
    _healthy(cuda)


def test_reset_after_fix(cuda):
    state = {"sync": True}

    def fn(x):
        if state["sync"]:
            x.sum().item()
        return x + 1

    g = CudaGraphModule(fn, warmup=1)
    x = torch.ones(2, device=cuda)
    g(x)
    with pytest.raises(CaptureError):
        g(x)
    state["sync"] = False
    g.reset()
    for _ in range(3):
        torch.testing.assert_close(g(x), x + 1)
    assert g.state == "captured"


def _fn_with_allocating_thread(errors):
    sizes = iter(range(1, 100))

    def fn(x):
        # what a DataLoader pin-memory thread does while the graph captures: allocate
        # (new sizes each call, so that no allocator cache can serve them)
        size = (next(sizes) * 64) << 20

        def work():
            try:
                torch.empty(size, dtype=torch.uint8, device=x.device)
                torch.empty(size >> 4, dtype=torch.uint8, pin_memory=True)
                # the pinned-memory allocator polls events of earlier copies: illegal in
                # another thread's global capture
                event = torch.cuda.Event()
                event.record(torch.cuda.current_stream(x.device))
                event.query()
            except RuntimeError as exc:
                errors.append(exc)

        worker = threading.Thread(target=work)
        worker.start()
        worker.join()
        return x * 3

    return fn


def test_thread_local_capture_survives_another_threads_cuda_work(cuda):
    errors = []
    g = CudaGraphModule(_fn_with_allocating_thread(errors), warmup=1)
    x = torch.ones(4, device=cuda)
    for _ in range(3):
        out = g(x)
    torch.testing.assert_close(out, x * 3)
    assert g.state == "captured" and not errors


def test_global_capture_mode_is_broken_by_the_same_work(cuda):
    # the control for the test above: the thread's work really does break a global capture
    errors = []
    g = CudaGraphModule(_fn_with_allocating_thread(errors), warmup=1, capture_error_mode="global")
    x = torch.ones(4, device=cuda)
    g(x)
    with pytest.raises(CaptureError):
        g(x)
    _healthy(cuda)
