"""Capture failures: the cause is named, the capture is not retried, the wrapper recovers.

On CPU the simulated backend reports a function that raises while it is captured the
way a CUDA capture does; the CUDA-specific recovery is in test_cuda_capture_failures.py.
"""

import array

import pytest
import torch

from graphmodule import CaptureError, GraphStateError


class Calls:
    """Counts calls without Python state a capture would refuse (an array written in place: a
    Python attribute rebound by the function is refused)."""

    def __init__(self):
        self._n = array.array("q", [0])

    def __call__(self) -> int:
        self._n[0] += 1
        return self._n[0]

    def __len__(self) -> int:
        return self._n[0]


def _failing(message):
    calls = Calls()

    def fn(x):
        if calls() > 1:  # fine eagerly, fails "under capture"
            raise RuntimeError(message)
        return x + 1

    return fn, calls


@pytest.mark.parametrize(
    "message, cause",
    [
        ("CUDA error: operation not permitted when stream is capturing", "host-sync"),
        ("Attempting CUDA graph capture of step() for an instance of Adam but param_groups' capturable is False.", "optimizer-not-capturable"),
        ("Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU tensor is pinned.", "cpu-to-gpu-copy"),
        ("operation would make the legacy stream depend on a capturing blocking stream", "cross-stream"),
        ("Cannot call CUDAGeneratorImpl::current_seed during CUDA graph capture", "rng-state"),
        ("CUBLAS_STATUS_NOT_INITIALIZED when calling cublasCreate(handle)", "lazy-init"),
    ],
)
def test_cause_is_named(make, message, cause):
    fn, _ = _failing(message)
    g = make(fn, warmup=1)
    g(torch.zeros(1))
    with pytest.raises(CaptureError) as info:
        g(torch.zeros(1))
    err = info.value
    assert err.cause == cause
    assert isinstance(err.__cause__, RuntimeError) and str(err.__cause__) == message
    assert str(err).startswith("CudaGraphModule(fn) failed to capture its CUDA graph at test_capture.py:")
    assert f"Likely cause ({cause}): " in str(err)


def test_where_points_at_the_users_line(make):
    fn, _ = _failing("CUDA error: operation not permitted when stream is capturing")
    g = make(fn, warmup=1)
    g(torch.zeros(1))
    with pytest.raises(CaptureError) as info:
        g(torch.zeros(1))
    assert info.value.where.startswith("test_capture.py:")
    assert "raise RuntimeError(message)" in info.value.where


def test_the_functions_own_error_propagates_unchanged_and_the_next_call_captures(make):
    # eagerly the call raises the same error; nothing about the capture is to blame
    state = {"fail": True}

    def fn(x):
        if state["fail"]:
            raise KeyError("missing entry")
        return x + 1

    g = make(fn, warmup=1)
    state["fail"] = False
    g(torch.zeros(1))
    state["fail"] = True
    with pytest.raises(KeyError, match="missing entry") as info:
        g(torch.zeros(1))
    assert type(info.value) is KeyError and info.value.__cause__ is None
    assert g.state == "warmup" and g.stats.capture_failures == 0
    state["fail"] = False
    torch.testing.assert_close(g(torch.zeros(1)), torch.ones(1))
    assert g.state == "captured"


def test_failed_capture_is_not_retried(make):
    fn, calls = _failing("CUDA error: operation not permitted when stream is capturing")
    g = make(fn, warmup=1)
    g(torch.zeros(1))
    with pytest.raises(CaptureError):
        g(torch.zeros(1))
    n = len(calls)
    with pytest.raises(GraphStateError) as info:
        g(torch.zeros(1))
    assert len(calls) == n
    assert "does not retry" in str(info.value) and "reset()" in str(info.value)
    assert isinstance(info.value.__cause__, CaptureError)
    assert g.state == "failed" and g.stats.capture_failures == 1


def _failing_once():
    calls = Calls()

    def fn(x):
        if calls() == 2:  # the capture: warmup=1 makes it the second run
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        return x * 2

    return fn, calls


def test_reset_after_a_failure_captures_again(make):
    fn, _ = _failing_once()
    g = make(fn, warmup=1)
    g(torch.ones(1))
    with pytest.raises(CaptureError):
        g(torch.ones(1))
    g.reset()
    assert g.state == "warmup"
    for _ in range(3):
        torch.testing.assert_close(g(torch.ones(1)), torch.full((1,), 2.0))
    assert g.state == "captured" and g.stats.captures == 1 and g.stats.capture_failures == 1


def test_eager_policy_warns_once_then_runs_eagerly_with_checks(make):
    fn, calls = _failing_once()
    g = make(fn, warmup=1, on_capture_failure="eager")
    g(torch.ones(1))
    with pytest.warns(UserWarning, match="runs eagerly from now on") as record:
        out = g(torch.ones(1))
    assert len(record) == 1 and "Likely cause (host-sync)" in str(record[0].message)
    torch.testing.assert_close(out, torch.full((1,), 2.0))
    for _ in range(3):
        torch.testing.assert_close(g(torch.ones(1)), torch.full((1,), 2.0))
    assert g.state == "eager" and g.stats.eager_calls == 4 and g.stats.capture_failures == 1
    with pytest.raises(ValueError, match="expected shape"):
        g(torch.ones(2))


def test_a_wrapper_called_inside_another_capture_runs_inline_and_the_count_returns_to_zero(make):
    """The per-call check reads the process-wide count of captures first (``SCOPE.depth``): a
    captured wrapper called while another captures must still run its function inline (its
    replay would not be part of the outer graph), and the count must fall back to 0 after a
    capture, a failed one included (else every call pays the thread-local read)."""
    from graphmodule._scope import SCOPE

    inner = make(lambda x: x * 2, warmup=1)
    x = torch.ones(2)
    for _ in range(3):
        inner(x)
    assert inner.stats.captures == 1

    outer = make(lambda x: inner(x) + 1, warmup=1)
    for _ in range(3):
        torch.testing.assert_close(outer(x), x * 2 + 1)
    assert outer.stats.captures == 1 and inner.stats.inline_calls >= 1
    assert SCOPE.depth == 0 and not SCOPE.inside()

    fn, _ = _failing("CUDA error: operation not permitted when stream is capturing")
    g = make(fn, warmup=1)
    g(torch.zeros(1))
    with pytest.raises(CaptureError):
        g(torch.zeros(1))
    assert SCOPE.depth == 0 and not SCOPE.inside()
    replays = inner.stats.replays
    inner(x)
    assert inner.stats.replays == replays + 1
