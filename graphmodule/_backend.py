"""The runner a backend name asks for (``_runners``: the protocol they all answer)."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from ._paths import user_stacklevel
from ._runner_cuda import CudaRunner
from ._runner_simulate import SimulatedRunner
from ._runners import EagerRunner, Kind, Runner

__all__ = ["make_runner"]


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
            return EagerRunner(Kind.NO_CUDA)
        backend = "cuda"
    if backend == "eager":
        return EagerRunner(Kind.EAGER)
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
