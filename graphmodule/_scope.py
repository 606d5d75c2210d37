"""What captures share in the process: which thread captures now, how many captures run,
the lock that keeps them one at a time, and whether the collector must run first."""

from __future__ import annotations

import threading

__all__ = ["capturing", "collect_before_next_capture"]

_LOCAL = threading.local()
_CAPTURE_LOCK = threading.RLock()
_FAILED = [False]  # a capture failed since the last full collection (see CudaRunner._capture)
# captures in progress: the CUDA random generator is shared by all threads, and a graph
# replayed or a random op run eagerly in another thread while one captures breaks both
_ACTIVE = [0]


def collect_before_next_capture() -> None:
    """Objects of a failed capture became garbage: collect them before the next capture starts."""
    _FAILED[0] = True


# captures in progress in any thread, simulated ones included: while it is 0 no thread is
# capturing, and a call skips the thread-local read (``_DEPTH[0] and capturing()``)
_DEPTH = [0]
_DEPTH_LOCK = threading.Lock()


def capturing() -> bool:
    """Whether this thread is inside a graphmodule capture (a wrapper called there runs inline)."""
    return getattr(_LOCAL, "depth", 0) > 0


def _enter() -> None:
    _LOCAL.depth = getattr(_LOCAL, "depth", 0) + 1
    with _DEPTH_LOCK:
        _DEPTH[0] += 1


def _leave() -> None:
    _LOCAL.depth -= 1
    with _DEPTH_LOCK:
        _DEPTH[0] -= 1

