"""A DistributedDataParallel train step as one CUDA graph, on every process.

    torchrun --nproc_per_node=N examples/ddp_train_step.py [--steps 200] [--width 256 --depth 4 --batch 64]

Each process wraps its whole step (forward, ``loss.backward()`` with DDP's gradient
all-reduces, ``Adam(capturable=True).step()``) in one ``CudaGraphModule`` and runs it beside an
eager twin built from the same weights, on the same batches: the losses and parameters must
agree exactly, and the replays run the step without the host's per-kernel launches.

What the wrapper needs around DDP (each missing one is a ``CaptureError`` naming it):

- ``warmup=11``: DDP waits for the GPU in its first 11 forward passes with gradients (it
  times them for its runtime statistics) and rebuilds its buckets in the second (cause
  ``ddp-warmup``).
- DDP built on a side stream: it keeps its parameters' gradient accumulators, which run on
  the stream it was built on, and the default stream cannot join a capture (cause
  ``ddp-default-stream``).
- a NCCL process group for CUDA tensors: gloo copies them through the host (cause
  ``collective-on-cpu-group``).
- nothing at exit: the wrapper's graphs are released before ``destroy_process_group()``
  (and at interpreter exit), which NCCL needs to finalize its communicators.

``static_graph`` and ``find_unused_parameters`` may stay as they are (both captured and
matched eager with every parameter used).

Without CUDA it runs on gloo with simulated graphs (``--graph-backend simulate``), which
checks the wiring, not the speed.
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys

if __package__ in (None, ""):  # run as a file: make ``examples`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from examples.common.distributed import Pair, Setup, finish, flags, init, mlp, train_step
from graphmodule import CudaGraphModule

DDP_WARMUP = 11  # DDP waits for the GPU in its first 11 forward passes with gradients


def ddp(model: nn.Module, setup: Setup, side_stream: bool = True) -> DistributedDataParallel:
    """``model`` under DDP; on GPUs built on a side stream, for a graphed step (an eager one
    runs on the default stream and is built there)."""
    cuda = setup.device.type == "cuda" and side_stream
    stream = torch.cuda.Stream() if cuda else None
    with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
        wrapped = DistributedDataParallel(model, device_ids=[setup.device.index] if setup.device.type == "cuda" else None)
    if cuda:
        torch.cuda.current_stream().wait_stream(stream)
        # The wrapper warms up and captures on a stream of its own, not this one: torch warns of
        # the mismatch, which costs an event per parameter in the warmup steps and no host work in
        # replays (the capture joins the two streams).
        quiet = getattr(torch.autograd.graph, "set_warn_on_accumulate_grad_stream_mismatch", None)
        if quiet is not None:
            quiet(False)
    return wrapped


def main(argv: list[str] | None = None) -> dict:
    args = flags(__doc__.splitlines()[0], warmup=DDP_WARMUP).parse_args(argv)
    setup = init(args.graph_backend)
    model = mlp(args.width, args.depth, setup.device)
    graphed_model, eager_model = ddp(copy.deepcopy(model), setup), ddp(model, setup, side_stream=False)
    graphed = CudaGraphModule(train_step(graphed_model, setup.device), warmup=args.warmup,
                              backend=setup.graph_backend)
    return finish("DDP", setup, args, Pair(graphed, train_step(eager_model, setup.device), graphed_model, eager_model))


if __name__ == "__main__":
    main()
