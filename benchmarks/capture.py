"""What capturing costs: the time of each kind of capture, and the memory of many graphs.

For an MLP policy (batch 1, under ``no_grad``), a SAC update step and a PPO minibatch update
(both with Adam, stepped inside the graph), on a CUDA GPU:

- *time*: the call that captures, wall time with the GPU synchronised, median of ``--repeats``
  fresh wrappers: the first capture; a capture after a module's parameter was replaced
  (``on_stale="recapture"``); a second output set (the call made while the first call's
  results are held, ``outputs="safe"``); a second signature (``max_graphs=2``, another batch
  size). Beside them, CUDA's own cost: the same function captured by hand
  (``CUDAGraph.capture_begin``/``capture_end`` and one replay, no collector run).
- *memory*: the device memory of 1, 4 and 16 graphs (batch sizes 1, 2, 4, ... one each) held by one wrapper
  (``max_graphs=k``, one pool) against k wrappers (k pools): reserved and allocated after the
  captures minus before, and the pools' size (``stats.pool_bytes``).

    python benchmarks/capture.py [--repeats 5] [--out DIR]        # on a GPU
    python benchmarks/capture.py --smoke                          # anywhere (simulated; numbers mean nothing)

Writes ``DIR/capture.json`` (what ``report.py`` reads).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from typing import Any, Callable

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
from graphmodule import CudaGraphModule  # noqa: E402
from report import CAPTURE_WORKLOADS, capture_table  # noqa: E402  (no torch there)
from workloads import OBS, mlp, ppo_update, sac_update  # noqa: E402

WORKLOADS = tuple(CAPTURE_WORKLOADS)


def build(name: str, device, batch: int | None = None):
    """(fn, args, grad, module) for a workload: ``module`` is one whose parameter a recapture replaces."""
    if name == "policy":
        net = mlp(device, 1)
        return net, (torch.randn(batch or 1, OBS, device=device),), False, net
    case = sac_update(device, batch or 256) if name == "sac" else ppo_update(device, batch or 64)
    return case.fn, case.args, True, case.fn.replaceable


def resized(args: tuple, batch: int) -> tuple:
    return tuple(a[:1].expand(batch, *a.shape[1:]).clone() for a in args)


class Clock:
    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def time(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        self.sync()
        start = time.perf_counter()
        out = fn()
        self.sync()
        return time.perf_counter() - start, out


def by_hand(fn, args, grad: bool, clock: Clock) -> float:
    """CUDA's own cost: warmup on a side stream, then capture_begin → fn → capture_end → replay."""
    with torch.enable_grad() if grad else torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn(*args)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()

        def capture():
            with torch.cuda.stream(side):
                graph.capture_begin()
                try:
                    fn(*args)
                finally:
                    graph.capture_end()
            torch.cuda.current_stream().wait_stream(side)
            graph.replay()

        return clock.time(capture)[0]


def capture_times(name: str, device, backend: str, clock: Clock, profile: bool = False) -> dict[str, float]:
    """Seconds of each kind of capturing call, on fresh wrappers of a fresh workload."""
    out: dict[str, float] = {}
    if backend == "cuda":
        fn, args, grad, _ = build(name, device)
        out["hand"] = by_hand(fn, args, grad, clock)
    fn, args, grad, module = build(name, device)
    g = CudaGraphModule(fn, warmup=2, on_stale="recapture", max_graphs=2, backend=backend)

    def capturing(*call_args) -> tuple[float, Any]:
        """Calls until one captures: that call's seconds and result (warmup calls untimed)."""
        for _ in range(8):
            before = g.stats.captures
            seconds, result = clock.time(lambda: g(*call_args))
            if g.stats.captures > before:
                return seconds, result
        raise AssertionError(f"no capture in 8 calls: {g.stats}")

    with torch.enable_grad() if grad else torch.no_grad():
        if profile:  # where the first capture's host time goes, CUDA's calls included
            import cProfile
            import pstats

            with cProfile.Profile() as prof:
                out["first"], held = capturing(*args)
            print(f"\n{name}: the first capturing call, by own time")
            pstats.Stats(prof).sort_stats("tottime").print_stats(18)
        else:
            out["first"], held = capturing(*args)
        twins = g.stats.twin_captures
        out["output_set"], _ = clock.time(lambda: g(*args))  # `held` is alive: another output set
        assert g.stats.twin_captures == twins + 1, g.stats
        del held
        weight = next(module.parameters())
        path = next(n for n, p in module.named_parameters() if p is weight)
        owner = module.get_submodule(path.rpartition(".")[0])
        setattr(owner, path.rpartition(".")[2], nn.Parameter(weight.detach().clone()))
        out["recapture"], _ = capturing(*args)
        assert g.stats.recaptures == 1, g.stats
        out["signature"], _ = capturing(*resized(args, 2 * args[0].shape[0]))
        assert g.stats.graphs == 2, g.stats
    return out


def memory(name: str, k: int, shared: bool, device, backend: str, clock: Clock) -> dict:
    fn, args, grad, _ = build(name, device)
    inputs = [resized(args, 2 ** i) for i in range(k)]
    clock.sync()
    if backend == "cuda":
        torch.cuda.empty_cache()
    before = (torch.cuda.memory_reserved(), torch.cuda.memory_allocated()) if backend == "cuda" else (0, 0)
    wrappers = ([CudaGraphModule(fn, warmup=1, max_graphs=k, backend=backend)] * k if shared
                else [CudaGraphModule(fn, warmup=1, backend=backend) for _ in range(k)])
    with torch.enable_grad() if grad else torch.no_grad():
        for g, x in zip(wrappers, inputs):
            for _ in range(2):
                g(*x)
    clock.sync()
    after = (torch.cuda.memory_reserved(), torch.cuda.memory_allocated()) if backend == "cuda" else (0, 0)
    unique = {id(g): g for g in wrappers}.values()
    return {"workload": name, "k": k, "shared": shared, "reserved_mib": (after[0] - before[0]) / 2**20,
            "allocated_mib": (after[1] - before[1]) / 2**20,
            "pool_mib": sum(g.stats.pool_bytes for g in unique) / 2**20,
            "graphs": sum(g.stats.graphs for g in unique)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="fresh wrappers per capture time (median)")
    parser.add_argument("--graphs", default="1,4,16", help="graph counts of the memory rows")
    parser.add_argument("--out", default=None)
    parser.add_argument("--profile", action="store_true", help="print a profile of each first capture")
    parser.add_argument("--smoke", action="store_true", help="simulated backend, one repeat, small counts")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.smoke
    if not cuda and not args.smoke:
        print("capture.py needs a CUDA GPU (or --smoke); nothing measured.")
        return 0
    backend, device = ("cuda", torch.device("cuda")) if cuda else ("simulate", torch.device("cpu"))
    clock = Clock(cuda)
    repeats = 1 if args.smoke else args.repeats
    counts = [1, 2] if args.smoke else [int(k) for k in args.graphs.split(",")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        times = {}
        for name in WORKLOADS:
            runs = [capture_times(name, device, backend, clock, args.profile and i == 0) for i in range(repeats)]
            times[name] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        memory("policy", 1, True, device, backend, clock)  # (the process's first allocations: not counted)
        mem = [memory(name, k, shared, device, backend, clock)
               for name in WORKLOADS for k in counts for shared in (True, False)]
    result = {"times": times, "memory": mem, "repeats": repeats}
    print("Capture time, ms (median of %d):\n" % repeats + capture_table(result))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "capture.json"), "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
