"""Where a replay's microseconds go (GPU): each step of the hot path timed alone, and cProfile.

Usage: python benchmarks/profile_hot_path.py [--calls N]
Prints per-call wall time (CPU-bound loops, one sync at the end) of:
floor pieces (copy, replay, clone), graphmodule's steps, and the top of a cProfile.
File names in the profile are written relative to the repository (``graphmodule/...``)
or to the install folders (``<site-packages>/torch/...``, ``<stdlib>/...``), so that the
output names no folder of the machine that ran it.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import os
import pstats
import re
import site
import statistics
import sys
import sysconfig
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE, ROOT]

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


def _path_labels() -> dict[str, str]:
    """Absolute folder -> what to write instead: the repository, the stdlib, install folders."""
    labels: dict[str, str] = {}

    def add(path, label):
        if path and os.path.isabs(path):
            for variant in {os.path.abspath(path), os.path.realpath(path)}:
                if variant.rstrip(os.sep):  # never the file system's root itself
                    labels.setdefault(variant.rstrip(os.sep) + os.sep, label)

    for key in ("stdlib", "platstdlib"):
        add(sysconfig.get_paths().get(key), "<stdlib>/")
    user_site = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    for path in [*site.getsitepackages(), user_site, *sys.path]:
        if not path:
            continue
        inside_repo = os.path.abspath(path).startswith(ROOT + os.sep) or os.path.abspath(path) == ROOT
        if inside_repo and "-packages" not in path:
            continue  # the repository's own folders: relative to it, below
        # any other import root (site-packages, a PYTHONPATH --target folder) holds packages
        add(path, "<site-packages>/")
    add(ROOT, "")
    add(os.path.expanduser("~"), "~/")
    return labels


def portable_paths(text: str, labels: dict[str, str] | None = None) -> str:
    """``text`` with the absolute folders of this machine replaced (the longest first)."""
    labels = _path_labels() if labels is None else labels
    if not labels:
        return text
    prefixes = sorted(labels, key=len, reverse=True)
    pattern = re.compile("|".join(map(re.escape, prefixes)))
    return pattern.sub(lambda m: labels[m.group(0)], text)


def profile_text(fn, args: tuple, calls: int, top: int = 12) -> str:
    """The top ``top`` functions by own time over ``calls`` calls of ``fn(*args)``, with
    portable paths."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn(*args)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    lines = buf.getvalue().splitlines()[4 : 12 + top]
    return portable_paths("\n".join(line for line in lines if line.strip()))


def lookup_rows(case) -> list:
    """A wrapper holding several graphs (``max_graphs``), called with one signature, with two
    alternating and with four in turn (batch 1, 2, 4, 8 of the workload's one tensor), per
    call; and the floor for alternating: two hand-captured graphs, copy+replay each."""
    if case.kwargs or len(case.args) != 1 or not isinstance(case.args[0], torch.Tensor):
        return []
    x = case.args[0]
    xs = [torch.randn(b, *x.shape[1:], device=x.device, dtype=x.dtype) for b in (1, 2, 4, 8)]
    g = CudaGraphModule(case.fn, warmup=2, max_graphs=4)
    for _ in range(4):
        for each in xs:
            g(each)
    graphs = []
    for each in xs[:2]:
        static = each.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            case.fn(static)
        graphs.append((graph, static, each))
    turn = [0]

    def floor_two():
        graph, static, each = graphs[turn[0] & 1]
        turn[0] += 1
        static.copy_(each)
        graph.replay()

    def cycling(seq):
        it = itertools.cycle(seq)
        return lambda: g(next(it))

    return [
        ("floor: 2 graphs alternating", floor_two),
        ("max_graphs=4, one signature", lambda: g(xs[0])),
        ("max_graphs=4, 2 alternating", cycling(xs[:2])),
        ("max_graphs=4, 4 in turn", cycling(xs)),
    ]


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
            for mode in ("safe", "static", "clone"):
                g = CudaGraphModule(case.fn, warmup=2, outputs=mode)
                for _ in range(4):
                    g(*case.args)
                rows.append((f"graphmodule {mode}", lambda g=g: g(*case.args)))
            rows += lookup_rows(case)
            for label, fn in rows:
                fn()
                print(f"  {label:34s} wall {per_call(fn, n):7.2f} us   host {per_call(fn, n, wait=False):7.2f} us")
            g = CudaGraphModule(case.fn, warmup=2)
            for _ in range(4):
                g(*case.args)
            text = profile_text(g, case.args, 20000)
            torch.cuda.synchronize()
            print(text)


if __name__ == "__main__":
    main()
