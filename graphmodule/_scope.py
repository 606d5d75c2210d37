"""What captures share in the process, in one object (:data:`SCOPE`): which thread captures
now, how many captures run, the lock that keeps CUDA captures one at a time, whether the
collector must run before the next capture, and which CUDA pools hold graphs.

>>> SCOPE.inside()
False
>>> with SCOPE.capture():
...     SCOPE.inside(), SCOPE.depth
(True, 1)
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

__all__ = ["SCOPE", "CaptureScope"]


class CaptureScope:
    """The process's capture state; runners change it, the wrapper reads it."""

    __slots__ = ("lock", "depth", "active", "collect", "live", "used", "_local", "_depth_lock")

    def __init__(self) -> None:
        # one CUDA capture at a time in the process: captures turn the garbage collector off
        # and on, and a collector run inside another thread's capture can break it
        self.lock = threading.RLock()
        # captures in progress in any thread, simulated ones included: while it is 0 no thread
        # is capturing, and a call skips the thread-local read (``SCOPE.depth and SCOPE.inside()``)
        self.depth = 0
        # CUDA captures in progress: the CUDA random generator is shared by all threads, and a
        # graph replayed or a random op run eagerly in another thread while one captures breaks both
        self.active = 0
        self.collect = False  # a capture failed since the last full collection (see _runner_cuda)
        # graphs alive per CUDA pool id, and the pool ids ever captured into (a pool with no graph
        # left is freed by torch and cannot be captured into again)
        self.live: dict[Any, int] = {}
        self.used: set = set()
        self._local = threading.local()
        self._depth_lock = threading.Lock()

    def inside(self) -> bool:
        """Whether this thread is inside a graphmodule capture (a wrapper called there runs inline)."""
        return getattr(self._local, "depth", 0) > 0

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        """This thread captures while inside (``inside()`` is True, ``depth`` counts it)."""
        self._local.depth = getattr(self._local, "depth", 0) + 1
        with self._depth_lock:
            self.depth += 1
        try:
            yield
        finally:
            self._local.depth -= 1
            with self._depth_lock:
                self.depth -= 1

    def collect_before_next_capture(self) -> None:
        """Objects of a failed capture became garbage: collect them before the next capture starts."""
        self.collect = True

    def must_collect(self) -> bool:
        """Whether a capture starting now collects first (a capture failed since the last
        collection); answering True clears it."""
        collect, self.collect = self.collect, False
        return collect


SCOPE = CaptureScope()
