"""Where a replay's microseconds go (GPU): each step of the hot path timed alone, and cProfile.

Usage: python benchmarks/profile_hot_path.py [--calls N]
Prints per-call wall time (CPU-bound loops, one sync at the end) of:
floor pieces (copy, replay, clone), graphmodule's steps, and the top of a cProfile.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

from workloads import WORKLOADS  # noqa: E402

from graphmodule import CudaGraphModule  # noqa: E402


def per_call(fn, calls, repeats=7, wait=True):
    """Median microseconds per call; ``wait=False``: host time only (stop the clock before
    waiting for the GPU), the launch cost."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        if wait:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--workloads", default="tiny_fn,policy_b1,policy_td_b1,nested_td_12leaves_b64,many_leaves_td_64")
    args = parser.parse_args()
    n = args.calls
    for name in args.workloads.split(","):
        case = WORKLOADS[name](torch.device("cuda"))
        print(f"\n== {name}")
        with torch.no_grad():
            leaves = [a for a in case.args if isinstance(a, torch.Tensor)]
            rows = []
            if leaves and not case.kwargs:
                static = [x.clone() for x in leaves]
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(3):
                        case.fn(*static)
                torch.cuda.current_stream().wait_stream(s)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    out = case.fn(*static)
                rows += [
                    ("replay only", lambda: graph.replay()),
                    ("foreach_copy_ only", lambda: torch._foreach_copy_(static, leaves)),
                    ("copy_ only", lambda: static[0].copy_(leaves[0])),
                    ("clone only", lambda: out.clone()),
                    ("floor: foreach_copy_+replay", lambda: (torch._foreach_copy_(static, leaves), graph.replay())),
                    ("floor: copy_+replay", lambda: (static[0].copy_(leaves[0]), graph.replay())),
                    ("floor + clone", lambda: (torch._foreach_copy_(static, leaves), graph.replay(), out.clone())),
                    ("floor + empty_like+copy_", lambda: (torch._foreach_copy_(static, leaves), graph.replay(), torch.empty_like(out).copy_(out))),
                ]
            for mode in ("clone", "static"):
                g = CudaGraphModule(case.fn, warmup=2, outputs=mode)
                for _ in range(4):
                    g(*case.args)
                rows.append((f"graphmodule {mode}", lambda g=g: g(*case.args)))
            for label, fn in rows:
                fn()
                print(f"  {label:34s} wall {per_call(fn, n):7.2f} us   host {per_call(fn, n, wait=False):7.2f} us")
            g = CudaGraphModule(case.fn, warmup=2)
            for _ in range(4):
                g(*case.args)
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(20000):
                g(*case.args)
            prof.disable()
            torch.cuda.synchronize()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(12)
            print("\n".join(line for line in buf.getvalue().splitlines()[4:24] if line.strip()))


if __name__ == "__main__":
    main()
