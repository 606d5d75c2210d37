"""Counters a user can read: ``CudaGraphModule.stats``."""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["GraphStats"]


@dataclass
class GraphStats:
    """What a :class:`~graphmodule.CudaGraphModule` has done so far.

    Attributes:
        warmup_calls: calls run eagerly before the capture.
        captures: graphs captured (more than one only after ``reset()``).
        replays: calls answered by replaying the graph (the capturing call included).
        eager_calls: calls after warmup that ran eagerly (no CUDA, or after a failed
            capture with ``on_capture_failure="eager"``, or with ``outputs="safe"`` while
            every output set's results were held and no graph returning copies could be
            captured).
        capture_failures: captures that failed.
        input_mismatches: calls refused because their inputs differed from the capture (or,
            with ``max_graphs=None``, because 8 Python values and modes had graphs already).
        recaptures: graphs dropped because what they read changed (``on_stale="recapture"``).
        evictions: graphs dropped for a new signature (``on_graph_limit="evict"``).
        inline_calls: calls made while another wrapper was capturing (recorded into its graph).
        graphs: graphs held now (without CUDA: the signatures held, each served eagerly).
        pool_bytes: device memory held by the graphs' memory pool (shared pools count whole).
        capture_seconds: wall time of the last capture.
        twin_captures: further captures of a call (``outputs="safe"``), with output buffers
            of their own: made when results of every set were still held at a call, so
            that the sets alternate instead of copying (at most two per call).
        copy_recaptures: graphs captured once more to return copies (``outputs="safe"``):
            the caller held results of all three output sets of a call at once.
        lending_captures: graphs of a new signature captured a second time to lend their
            results (``outputs="safe"``, in a pool that already held a graph: the first
            capture returned copies; the second copies its results, inside the graph,
            into buffers outside the pool, which it lends).
        twin_bytes: device memory the twin captures added: their output buffers (allocated
            outside any graph pool) and what their captures added to the pool (usually
            nothing: a twin reuses the memory of the first capture's temporaries).
        graph_bytes: for each graph held (most recently used first), the device memory
            its capture added to the pool (0 where a shared pool already had room).

    Example:
        >>> import torch, warnings
        >>> from graphmodule import CudaGraphModule
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     g = CudaGraphModule(lambda x: x + 1, backend="eager")
        >>> _ = g(torch.zeros(2))
        >>> g.stats.warmup_calls
        1
    """

    warmup_calls: int = 0
    captures: int = 0
    replays: int = 0
    eager_calls: int = 0
    capture_failures: int = 0
    input_mismatches: int = 0
    recaptures: int = 0
    evictions: int = 0
    inline_calls: int = 0
    graphs: int = 0
    pool_bytes: int = 0
    capture_seconds: float = 0.0
    twin_captures: int = 0
    copy_recaptures: int = 0
    lending_captures: int = 0
    twin_bytes: int = 0
    graph_bytes: tuple[int, ...] = ()

    def copy(self) -> "GraphStats":
        return replace(self)
