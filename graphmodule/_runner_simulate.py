"""The simulated runner (``backend="simulate"``): the runner protocol without CUDA, its
graphs recorded and replayed by ``_simulate``, so that what a GPU's replay does can be
tested on a CPU machine."""

from __future__ import annotations

import time
import weakref
from typing import Any, Callable

from ._diagnose import diagnose
from ._runners import CaptureResult, Kind
from ._scope import SCOPE
from ._simulate import SimulatedGraph, record

__all__ = ["SimulatedHandle", "SimulatedRunner"]


class SimulatedHandle:
    """A simulated graph (``_simulate``): the tensor operations its capture recorded.
    ``alone``: captured where a real graph would have a pool of its own (tests read it)."""

    __slots__ = ("graph", "alone", "__weakref__")

    def __init__(self, graph: SimulatedGraph, alone: bool = False) -> None:
        self.graph = graph
        self.alone = alone


class SimulatedPool:
    """Where a real graph would be: the live handles a CUDA runner would have in its shared
    pool (no device memory is counted)."""

    def __init__(self) -> None:
        self.shared: weakref.WeakSet = weakref.WeakSet()

    def in_use(self) -> bool:
        return len(self.shared) > 0

    def bytes(self) -> int:
        return 0

    def handle(self) -> Any:
        return None


class SimulatedRunner:
    """The capture/replay protocol without CUDA (tests on a CPU machine): a capture records
    the tensor operations the function dispatches, a replay runs them and no Python
    (see ``_simulate``)."""

    kind = Kind.SIMULATED
    device = None

    def __init__(self) -> None:
        self.pool = SimulatedPool()

    def run_eager(self, body: Callable[[], Any]) -> Any:
        return body()

    def capture(self, body: Callable[[], Any], owner: str, alone: bool = False,
                beside: SimulatedHandle | None = None) -> CaptureResult:
        start = time.perf_counter()
        try:
            with SCOPE.capture():
                graph = record(body)
        except BaseException as exc:  # as a real capture reports a failing function
            raise diagnose(owner, exc) from exc
        seconds = time.perf_counter() - start
        # as CudaRunner: alone only while the pool holds a graph; a twin shares its first's pool
        own = bool(alone) and beside is None and self.pool.in_use()
        handle = SimulatedHandle(graph, own)
        if not own and (beside is None or not beside.alone):
            self.pool.shared.add(handle)
        return CaptureResult(handle, graph.out, 0, seconds)

    def replay(self, handle: SimulatedHandle) -> None:
        handle.graph.replay()

    def release(self, handle: Any) -> None:
        if handle is not None:
            handle.graph.release()
        self.pool.shared.discard(handle)

    def on_capture_stream(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)

    def new_caller(self) -> None:
        pass
