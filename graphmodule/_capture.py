"""Everything that touches CUDA graphs: the warmup stream, capture, replay, cleanup.

Three runners share one small protocol, so that the wrapper never asks which one it has:

- ``CudaRunner``: real CUDA graphs, all captured into one memory pool.
- ``SimulatedRunner``: the same protocol on any device; a "replay" re-runs the
  function on the static buffers and copies its results into the captured ones, so
  that buffer handling can be tested on a CPU machine.
- ``EagerRunner``: no graph; the function runs at every call (the CPU fallback).

``capture(body, owner)`` returns ``(handle, out)``: a handle to replay, and what
``body`` returned, as it stands after one execution (a CUDA capture records without
running, so the CUDA runner replays once before returning).
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any, Callable, Protocol

import torch

from ._diagnose import diagnose

__all__ = ["CAPTURE_ERROR_MODES", "CudaRunner", "EagerRunner", "Runner", "SimulatedRunner", "capturing"]

CAPTURE_ERROR_MODES = ("thread_local", "global", "relaxed")

_LOCAL = threading.local()


def capturing() -> bool:
    """Whether this thread is inside a graphmodule capture (a wrapper called there runs inline)."""
    return getattr(_LOCAL, "depth", 0) > 0


class Runner(Protocol):
    captures: bool
    device: torch.device | None
    capture_seconds: float

    def run_eager(self, body: Callable[[], Any]) -> Any: ...

    def capture(self, body: Callable[[], Any], owner: str) -> tuple[Any, Any]: ...

    def replay(self, handle: Any) -> None: ...

    def release(self, handle: Any) -> None: ...


class EagerRunner:
    """No graphs: the function runs at every call."""

    captures = False
    device = None
    capture_seconds = 0.0

    def run_eager(self, body: Callable[[], Any]) -> Any:
        return body()

    def release(self, handle: Any) -> None:
        pass


class SimulatedHandle:
    """A simulated graph: ``refresh()`` re-runs the function and updates the static results."""

    __slots__ = ("refresh",)

    def __init__(self) -> None:
        self.refresh: Callable[[], None] | None = None


class SimulatedRunner(EagerRunner):
    """The capture/replay protocol without CUDA (tests on a CPU machine)."""

    captures = True

    def capture(self, body: Callable[[], Any], owner: str) -> tuple[Any, Any]:
        start = time.perf_counter()
        _LOCAL.depth = getattr(_LOCAL, "depth", 0) + 1
        try:
            out = body()
        except BaseException as exc:  # as a real capture reports a failing function
            raise diagnose(owner, exc) from exc
        finally:
            _LOCAL.depth -= 1
        self.capture_seconds = time.perf_counter() - start
        return SimulatedHandle(), out

    def replay(self, handle: SimulatedHandle) -> None:
        handle.refresh()


class CudaRunner:
    """Warmup and capture on a side stream, replay on the caller's stream, one memory pool."""

    captures = True

    def __init__(self, device: torch.device, capture_error_mode: str = "thread_local", pool: Any = None) -> None:
        self.device = device
        self.capture_error_mode = capture_error_mode
        # One side stream, forked from the caller's stream at each use: warmup work
        # and lazy initialisation (cuBLAS handles, autotuning) happen off the
        # legacy stream, as capture requires.
        self.stream = torch.cuda.Stream(device)
        with torch.cuda.device(device):
            self.pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        self.capture_seconds = 0.0

    def run_eager(self, body: Callable[[], Any]) -> Any:
        with torch.cuda.device(self.device):
            caller = torch.cuda.current_stream()
            self.stream.wait_stream(caller)
            with torch.cuda.stream(self.stream):
                out = body()
            caller.wait_stream(self.stream)
        return out

    def capture(self, body: Callable[[], Any], owner: str) -> tuple[Any, Any]:
        start = time.perf_counter()
        with torch.cuda.device(self.device):
            caller = torch.cuda.current_stream()
            torch.cuda.synchronize()
            # Collect garbage now, and not during capture: a graph destroyed by the
            # collector while another is capturing breaks that capture (tensordict#1804).
            gc.collect()
            gc_was_enabled = gc.isenabled()
            gc.disable()
            graph = torch.cuda.CUDAGraph()
            body_error: BaseException | None = None
            end_error: BaseException | None = None
            out = None
            self.stream.wait_stream(caller)
            _LOCAL.depth = getattr(_LOCAL, "depth", 0) + 1
            try:
                with torch.cuda.stream(self.stream):
                    graph.capture_begin(pool=self.pool, capture_error_mode=self.capture_error_mode)
                    try:
                        out = body()
                    except BaseException as exc:  # noqa: BLE001 - re-raised below
                        body_error = exc
                    finally:
                        try:
                            graph.capture_end()
                        except BaseException as exc:  # noqa: BLE001
                            end_error = exc
            finally:
                _LOCAL.depth -= 1
                if gc_was_enabled:
                    gc.enable()
            caller.wait_stream(self.stream)
            if body_error is not None or end_error is not None:
                original = body_error if body_error is not None else end_error
                self._recover(graph)
                raise diagnose(owner, original, end_error) from original
            # a capture records without running: run once, so `out` holds this call's results
            graph.replay()
        self.capture_seconds = time.perf_counter() - start
        return graph, out

    def replay(self, graph: torch.cuda.CUDAGraph) -> None:
        # cudaGraphLaunch on the current stream: no host synchronisation.
        graph.replay()

    def release(self, graph: torch.cuda.CUDAGraph | None) -> None:
        if graph is not None:
            graph.reset()

    def _recover(self, graph: torch.cuda.CUDAGraph) -> None:
        """Leave the process as it was before the failed capture."""
        with torch.cuda.stream(self.stream):
            if torch.cuda.is_current_stream_capturing():  # capture_end never ran
                try:
                    graph.capture_end()
                except Exception:
                    pass
        try:
            graph.reset()
        except Exception:
            pass
        del graph
        heal_generator(self.device)
        try:
            torch.cuda.synchronize(self.device)
        except Exception:
            pass


def heal_generator(device: torch.device) -> None:
    """End the CUDA generator's capture mode after a failed capture.

    A capture that fails at ``capture_end`` leaves the default generator believing
    it is still capturing, and every later ``torch.randn`` on the device raises
    "Offset increment outside graph capture". A tiny capture that succeeds ends
    that mode the regular way.
    """
    stream = torch.cuda.Stream(device)
    scratch = torch.zeros(1, device=device)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.current_stream(device).synchronize()
    with torch.cuda.device(device), torch.cuda.stream(stream):
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            scratch.add_(1)
        finally:
            graph.capture_end()
    stream.synchronize()
    graph.reset()
