"""Everything that touches CUDA graphs: the warmup stream, capture, replay, cleanup.

Three runners share one small interface, so that the state machine in
``_module.py`` never branches on the backend:

- ``CudaRunner``: real CUDA graphs.
- ``SimulatedRunner``: the same protocol on any device; a "replay" re-runs the
  function on the static buffers and copies its outputs into the captured ones,
  so that buffer handling can be tested on a CPU machine.
- ``EagerRunner``: no graph; every call runs the function (the CPU fallback).

A runner's ``capture(body)`` calls ``body()`` once under capture and returns what it
returned: the static outputs that later ``replay()`` calls refresh in place.
"""

from __future__ import annotations

import gc
import os
import time
import traceback
from typing import Any, Callable

import torch

from ._errors import CaptureError
from ._tree import tensor_leaves

__all__ = ["CudaRunner", "EagerRunner", "SimulatedRunner", "diagnose"]

CAPTURE_ERROR_MODES = ("thread_local", "global", "relaxed")


class EagerRunner:
    """No graphs: the function runs at every call."""

    captures = False

    def run_eager(self, body: Callable[[], Any]) -> Any:
        return body()

    def release(self) -> None:
        pass


class SimulatedRunner(EagerRunner):
    """The capture/replay protocol without CUDA: a replay re-runs ``body``.

    The fresh outputs are copied into the captured ones, which is what a real
    replay does to the graph's output buffers, so callers see the same aliasing.
    """

    captures = True

    def __init__(self) -> None:
        self._body: Callable[[], Any] | None = None
        self._static: list[torch.Tensor] = []
        self.capture_seconds = 0.0

    def capture(self, body: Callable[[], Any], owner: str) -> Any:
        start = time.perf_counter()
        try:
            out = body()
        except Exception as exc:  # as a real capture reports a failing function
            raise diagnose(owner, exc) from exc
        self._body = body
        self._static = tensor_leaves(out)
        self.capture_seconds = time.perf_counter() - start
        return out

    def replay(self) -> None:
        assert self._body is not None, "replay() before capture()"
        fresh = tensor_leaves(self._body())
        pairs = [(s, f) for s, f in zip(self._static, fresh) if s is not f]
        if pairs:
            with torch.no_grad():
                torch._foreach_copy_([s for s, _ in pairs], [f for _, f in pairs])

    def release(self) -> None:
        self._body, self._static = None, []


class CudaRunner:
    """Warmup on a side stream, capture on it, replay on the caller's stream."""

    captures = True

    def __init__(self, device: torch.device, capture_error_mode: str = "thread_local") -> None:
        self.device = device
        self.capture_error_mode = capture_error_mode
        # One side stream, forked from the caller's stream at each use: warmup work
        # and lazy initialisation (cuBLAS handles, autotuning) happen off the
        # legacy stream, as capture requires.
        self.stream = torch.cuda.Stream(device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.capture_seconds = 0.0

    def run_eager(self, body: Callable[[], Any]) -> Any:
        with torch.cuda.device(self.device):
            caller = torch.cuda.current_stream()
            self.stream.wait_stream(caller)
            with torch.cuda.stream(self.stream):
                out = body()
            caller.wait_stream(self.stream)
        return out

    def capture(self, body: Callable[[], Any], owner: str) -> Any:
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
            try:
                with torch.cuda.stream(self.stream):
                    graph.capture_begin(capture_error_mode=self.capture_error_mode)
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
                if gc_was_enabled:
                    gc.enable()
            caller.wait_stream(self.stream)
            if body_error is not None or end_error is not None:
                original = body_error if body_error is not None else end_error
                self._recover(graph)
                raise diagnose(owner, original, end_error) from original
        self.graph = graph
        self.capture_seconds = time.perf_counter() - start
        return out

    def replay(self) -> None:
        # cudaGraphLaunch on the current stream: no host synchronisation.
        self.graph.replay()

    def release(self) -> None:
        if self.graph is not None:
            self.graph.reset()
            self.graph = None

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


# (markers in the error text, short cause, what to do)
_CAUSES: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (
        ("capturable is False", "capturable=False", "capturable=True"),
        "optimizer-not-capturable",
        "the optimizer steps inside the graph but was created without capturable=True. "
        "Create it with capturable=True, e.g. torch.optim.Adam(params, lr=1e-3, capturable=True).",
    ),
    (
        ("not permitted when stream is capturing", "cudaErrorStreamCaptureUnsupported",
         "cudaStreamSynchronize", "synchronize"),
        "host-sync",
        "the function waits for the GPU during capture (.item(), .cpu(), .tolist(), print of a "
        "tensor, `if tensor:`, torch.nonzero or boolean-mask indexing). Keep values on the GPU "
        "(torch.where instead of `if`), or move the synchronising line out of the wrapped function.",
    ),
    (
        ("Cannot copy between CPU and CUDA", "unless the CPU tensor is pinned"),
        "cpu-to-gpu-copy",
        "a CPU tensor is copied to the GPU inside the function (torch.tensor(...) or .to('cuda') "
        "of CPU data). The graph would bake that data in: create the tensor on the GPU outside "
        "the function and pass it as an input.",
    ),
    (
        ("legacy stream depend on a capturing blocking stream", "cudaErrorStreamCaptureImplicit",
         "cudaErrorStreamCaptureIsolation", "cudaErrorStreamCaptureUnjoined", "cudaErrorStreamCaptureMerge"),
        "cross-stream",
        "work ran on a stream other than the capture stream: usually a CPU-to-GPU copy or "
        "tensor creation from Python data inside the function, or work on a stream not forked "
        "from the current one. Create GPU tensors outside the function and pass them in.",
    ),
    (
        ("current_seed", "philox_cuda_state", "manual_seed", "get_rng_state", "set_rng_state"),
        "rng-state",
        "the random generator's seed or state was read or set during capture (torch.manual_seed, "
        "activation checkpointing, or torch.compile recompiling inside the graph). Move seeding "
        "out of the function; for compiled functions, raise `warmup` so compilation ends before capture.",
    ),
    (
        ("CUBLAS_STATUS", "CUDNN_STATUS", "cuBLAS", "cuDNN", "cusolver", "CUFFT"),
        "lazy-init",
        "a CUDA library initialised itself during capture. Raise `warmup` so that the eager "
        "calls before capture initialise it.",
    ),
    (
        ("torch._dynamo", "Dynamo", "inductor", "Recompil", "recompil"),
        "compile",
        "torch.compile was still compiling during capture. Raise `warmup` until no recompile "
        "happens (TORCH_LOGS=recompiles lists them).",
    ),
    (
        ("out of memory",),
        "out-of-memory",
        "the GPU ran out of memory while capturing. Free memory, reduce the batch, or share "
        "one pool between graphs.",
    ),
    (
        ("cudaErrorStreamCaptureInvalidated", "previous error during capture", "Invalid capture"),
        "capture-invalidated",
        "an operation inside the function broke the capture without raising where it ran; "
        "typical culprits are host synchronisations and copies between CPU and GPU. Run the "
        "function with torch.cuda.set_sync_debug_mode('error') to find it.",
    ),
)

_INTERNAL = (
    os.sep + os.path.join("torch", ""),
    os.sep + os.path.join("tensordict", ""),
    os.sep + os.path.join("graphmodule", ""),
)


def _user_frame(exc: BaseException) -> str | None:
    """``file:line in func`` of the innermost frame outside torch/tensordict/graphmodule."""
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        if not any(part in frame.filename for part in _INTERNAL):
            line = f" `{frame.line.strip()}`" if frame.line else ""
            return f"{os.path.basename(frame.filename)}:{frame.lineno} in {frame.name}{line}"
    return None


def diagnose(owner: str, original: BaseException, end_error: BaseException | None = None) -> CaptureError:
    """The :class:`CaptureError` naming the likely cause of a failed capture."""
    texts = [f"{type(original).__name__}: {original}"]
    if end_error is not None and end_error is not original:
        texts.append(str(end_error))
    text = "\n".join(texts)
    for markers, cause, hint in _CAUSES:
        if any(marker in text for marker in markers):
            return CaptureError(owner, cause, hint, original, _user_frame(original))
    return CaptureError(
        owner,
        "error-in-function",
        "the wrapped function raised while it was captured; the error above comes from it.",
        original,
        _user_frame(original),
    )
