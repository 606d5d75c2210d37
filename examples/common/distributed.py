"""What ``ddp_train_step.py`` and ``fsdp_train_step.py`` share: joining the process group
torchrun describes (NCCL with one GPU per process; gloo and simulated graphs without CUDA),
the model, the batches, the train step, and running it eagerly and graphed on the same seeds.

Each process runs its own batches (seeded by rank); the graphed step and its eager twin
start from the same weights, so their losses and parameters must agree exactly.
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from typing import Callable, NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

__all__ = ["Pair", "Run", "Setup", "compare", "finish", "flags", "init", "make_batches", "mlp", "race", "report", "run",
           "train_step"]


class Setup(NamedTuple):
    rank: int
    world: int
    device: torch.device
    graph_backend: str  # CudaGraphModule's backend: "cuda" on GPUs, "simulate" on CPU
    owns_group: bool  # this program initialized the process group (and destroys it)


class Pair(NamedTuple):
    """A graphed step and its eager twin, over models built alike from the same weights."""

    graphed: Callable  # the CudaGraphModule
    eager: Callable
    graphed_model: nn.Module
    eager_model: nn.Module


class Run(NamedTuple):
    losses: torch.Tensor  # one per step
    seconds: float  # wall time of the timed steps (those after the capture)
    steps: int  # timed steps


def flags(description: str, warmup: int) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=200, help="train steps per run (the first warmup+1 untimed)")
    parser.add_argument("--width", type=int, default=256, help="MLP width")
    parser.add_argument("--depth", type=int, default=4, help="MLP Linear layers")
    parser.add_argument("--batch", type=int, default=64, help="samples per process and step")
    parser.add_argument("--warmup", type=int, default=warmup, help="eager calls before the capture")
    parser.add_argument("--graph-backend", default="auto", choices=("auto", "cuda", "simulate", "eager"),
                        help="CudaGraphModule's backend (auto: cuda on GPUs, simulate on CPU)")
    return parser


def init(graph_backend: str = "auto") -> Setup:
    """Join the process group (torchrun's environment, or one process of its own); on GPUs,
    the process's device is cuda:LOCAL_RANK."""
    cuda = torch.cuda.is_available()
    owns = not dist.is_initialized()
    if owns:
        if "RANK" not in os.environ:  # plain `python example.py`: a group of one
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                              MASTER_PORT=str(port))
        if cuda:
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
            dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
        else:
            dist.init_process_group("gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    if graph_backend == "auto":
        graph_backend = "cuda" if cuda else "simulate"
    return Setup(dist.get_rank(), dist.get_world_size(), device, graph_backend, owns)


def mlp(width: int, depth: int, device: torch.device) -> nn.Sequential:
    """``depth`` Linear layers of ``width``, ReLU between them; the same weights on every rank."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for i in range(depth):
        layers += [nn.Linear(width, width)] + ([nn.ReLU()] if i < depth - 1 else [])
    return nn.Sequential(*layers).to(device)


def make_batches(setup: Setup, steps: int, batch: int, width: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator(device=setup.device).manual_seed(1000 + setup.rank)
    return [(torch.randn(batch, width, device=setup.device, generator=gen),
             torch.randn(batch, width, device=setup.device, generator=gen)) for _ in range(steps)]


def train_step(model: nn.Module, device: torch.device,
               capturable: bool | None = None) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Forward, backward (the gradient collectives), and Adam's step: one call."""
    # capturable=True (the default on GPUs) keeps Adam's step counts on the GPU, as a graph needs
    capturable = device.type == "cuda" if capturable is None else capturable
    # (on a CPU: fused, whose step counts stay tensors, which a simulated graph needs)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=capturable, fused=device.type == "cpu")

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(step: Callable, batches: list, untimed: int, device: torch.device) -> Run:
    """Every batch through ``step``; the steps after the first ``untimed`` are timed."""
    losses = torch.empty(len(batches), device=device)
    for i, batch in enumerate(batches[:untimed]):
        losses[i] = step(*batch)
    _sync(device)
    start = time.perf_counter()
    for i in range(untimed, len(batches)):
        losses[i] = step(*batches[i])
    _sync(device)
    return Run(losses, time.perf_counter() - start, len(batches) - untimed)


def _max_over_ranks(value: torch.Tensor) -> float:
    value = value.detach().clone()
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return value.item()


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if hasattr(p, "to_local") else p  # a DTensor's shard


def compare(eager: Run, graphed: Run, eager_model: nn.Module, graphed_model: nn.Module) -> dict:
    """Steps per second of both runs, and their largest differences over all ranks."""
    loss_diff = _max_over_ranks((eager.losses - graphed.losses).abs().max())
    param_diff = _max_over_ranks(torch.stack([
        (_local(p) - _local(q)).abs().max() for p, q in zip(eager_model.parameters(), graphed_model.parameters())
    ]).max())
    return {"eager_steps_per_s": eager.steps / eager.seconds, "graphed_steps_per_s": graphed.steps / graphed.seconds,
            "loss_diff": loss_diff, "param_diff": param_diff, "steps": len(eager.losses)}


def report(title: str, setup: Setup, batch: int, numbers: dict, stats) -> None:
    """Rank 0 prints the comparison."""
    if setup.rank != 0:
        return
    print(title)
    eager, graphed = numbers["eager_steps_per_s"], numbers["graphed_steps_per_s"]
    for name, rate in (("eager", eager), ("graphed", graphed)):
        speedup = f"  {graphed / eager:.2f}x" if name == "graphed" else ""
        print(f"  {name:8s} {rate:9.1f} steps/s  {1e6 / rate:9.0f} us/step  {rate * batch:11.0f} samples/s "
              f"per process{speedup}")
    print(f"  max |loss graphed - eager| = {numbers['loss_diff']:.3e} over {numbers['steps']} steps on {setup.world} "
          f"rank(s); max |param graphed - eager| = {numbers['param_diff']:.3e}")
    print(f"  graphed stats: {stats.warmup_calls} warmup, {stats.captures} capture, {stats.replays} replays, "
          f"{stats.eager_calls} eager")


def race(setup: Setup, pair: Pair, steps: int, batch: int, width: int, untimed: int) -> dict:
    """Both steps over the same batches (``steps`` of them, the first ``untimed`` untimed)."""
    batches = make_batches(setup, steps, batch, width)
    eager = run(pair.eager, batches, untimed, setup.device)
    graphed = run(pair.graphed, batches, untimed, setup.device)
    return compare(eager, graphed, pair.eager_model, pair.graphed_model)


def finish(name: str, setup: Setup, args: argparse.Namespace, pair: Pair) -> dict:
    """An example's end: the race with its flags, the report, the process group torn down."""
    untimed = min(args.warmup + 1, args.steps)
    numbers = race(setup, pair, args.steps, args.batch, args.width, untimed)
    title = (f"{name} train step, {setup.world} process(es) ({dist.get_backend()}, {setup.device.type}), graph "
             f"backend {setup.graph_backend!r}, MLP {args.depth}x{args.width}, batch {args.batch} per process, "
             f"{args.steps} steps ({untimed} untimed)")
    report(title, setup, args.batch, numbers, pair.graphed.stats)
    if setup.owns_group:
        dist.barrier()  # every rank done before any tears the group down
        dist.destroy_process_group()  # (the wrapper is alive: its graphs are released first)
    return numbers
