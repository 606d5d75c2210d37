"""Scaling: DDP and FSDP2 train steps, eager and graphed, on 1..N GPUs, at two model sizes.

    python benchmarks/distributed.py [--gpus 1 2] [--sizes small large] [--out table.md]

Starts ``torchrun --nproc_per_node=G`` for each GPU count G; each process runs the step of
``examples/ddp_train_step.py`` and ``examples/fsdp_train_step.py`` (an MLP, Adam with
``capturable=True``) eagerly and as one CUDA graph on the same batches, and rank 0 reports.
Prints one markdown table: steps/s (every process steps at once) and samples/s per GPU,
eager and graphed, the speed-up, and the largest loss difference between the two runs.
Without CUDA it runs on gloo with simulated graphs (``--gpus`` counts processes then).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


class Size(NamedTuple):
    width: int
    depth: int
    batch: int  # per process
    steps: int  # per run, the first 12 untimed


#: small: launch-bound (the issue's MLP); large: compute-bound on an H100 (~1.6 TFLOP a step)
SIZES = {"small": Size(256, 4, 64, 200), "large": Size(4096, 8, 2048, 40), "tiny": Size(32, 2, 8, 14)}
MODES = ("ddp", "fsdp")


def measure(setup, mode: str, size: Size, warmup: int = 11) -> dict:
    """One model size and parallelism, eager and graphed, on this process group."""
    import copy

    from examples import ddp_train_step, fsdp_train_step
    from examples.common.distributed import Pair, mlp, race, train_step
    from graphmodule import CudaGraphModule

    model = mlp(size.width, size.depth, setup.device)
    if mode == "ddp":  # (an eager DDP runs on the default stream and is built there)
        graphed_model, eager_model = ddp_train_step.ddp(copy.deepcopy(model), setup), ddp_train_step.ddp(
            model, setup, side_stream=False)
    else:
        graphed_model, eager_model = fsdp_train_step.shard(copy.deepcopy(model), setup), fsdp_train_step.shard(
            model, setup)
    graphed = CudaGraphModule(train_step(graphed_model, setup.device), warmup=warmup, backend=setup.graph_backend)
    pair = Pair(graphed, train_step(eager_model, setup.device), graphed_model, eager_model)
    return race(setup, pair, size.steps, size.batch, size.width, min(warmup + 1, size.steps))


def worker(sizes: list[str], modes: list[str]) -> None:
    """One process of the group: every size and mode; rank 0 prints a ``ROW`` line for each."""
    import torch.distributed as dist

    from examples.common.distributed import init

    setup = init()
    for name in sizes:
        for mode in modes:
            numbers = measure(setup, mode, SIZES[name])
            if setup.rank == 0:
                row = dict(numbers, gpus=setup.world, size=name, mode=mode, batch=SIZES[name].batch,
                           device=setup.device.type)
                print("ROW " + json.dumps(row), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def table(rows: list[dict]) -> str:
    lines = ["| GPUs | model | parallel | eager steps/s | graphed steps/s | speed-up | eager samples/s/GPU "
             "| graphed samples/s/GPU | max loss diff |",
             "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        size = SIZES[r["size"]]
        model = f"{r['size']} (MLP {size.depth}x{size.width}, batch {size.batch}/GPU)"
        eager, graphed = r["eager_steps_per_s"], r["graphed_steps_per_s"]
        lines.append(f"| {r['gpus']} | {model} | {r['mode'].upper()} | {eager:,.0f} | {graphed:,.0f} | "
                     f"{graphed / eager:.1f}x | {eager * r['batch']:,.0f} | {graphed * r['batch']:,.0f} | "
                     f"{r['loss_diff']:.1e} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--sizes", nargs="+", choices=SIZES, default=["small", "large"])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--timeout", type=float, default=400.0, help="seconds per GPU count")
    parser.add_argument("--out", help="also write the table to this file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.sizes, args.modes)
        return
    from tests.distributed.launch import torchrun

    rows = []
    for gpus in args.gpus:
        ended = torchrun(["--worker", "--sizes", *args.sizes, "--modes", *args.modes], nproc=gpus,
                         timeout=args.timeout, script=os.path.abspath(__file__))
        found = [json.loads(line[4:]) for line in ended.output.splitlines() if line.startswith("ROW ")]
        if ended.code != 0 or not found:
            print(f"{gpus} process(es): exit {ended.code} after {ended.seconds:.0f} s\n{ended.output[-3000:]}")
        rows += found
    text = table(rows)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
