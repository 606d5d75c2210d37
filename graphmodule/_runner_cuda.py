"""The CUDA runner: real CUDA graphs, warmed up and captured on a side stream, replayed on
the caller's stream, all captured into one memory pool."""

from __future__ import annotations

import gc
import time
import warnings
from typing import Any, Callable

import torch

from ._diagnose import diagnose
from ._errors import GraphStateError
from ._runners import CaptureResult
from ._scope import _ACTIVE, _CAPTURE_LOCK, _FAILED, _enter, _leave, capturing, collect_before_next_capture

__all__ = ["CudaRunner", "heal_generator"]

# graphs alive per pool id, and the pool ids ever captured into (a pool with no graph
# left is freed by torch and cannot be captured into again)
_LIVE: dict[Any, int] = {}
_USED: set = set()


class CudaRunner:
    """Warmup and capture on a side stream, replay on the caller's stream, one memory pool."""

    captures = True
    dumps = True
    simulated = False

    def __init__(self, device: torch.device, capture_error_mode: str = "thread_local", pool: Any = None,
                 debug: bool = False) -> None:
        self.device = device
        self.capture_error_mode = capture_error_mode
        self.debug = debug  # graphs keep their CUDA graph for debug_dump
        # One side stream, forked from the caller's stream at each use: warmup work
        # and lazy initialisation (cuBLAS handles, autotuning) happen off the
        # legacy stream, as capture requires.
        self.stream = torch.cuda.Stream(device)
        self._last_stream: Any = None  # the stream of the thread that called last
        self._given_pool = pool
        self._new_pool()

    def _new_pool(self) -> None:
        """The memory pool every graph of this runner captures into.

        A pool dies with the last graph captured into it (torch frees its device and
        pinned-host blocks then), so a runner that owns its pool starts a new one once
        its graphs are all released. A pool passed in is the caller's to keep alive.
        """
        given = self._given_pool
        if given is not None:
            self.mempool = given if hasattr(given, "id") else None
            self.pool = given.id if hasattr(given, "id") else given
            return
        with torch.cuda.device(self.device):
            mempool_cls = getattr(torch.cuda, "MemPool", None)
            self.mempool = mempool_cls() if mempool_cls is not None else None
            self.pool = self.mempool.id if self.mempool is not None else torch.cuda.graph_pool_handle()

    def _check_pool(self, owner: str) -> None:
        if _LIVE.get(self.pool, 0) > 0 or self.pool not in _USED:
            return
        if self._given_pool is None:
            self._new_pool()
            return
        raise GraphStateError(
            f"{owner} was given a memory pool whose graphs were all released, which frees the "
            "pool for good. Pass a new pool (torch.cuda.graph_pool_handle(), or the pool of a "
            "wrapper that still holds a graph)."
        )

    def pool_bytes(self) -> int:
        """Device memory in this runner's pool (segments of the caching allocator)."""
        try:
            segments = torch.cuda.memory_snapshot()
        except Exception:  # pragma: no cover - allocator without snapshots
            return 0
        pool = tuple(self.pool)
        return sum(s.get("total_size", 0) for s in segments if tuple(s.get("segment_pool_id", ())) == pool)

    def pool_handle(self) -> Any:
        return self.mempool or self.pool

    def new_caller(self) -> None:
        stream = torch.cuda.current_stream(self.device)
        if self._last_stream is not None and self._last_stream != stream:
            stream.wait_stream(self._last_stream)
        self._last_stream = stream

    def on_capture_stream(self, fn: Callable[..., Any], *args: Any) -> Any:
        caller = torch.cuda.current_stream(self.device)
        torch.cuda.set_stream(self.stream)
        try:
            return fn(*args)
        finally:
            torch.cuda.set_stream(caller)

    def cuda_graph(self, handle: Any) -> torch.cuda.CUDAGraph | None:
        return handle if isinstance(handle, torch.cuda.CUDAGraph) else None  # (not an _EmptyGraph)

    def run_eager(self, body: Callable[[], Any]) -> Any:
        # warmup calls may draw random numbers: not while another thread captures
        with _CAPTURE_LOCK, torch.cuda.device(self.device):
            caller = torch.cuda.current_stream()
            self.stream.wait_stream(caller)
            with torch.cuda.stream(self.stream):
                out = body()
            caller.wait_stream(self.stream)
        return out

    def capture(self, body: Callable[[], Any], owner: str, alone: bool = False, beside: Any = None) -> CaptureResult:
        """Capture ``body``; ``alone``: in memory no other graph writes (lent outputs);
        ``beside``: a graph whose pool this one shares (a twin copying its results out, see
        ``_twin``: the shared pool, or the pool of its own the first graph has).

        Graphs sharing a pool share memory: a graph captured later may put its outputs in
        the blocks an earlier graph used for temporaries, which that graph writes at every
        replay. Outputs lent to callers must not be there: an ``alone`` graph is captured in
        the runner's pool only while that pool holds no graph, else in a pool of its own.
        """
        # One capture at a time in the process: captures turn the garbage collector off
        # and on, and a collector run inside another thread's capture can break it.
        with _CAPTURE_LOCK:
            _ACTIVE[0] += 1
            try:
                return self._capture(body, owner, alone, beside)
            finally:
                _ACTIVE[0] -= 1

    def _capture(self, body: Callable[[], Any], owner: str, alone: bool, beside: Any = None) -> CaptureResult:
        start = time.perf_counter()
        self._check_pool(owner)
        # beside a graph captured alone: in its pool, whose temporaries' memory this reuses
        # (an _EmptyGraph has no pool; one in the shared pool carries _graphmodule_pool)
        private = (beside.pool() if isinstance(beside, torch.cuda.CUDAGraph)
                   and getattr(beside, "_graphmodule_pool", None) is None else None)
        # (after _check_pool, a pool in _USED holds a graph: emptied ones were replaced)
        shared = private is None and not (alone and beside is None and self.pool in _USED)
        pool = self.pool if shared else private if private is not None else torch.cuda.graph_pool_handle()
        with torch.cuda.device(self.device):
            caller = torch.cuda.current_stream()
            torch.cuda.synchronize()
            # No collector run during capture: a graph destroyed by the collector while
            # another is capturing breaks that capture (tensordict#1804). A full collection
            # before capture (torch.cuda.graph's force_cudagraph_gc) costs some 100 ms in a
            # program with tensordict imported: it runs where torch is told to, and after a
            # failed capture, whose garbage must not meet a capture (see below).
            if _FAILED[0] or getattr(getattr(torch.compiler, "config", None), "force_cudagraph_gc", False):
                _FAILED[0] = False
                gc.collect()
            reserved = torch.cuda.memory_reserved(self.device)
            gc_was_enabled = gc.isenabled()
            gc.disable()
            # the collector stays off until the new graph has run once: a collection between
            # capture_end and the first replay freed a failed capture's objects and aborted
            try:
                # debug: keep the cudaGraph_t beside the executable graph, so that
                # debug_dump has a structure to print (without it torch drops it at capture_end)
                graph = torch.cuda.CUDAGraph(keep_graph=True) if self.debug else torch.cuda.CUDAGraph()
                if self.debug:
                    graph.enable_debug_mode()
                body_error: BaseException | None = None
                end_error: BaseException | None = None
                out = None
                self.stream.wait_stream(caller)
                _enter()
                empty = False
                try:
                    with torch.cuda.stream(self.stream):
                        try:
                            graph.capture_begin(pool=pool, capture_error_mode=self.capture_error_mode)
                        except BaseException as exc:  # noqa: BLE001 - a capture that never started
                            body_error = exc
                        else:
                            try:
                                out = body()
                            except BaseException as exc:  # noqa: BLE001 - re-raised below
                                body_error = exc
                            finally:
                                try:
                                    with warnings.catch_warnings(record=True) as seen:
                                        warnings.simplefilter("always")
                                        graph.capture_end()
                                    # a function that launches nothing (it returns views or inputs)
                                    empty = any("Graph is empty" in str(w.message) for w in seen)
                                except BaseException as exc:  # noqa: BLE001
                                    end_error = exc
                finally:
                    _leave()
                caller.wait_stream(self.stream)
                if body_error is not None or end_error is not None:
                    original = body_error if body_error is not None else end_error
                    self._recover(graph, pool)
                    # What the failed capture allocated (the graph, tensors its frames hold) lives
                    # in reference cycles through the error's traceback. Freed by the collector
                    # between a later capture's end and its first replay, it aborted the process
                    # (GPU, 2026-11-24). It is collected before the next capture starts, as
                    # torch.cuda.graph does before each one, and the collector stays off from
                    # there to that capture's first replay.
                    collect_before_next_capture()
                    raise diagnose(owner, original, end_error) from original
                if empty:
                    graph = _EmptyGraph()
                else:
                    if self.debug:
                        graph.instantiate()  # keep_graph=True: capture_end left that to us
                    if shared:  # (a pool of its own dies with the graph and its outputs)
                        _USED.add(self.pool)
                        _LIVE[self.pool] = _LIVE.get(self.pool, 0) + 1
                        graph._graphmodule_pool = self.pool
                # a capture records without running: run once, so `out` holds this call's results
                graph.replay()
                # what this capture added to the memory held (segments a shared pool already
                # had are not counted again)
                nbytes = torch.cuda.memory_reserved(self.device) - reserved
            finally:
                if gc_was_enabled:
                    gc.enable()
        return CaptureResult(graph, out, nbytes, time.perf_counter() - start)

    def replay(self, graph: torch.cuda.CUDAGraph) -> None:
        # cudaGraphLaunch on the current stream: no host synchronisation.
        if _ACTIVE[0] and not capturing():  # another thread captures: wait for it to end
            with _CAPTURE_LOCK:
                graph.replay()
            return
        graph.replay()

    def debug_dump(self, graph: Any, path: str, owner: str) -> None:
        # torch announces each dump with "DEBUG: ..." warnings; the caller asked for it
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="DEBUG: calling")
            graph.debug_dump(path)

    def pool_in_use(self) -> bool:
        return _LIVE.get(self.pool, 0) > 0

    def release(self, graph: Any) -> None:
        if graph is None:
            return
        pool = getattr(graph, "_graphmodule_pool", None)
        graph.reset()
        if pool is not None:
            _LIVE[pool] -= 1
            if _LIVE[pool] == 0 and pool == self.pool and self._given_pool is None:
                self._new_pool()

    def _recover(self, graph: torch.cuda.CUDAGraph, pool: Any) -> None:
        """Leave the process as it was before the failed capture."""
        with torch.cuda.stream(self.stream):
            if torch.cuda.is_current_stream_capturing():  # capture_end never ran
                try:
                    graph.capture_end()
                except Exception:
                    pass
        # a capture_end that failed leaves the allocator routing this thread's
        # allocations to the pool: end that, then use a fresh pool
        end = getattr(torch._C, "_cuda_endAllocateToPool", None)
        if end is not None:
            try:
                end(self.device.index, pool)
            except Exception:
                pass
        try:
            graph.reset()
        except Exception:
            pass
        del graph
        if self._given_pool is None:
            self._new_pool()
        heal_generator(self.device)
        try:
            torch.cuda.synchronize(self.device)
        except Exception:
            pass


class _EmptyGraph:
    """A capture that recorded no kernel: replaying it does nothing."""

    def replay(self) -> None:
        pass

    def reset(self) -> None:
        pass

    def debug_dump(self, path: str) -> None:
        raise GraphStateError("this graph recorded no kernel (the function only returns views or its "
                              "inputs): there is nothing to dump.")


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

