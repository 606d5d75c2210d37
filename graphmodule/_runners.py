"""Runners: the protocol the wrapper calls to run, capture and replay, and the eager runner.

Three runners share one protocol (:class:`Runner`), so that the wrapper never asks which
one it has:

- ``CudaRunner`` (``_runner_cuda``): real CUDA graphs, all captured into one memory pool;
  the only runner that touches CUDA graphs, streams and pools.
- ``SimulatedRunner`` (``_runner_simulate``): the same protocol on any device; a capture
  records the tensor operations the function dispatches and a replay runs them, and no
  Python, on the same memory (``_simulate``), so that what a GPU's replay does can be
  tested on a CPU machine.
- ``EagerRunner``: no graph; the function runs at every call (the CPU fallback).

The protocol is narrow: run eagerly, capture, replay, release, the pool, the streams. What
only some runners have is a value, not a member: :class:`Kind` says what a runner makes of a
capture (in the words of messages), and ``capture(body, owner)`` returns a
:class:`CaptureResult`: a handle to replay, what ``body`` returned, as it stands after one
execution (a CUDA capture records without running, so the CUDA runner replays once before
returning), what the capture cost, and, where there is one, the ``torch.cuda.CUDAGraph`` and
what writes its structure. ``_backend`` picks the runner a backend name asks for; ``_scope``
holds what captures share in the process.
"""

from __future__ import annotations

import enum
from typing import Any, Callable, NamedTuple, Protocol

import torch

from ._errors import GraphStateError

__all__ = ["NO_POOL", "CaptureResult", "EagerRunner", "Kind", "Pool", "Runner"]


class Kind(enum.Enum):
    """What a runner makes of a capture; the value says it in the words of messages."""

    CUDA = "backend='cuda'"
    SIMULATED = "backend='simulate': a replay runs the recorded tensor operations"
    EAGER = "backend='eager': it runs eagerly"
    NO_CUDA = "no CUDA: it runs eagerly"

    @property
    def captures(self) -> bool:
        """Whether it captures graphs (False: every call runs eagerly)."""
        return self is Kind.CUDA or self is Kind.SIMULATED


class CaptureResult(NamedTuple):
    """What a capture made."""

    handle: Any  # what replay() and release() take
    out: Any  # what the body returned, as it stands after one execution
    bytes: int  # device memory the capture added (segments a shared pool already had: not counted)
    seconds: float  # wall time of the capture
    # the torch.cuda.CUDAGraph behind handle (None: no CUDA graph, or one that launched nothing)
    cuda_graph: torch.cuda.CUDAGraph | None = None
    # writes the graph's structure (Graphviz) to a path (None: it keeps none, see debug=True)
    dump: Callable[[str], None] | None = None


class Pool(Protocol):
    """The memory a runner's graphs share."""

    def in_use(self) -> bool:
        """Whether it holds a graph: a graph captured into it now may find its memory where
        an earlier graph keeps its temporaries (see ``CudaRunner.capture``)."""

    def bytes(self) -> int:
        """Device memory in it."""

    def handle(self) -> Any:
        """What another wrapper's ``pool=`` takes to share it (None: none)."""


class Runner(Protocol):
    """What the wrapper asks of a runner; each runner answers every part."""

    kind: Kind
    device: torch.device | None  # the CUDA device of its graphs (None without CUDA)
    pool: Pool

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


class _NoPool:
    """The pool of a runner without device memory of its own."""

    def in_use(self) -> bool:
        return False

    def bytes(self) -> int:
        return 0

    def handle(self) -> Any:
        return None


NO_POOL = _NoPool()


class EagerRunner:
    """No graphs: the function runs at every call. ``kind``: ``EAGER`` (asked for) or
    ``NO_CUDA`` (``backend="auto"`` without CUDA)."""

    device = None
    pool = NO_POOL

    def __init__(self, kind: Kind = Kind.EAGER) -> None:
        self.kind = kind

    def run_eager(self, body: Callable[[], Any]) -> Any:
        return body()

    def capture(self, body: Callable[[], Any], owner: str, alone: bool = False, beside: Any = None) -> CaptureResult:
        raise GraphStateError(f"{owner} runs every call eagerly ({self.kind.value}): it captures "
                              "no graph.")  # (the wrapper never asks: its kind captures nothing)

    def replay(self, handle: Any) -> None:
        raise GraphStateError("an eager runner holds no graph to replay.")

    def release(self, handle: Any) -> None:
        pass

    def on_capture_stream(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)

    def new_caller(self) -> None:
        pass
