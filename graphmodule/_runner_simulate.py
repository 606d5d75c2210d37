"""The simulated runner (``backend="simulate"``): the runner protocol without CUDA, its
graphs recorded and replayed by ``_simulate``."""

from __future__ import annotations

import time
import weakref
from typing import Any, Callable

from ._diagnose import diagnose
from ._runners import CaptureResult, EagerRunner
from ._scope import _enter, _leave
from ._simulate import SimulatedGraph, record

__all__ = ["SimulatedHandle", "SimulatedRunner"]


class SimulatedHandle:
    """A simulated graph (``_simulate``): the tensor operations its capture recorded.
    ``alone``: captured where a real graph would have a pool of its own (tests read it)."""

    __slots__ = ("graph", "alone", "__weakref__")

    def __init__(self, graph: SimulatedGraph, alone: bool = False) -> None:
        self.graph = graph
        self.alone = alone


class SimulatedRunner(EagerRunner):
    """The capture/replay protocol without CUDA (tests on a CPU machine): a capture records
    the tensor operations the function dispatches, a replay runs them and no Python
    (see ``_simulate``)."""

    captures = True
    simulated = True

    def __init__(self) -> None:
        super().__init__("backend='simulate': a replay runs the recorded tensor operations")
        self._shared: weakref.WeakSet = weakref.WeakSet()  # live handles a real graph would have in the pool

    def capture(self, body: Callable[[], Any], owner: str, alone: bool = False,
                beside: SimulatedHandle | None = None) -> CaptureResult:
        start = time.perf_counter()
        _enter()
        try:
            graph = record(body)
        except BaseException as exc:  # as a real capture reports a failing function
            raise diagnose(owner, exc) from exc
        finally:
            _leave()
        seconds = time.perf_counter() - start
        # as CudaRunner: alone only while the pool holds a graph; a twin shares its first's pool
        own = bool(alone) and beside is None and self.pool_in_use()
        handle = SimulatedHandle(graph, own)
        if not own and (beside is None or not beside.alone):
            self._shared.add(handle)
        return CaptureResult(handle, graph.out, 0, seconds)

    def replay(self, handle: SimulatedHandle) -> None:
        handle.graph.replay()

    def release(self, handle: Any) -> None:
        if handle is not None:
            handle.graph.release()
        self._shared.discard(handle)

    def pool_in_use(self) -> bool:
        return len(self._shared) > 0

