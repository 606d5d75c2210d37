"""Runners: everything that touches CUDA graphs, streams and pools: the warmup stream,
capture, replay, cleanup, memory accounting.

Three runners share one protocol (:class:`Runner`), so that the wrapper never asks which
one it has:

- ``CudaRunner``: real CUDA graphs, all captured into one memory pool.
- ``SimulatedRunner``: the same protocol on any device; a capture records the tensor
  operations the function dispatches and a replay runs them, and no Python, on the same
  memory (``_simulate``), so that what a GPU's replay does can be tested on a CPU machine.
- ``EagerRunner``: no graph; the function runs at every call (the CPU fallback).

``capture(body, owner)`` returns a :class:`CaptureResult`: a handle to replay, what
``body`` returned, as it stands after one execution (a CUDA capture records without
running, so the CUDA runner replays once before returning), and what the capture cost.
"""

from __future__ import annotations

import gc
import threading
import time
import warnings
import weakref
from typing import Any, Callable, NamedTuple, Protocol

import torch

from ._diagnose import diagnose
from ._errors import GraphStateError
from ._paths import user_stacklevel
from ._simulate import SimulatedGraph, record

__all__ = ["CAPTURE_ERROR_MODES", "CaptureResult", "CudaRunner", "EagerRunner", "Runner", "SimulatedRunner",
           "capturing", "make_runner"]

CAPTURE_ERROR_MODES = ("thread_local", "global", "relaxed")

_LOCAL = threading.local()
_CAPTURE_LOCK = threading.RLock()
_FAILED = [False]  # a capture failed since the last full collection (see CudaRunner._capture)
# captures in progress: the CUDA random generator is shared by all threads, and a graph
# replayed or a random op run eagerly in another thread while one captures breaks both
_ACTIVE = [0]
# graphs alive per pool id, and the pool ids ever captured into (a pool with no graph
# left is freed by torch and cannot be captured into again)
_LIVE: dict[Any, int] = {}
_USED: set = set()


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


class CaptureResult(NamedTuple):
    """What a capture made."""

    handle: Any  # what replay() and release() take
    out: Any  # what the body returned, as it stands after one execution
    bytes: int  # device memory the capture added (segments a shared pool already had: not counted)
    seconds: float  # wall time of the capture


class Runner(Protocol):
    """What the wrapper asks of a runner; each runner answers every part."""

    captures: bool  # whether it captures graphs (False: every call runs eagerly)
    dumps: bool  # whether its graphs have a structure debug_dump writes (False: debug_dump raises why)
    device: torch.device | None  # the CUDA device of its graphs (None without CUDA)
    simulated: bool  # whether its graphs stand in for CUDA graphs on another device (_simulate)

    def run_eager(self, body: Callable[[], Any]) -> Any:
        """``body()`` where warmup calls run (CUDA: on the side stream, ordered with the caller's)."""

    def capture(self, body: Callable[[], Any], owner: str, alone: bool = False, beside: Any = None) -> CaptureResult:
        """Capture ``body``; ``alone``: in memory no other graph writes; ``beside``: a graph
        whose pool this one shares. Raises :class:`~graphmodule.CaptureError`."""

    def replay(self, handle: Any) -> None:
        """Replay a captured graph on the caller's stream."""

    def release(self, handle: Any) -> None:
        """Free a graph (its memory goes back to the pool)."""

    def on_capture_stream(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` with the stream the graphs were captured on current (a layer's
        autograd node is made there, see ``_grad``)."""

    def new_caller(self) -> None:
        """Another thread calls: order its stream after the last caller's, whose replay and
        copies may still be running when this call writes the same buffers."""

    def pool_in_use(self) -> bool:
        """Whether the shared pool holds a graph: a graph captured into it now may find
        its memory where an earlier graph keeps its temporaries (see ``capture``)."""

    def pool_bytes(self) -> int:
        """Device memory in the runner's pool."""

    def pool_handle(self) -> Any:
        """What another wrapper's ``pool=`` takes to share this runner's pool (None: none)."""

    def cuda_graph(self, handle: Any) -> torch.cuda.CUDAGraph | None:
        """The ``torch.cuda.CUDAGraph`` behind ``handle``, if there is one."""

    def debug_dump(self, handle: Any, path: str, owner: str) -> None:
        """Write the graph's structure (Graphviz) to ``path``."""


class EagerRunner:
    """No graphs: the function runs at every call. ``why``: why, in the words of messages
    (``"no CUDA"``, ``"backend='eager'"``)."""

    captures = False
    dumps = False
    simulated = False
    device = None

    def __init__(self, why: str = "backend='eager'") -> None:
        self.why = why

    def run_eager(self, body: Callable[[], Any]) -> Any:
        return body()

    def capture(self, body: Callable[[], Any], owner: str, alone: bool = False, beside: Any = None) -> CaptureResult:
        raise GraphStateError(f"{owner} runs every call eagerly ({self.why}): it captures "
                              "no graph.")  # (the wrapper never asks: captures is False)

    def replay(self, handle: Any) -> None:
        raise GraphStateError("an eager runner holds no graph to replay.")

    def release(self, handle: Any) -> None:
        pass

    def on_capture_stream(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)

    def new_caller(self) -> None:
        pass

    def pool_in_use(self) -> bool:
        return False

    def pool_bytes(self) -> int:
        return 0

    def pool_handle(self) -> Any:
        return None

    def cuda_graph(self, handle: Any) -> None:
        return None

    def debug_dump(self, handle: Any, path: str, owner: str) -> None:
        raise GraphStateError(f"{owner} records no CUDA graph ({self.why}): "
                              "there is no graph structure to dump; use backend='cuda' on a GPU.")


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


def make_runner(backend: str, device: Any, capture_error_mode: str, pool: Any, debug: bool = False) -> Runner:
    """The runner a backend name asks for (``auto``: CUDA if available, else eager with a warning)."""
    has_cuda = torch.cuda.is_available()
    if backend == "auto":
        if not has_cuda:
            warnings.warn(
                "CudaGraphModule: CUDA is not available, so calls run eagerly (same results, "
                "no speed-up). Calls are still checked as they would be on a GPU (signatures, "
                "max_graphs, what the function reads).",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
            return EagerRunner("no CUDA: it runs eagerly")
        backend = "cuda"
    if backend == "eager":
        return EagerRunner("backend='eager': it runs eagerly")
    if backend == "simulate":
        return SimulatedRunner()
    if not has_cuda:
        raise RuntimeError(
            "CudaGraphModule(backend='cuda') needs CUDA, but torch.cuda.is_available() is "
            "False; use backend='auto' to run eagerly without CUDA."
        )
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device must be a CUDA device (got {device}).")
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return CudaRunner(device, capture_error_mode, getattr(pool, "pool", pool), debug)
