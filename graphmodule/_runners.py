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

``capture(body, owner)`` returns a :class:`CaptureResult`: a handle to replay, what
``body`` returned, as it stands after one execution (a CUDA capture records without
running, so the CUDA runner replays once before returning), and what the capture cost.
``_backend`` picks the runner a backend name asks for; ``_scope`` holds what captures share
in the process.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Protocol

import torch

from ._errors import GraphStateError

__all__ = ["CAPTURE_ERROR_MODES", "CaptureResult", "EagerRunner", "Runner"]

CAPTURE_ERROR_MODES = ("thread_local", "global", "relaxed")


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

