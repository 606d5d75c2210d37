"""The CUDA runner: real CUDA graphs, warmed up and captured on a side stream, replayed on
the caller's stream, all captured into one memory pool (:class:`CudaPool`).

The only code that touches CUDA graphs, streams and pools. What a capture made beyond its
handle comes back as values in the :class:`~graphmodule._runners.CaptureResult`: the
``torch.cuda.CUDAGraph`` (none for a capture that launched nothing) and, with ``debug=True``,
what writes its structure.
"""

from __future__ import annotations

import functools
import gc
import time
import warnings
from typing import Any, Callable

import torch

from ._diagnose import diagnose
from ._errors import GraphStateError
from ._runners import CaptureResult, Kind
from ._scope import SCOPE

__all__ = ["CudaPool", "CudaRunner", "heal_generator"]


class CudaPool:
    """The memory pool every graph of a CUDA runner captures into (a ``Pool``).

    A pool dies with the last graph captured into it (torch frees its device and
    pinned-host blocks then), so a runner that owns its pool starts a new one once
    its graphs are all released. A pool passed in (``given``) is the caller's to keep alive.
    How many graphs each pool holds is the process's (``SCOPE.live``): wrappers share pools.
    """

    def __init__(self, device: torch.device, given: Any = None) -> None:
        self.device, self.given = device, given
        self._new()

    def _new(self) -> None:
        given = self.given
        if given is not None:
            self.mempool = given if hasattr(given, "id") else None
            self.id = given.id if hasattr(given, "id") else given
            return
        with torch.cuda.device(self.device):
            mempool_cls = getattr(torch.cuda, "MemPool", None)
            self.mempool = mempool_cls() if mempool_cls is not None else None
            self.id = self.mempool.id if self.mempool is not None else torch.cuda.graph_pool_handle()

    def fresh(self) -> None:
        """A new pool, where the runner owns its pool (after a failed capture)."""
        if self.given is None:
            self._new()

    def check(self, owner: str) -> None:
        """Before a capture: a pool whose graphs were all released is freed for good."""
        if self.in_use() or not self.spent():
            return
        if self.given is None:
            self._new()
            return
        raise GraphStateError(
            f"{owner} was given a memory pool whose graphs were all released, which frees the "
            "pool for good. Pass a new pool (torch.cuda.graph_pool_handle(), or the pool of a "
            "wrapper that still holds a graph)."
        )

    def spent(self) -> bool:
        """Whether a graph was ever captured into it (after ``check``: it holds one still)."""
        return self.id in SCOPE.used

    def hold(self, graph: torch.cuda.CUDAGraph) -> None:
        """``graph`` was captured into this pool."""
        SCOPE.used.add(self.id)
        SCOPE.live[self.id] = SCOPE.live.get(self.id, 0) + 1
        graph._graphmodule_pool = self.id

    def let_go(self, pool: Any) -> None:
        """A graph captured into ``pool`` (this one, or an earlier pool of the runner) was released."""
        SCOPE.live[pool] -= 1
        if SCOPE.live[pool] == 0 and pool == self.id and self.given is None:
            self._new()

    def in_use(self) -> bool:
        return SCOPE.live.get(self.id, 0) > 0

    def bytes(self) -> int:
        """Device memory in this pool (segments of the caching allocator)."""
        try:
            segments = torch.cuda.memory_snapshot()
        except Exception:  # pragma: no cover - allocator without snapshots
            return 0
        pool = tuple(self.id)
        return sum(s.get("total_size", 0) for s in segments if tuple(s.get("segment_pool_id", ())) == pool)

    def handle(self) -> Any:
        return self.mempool or self.id


class CudaRunner:
    """Warmup and capture on a side stream, replay on the caller's stream, one memory pool."""

    kind = Kind.CUDA

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
        self.pool = CudaPool(device, pool)

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

    def run_eager(self, body: Callable[[], Any]) -> Any:
        # warmup calls may draw random numbers: not while another thread captures
        with SCOPE.lock, torch.cuda.device(self.device):
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
        with SCOPE.lock:
            SCOPE.active += 1
            try:
                return self._capture(body, owner, alone, beside)
            finally:
                SCOPE.active -= 1

    def _target(self, alone: bool, beside: Any) -> tuple[Any, bool]:
        """The pool a capture goes in, and whether it is the runner's shared pool."""
        # beside a graph captured alone: in its pool, whose temporaries' memory this reuses
        # (an _EmptyGraph has no pool; one in the shared pool carries _graphmodule_pool)
        private = (beside.pool() if isinstance(beside, torch.cuda.CUDAGraph)
                   and getattr(beside, "_graphmodule_pool", None) is None else None)
        # (after check, a spent pool holds a graph: emptied ones were replaced)
        shared = private is None and not (alone and beside is None and self.pool.spent())
        pool = self.pool.id if shared else private if private is not None else torch.cuda.graph_pool_handle()
        return pool, shared

    def _capture(self, body: Callable[[], Any], owner: str, alone: bool, beside: Any = None) -> CaptureResult:
        start = time.perf_counter()
        self.pool.check(owner)
        pool, shared = self._target(alone, beside)
        with torch.cuda.device(self.device):
            caller = torch.cuda.current_stream()
            torch.cuda.synchronize()
            # No collector run during capture: a graph destroyed by the collector while
            # another is capturing breaks that capture (tensordict#1804). A full collection
            # before capture (torch.cuda.graph's force_cudagraph_gc) costs some 100 ms in a
            # program with tensordict imported: it runs where torch is told to, and after a
            # failed capture, whose garbage must not meet a capture (see _record).
            if SCOPE.must_collect() or getattr(getattr(torch.compiler, "config", None), "force_cudagraph_gc", False):
                gc.collect()
            reserved = torch.cuda.memory_reserved(self.device)
            gc_was_enabled = gc.isenabled()
            gc.disable()
            # the collector stays off until the new graph has run once: a collection between
            # capture_end and the first replay freed a failed capture's objects and aborted
            try:
                graph, out, empty = self._record(body, owner, caller, pool)
                graph = self._keep(graph, empty, shared)
                # a capture records without running: run once, so `out` holds this call's results
                graph.replay()
                # what this capture added to the memory held (segments a shared pool already
                # had are not counted again)
                nbytes = torch.cuda.memory_reserved(self.device) - reserved
            finally:
                if gc_was_enabled:
                    gc.enable()
        dump = (graph.debug_dump if empty else functools.partial(_dump, graph)) if self.debug else None
        return CaptureResult(graph, out, nbytes, time.perf_counter() - start, None if empty else graph, dump)

    def _record(self, body: Callable[[], Any], owner: str, caller: Any, pool: Any) -> tuple[Any, Any, bool]:
        """``body`` captured into a new graph on the side stream: the graph, what ``body``
        returned, and whether it launched nothing. Raises the diagnosed error, the process
        left as it was, where ``body`` or the capture failed."""
        # debug: keep the cudaGraph_t beside the executable graph, so that
        # debug_dump has a structure to print (without it torch drops it at capture_end)
        graph = torch.cuda.CUDAGraph(keep_graph=True) if self.debug else torch.cuda.CUDAGraph()
        if self.debug:
            graph.enable_debug_mode()
        self.stream.wait_stream(caller)
        with SCOPE.capture():
            out, body_error, end_error, empty = self._run_captured(graph, body, pool)
        caller.wait_stream(self.stream)
        if body_error is not None or end_error is not None:
            original = body_error if body_error is not None else end_error
            self._recover(graph, pool)
            # What the failed capture allocated (the graph, tensors its frames hold) lives
            # in reference cycles through the error's traceback. Freed by the collector
            # between a later capture's end and its first replay, it aborted the process.
            # It is collected before the next capture starts, as torch.cuda.graph does
            # before each one, and the collector stays off from there to that capture's
            # first replay.
            SCOPE.collect_before_next_capture()
            raise diagnose(owner, original, end_error) from original
        return graph, out, empty

    def _run_captured(self, graph: torch.cuda.CUDAGraph, body: Callable[[], Any], pool: Any) -> tuple:
        """``body()`` between ``capture_begin`` and ``capture_end`` on the side stream: what it
        returned, its error, capture_end's error, and whether the graph is empty."""
        body_error: BaseException | None = None
        end_error: BaseException | None = None
        out = None
        empty = False
        with torch.cuda.stream(self.stream):
            try:
                graph.capture_begin(pool=pool, capture_error_mode=self.capture_error_mode)
            except BaseException as exc:  # noqa: BLE001 - a capture that never started
                body_error = exc
            else:
                try:
                    out = body()
                except BaseException as exc:  # noqa: BLE001 - re-raised by _record
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
        return out, body_error, end_error, empty

    def _keep(self, graph: torch.cuda.CUDAGraph, empty: bool, shared: bool) -> Any:
        """The handle of a graph captured without error, counted in the pool it shares."""
        if empty:
            return _EmptyGraph()
        if self.debug:
            graph.instantiate()  # keep_graph=True: capture_end left that to us
        if shared:  # (a pool of its own dies with the graph and its outputs)
            self.pool.hold(graph)
        return graph

    def replay(self, handle: torch.cuda.CUDAGraph) -> None:
        # cudaGraphLaunch on the current stream: no host synchronisation.
        if SCOPE.active and not SCOPE.inside():  # another thread captures: wait for it to end
            with SCOPE.lock:
                handle.replay()
            return
        handle.replay()

    def release(self, handle: Any) -> None:
        if handle is None:
            return
        if SCOPE.active and not SCOPE.inside():  # a pool freed during another thread's capture aborts it
            with SCOPE.lock:
                self._release(handle)
            return
        self._release(handle)

    def _release(self, handle: Any) -> None:
        pool = getattr(handle, "_graphmodule_pool", None)
        handle.reset()
        if pool is not None:
            self.pool.let_go(pool)

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
        self.pool.fresh()
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


def _dump(graph: torch.cuda.CUDAGraph, path: str) -> None:
    """Write ``graph``'s structure (Graphviz) to ``path``."""
    # torch announces each dump with "DEBUG: ..." warnings; the caller asked for it
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="DEBUG: calling")
        graph.debug_dump(path)


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

