"""Forward + backward of a small MLP block per call: eager, make_graphed_callables, graphmodule.

Usage: python scripts/grad_bench.py [--rounds 30] [--calls 100] [--sizes 1x64 32x256 256x1024]

Each call is one training step's share of a block in the middle of a model: ``y = block(x)``
with ``x`` requiring grad, then ``y.backward(gy)`` (gradients reach ``x`` and the block's
parameters; ``.grad`` set to None before each call, as ``zero_grad()`` does). Variants:

- ``eager``: the block itself;
- ``make_graphed_callables``: ``torch.cuda.make_graphed_callables(block, (x,))``;
- ``graphmodule``: ``CudaGraphModule(block)`` (results and input gradients are copies);
- ``graphmodule_static``: ``CudaGraphModule(block, outputs="static")`` (the graph's buffers).

Rounds of ``--calls`` back-to-back calls with one synchronisation at the end, variants
interleaved round by round (so drift falls on all); prints the median µs per call as a
markdown table, and the largest difference of the gradients from eager's, after one call and
after two calls accumulating into ``.grad`` (not zeroed between them). Without
CUDA it runs a small smoke check on CPU (eager and graphmodule's simulated backend).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from graphmodule import CudaGraphModule  # noqa: E402


def block_of(width: int, device) -> nn.Module:
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, width)).to(device)


def variants(width: int, batch: int, device, cuda: bool) -> dict:
    """name -> (block, callable); every block a copy of one initialisation."""
    torch.manual_seed(0)
    base = block_of(width, device)
    out = {"eager": (base, base)}
    if cuda:
        mgc = copy.deepcopy(base)
        sample = torch.randn(batch, width, device=device, requires_grad=True)
        out["make_graphed_callables"] = (mgc, torch.cuda.make_graphed_callables(mgc, (sample,)))
    backend = "cuda" if cuda else "simulate"
    gm = copy.deepcopy(base)
    out["graphmodule"] = (gm, CudaGraphModule(gm, backend=backend))
    gs = copy.deepcopy(base)
    out["graphmodule_static"] = (gs, CudaGraphModule(gs, outputs="static", backend=backend))
    return out


def step(block: nn.Module, call, x: torch.Tensor, gy: torch.Tensor) -> None:
    x.grad = None
    for p in block.parameters():
        p.grad = None
    call(x).backward(gy)


def grads_of(block, call, x, gy, calls: int) -> list[torch.Tensor]:
    """Gradients after ``calls`` calls accumulating into ``.grad`` (None before the first)."""
    step(block, call, x, gy)
    for n in range(1, calls):
        call(x).backward(gy * (n + 1))  # another gradient each call: an aliased .grad shows
    return [x.grad.clone()] + [p.grad.clone() for p in block.parameters()]


def measure(width: int, batch: int, rounds: int, calls: int, device, cuda: bool) -> dict:
    runs = variants(width, batch, device, cuda)
    x = torch.randn(batch, width, device=device, requires_grad=True)
    gy = torch.randn(batch, width, device=device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for block, call in runs.values():  # warmup, capture, and a few replays
        for _ in range(5):
            step(block, call, x, gy)
    diffs: dict[str, list[float]] = {name: [] for name in runs}
    for calls_ in (1, 2):  # one call; two calls accumulating into .grad (not zeroed between)
        reference = grads_of(*runs["eager"], x, gy, calls_)
        for name, (block, call) in runs.items():
            got = grads_of(block, call, x, gy, calls_)
            diffs[name].append(max((a - b).abs().max().item() for a, b in zip(got, reference)))
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, (block, call) in runs.items():
            sync()
            start = time.perf_counter()
            for _ in range(calls):
                step(block, call, x, gy)
            sync()
            times[name].append((time.perf_counter() - start) / calls * 1e6)
    return {name: (statistics.median(t), diffs[name]) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--sizes", nargs="*", default=["1x64", "32x256", "256x1024"],
                        help="BATCHxWIDTH of the block's input (a 3-layer MLP of that width)")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if not cuda:
        print("CUDA is not available: a smoke run on CPU (simulated graphs; timings mean nothing).")
        args.rounds, args.calls, args.sizes = 2, 3, args.sizes[:1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = []
        for size in args.sizes:
            batch, width = (int(v) for v in size.split("x"))
            rows.append((size, measure(width, batch, args.rounds, args.calls, device, cuda)))
    names = list(rows[0][1])
    where = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"\nForward + backward of a 3-layer MLP block per call, median µs ({where}, torch {torch.__version__}, "
          f"{args.rounds} rounds of {args.calls} calls)\n")
    print("| batch x width | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for size, result in rows:
        print(f"| {size} | " + " | ".join(f"{result[n][0]:.1f}" for n in names) + " |")
    print("\nLargest difference of the gradients (input and parameters) from eager's, after one call / "
          "after two calls accumulating into .grad:\n")
    print("| batch x width | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for size, result in rows:
        print(f"| {size} | " + " | ".join(f"{result[n][1][0]:.1e} / {result[n][1][1]:.1e}" for n in names) + " |")


if __name__ == "__main__":
    main()
