"""The cost of finding a call's graph among several (max_graphs): a batch-1 policy called with
1, 2 or 4 signatures (batch 1, 2, 4, 8) in turn, against hand-captured graphs copied and
replayed in the same turns (the floor). GPU only; µs per call, median of 7 x 2 000 calls.

    python scripts/lookup_probe.py
"""

import itertools
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "benchmarks"), ROOT]

import torch  # noqa: E402
from profile_hot_path import per_call  # noqa: E402
from workloads import WORKLOADS  # noqa: E402

from graphmodule import CudaGraphModule  # noqa: E402

case = WORKLOADS["policy_b1"](torch.device("cuda"))
x = case.args[0]


with torch.no_grad():
    xs = [torch.randn(b, *x.shape[1:], device="cuda") for b in (1, 2, 4, 8)]
    graphs = []
    for each in xs:
        static = each.clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                case.fn(static)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            case.fn(static)
        graphs.append((graph, static, each))
    for k in (1, 2, 4):
        it = itertools.cycle(graphs[:k])

        def floor():
            graph, static, each = next(it)
            static.copy_(each)
            graph.replay()
        print(f"floor {k} graphs in turn: {per_call(floor, 2000):.2f} us")
    g = CudaGraphModule(case.fn, warmup=2, max_graphs=4)
    for _ in range(6):
        for each in xs:
            g(each)
    for k in (1, 2, 4):
        it = itertools.cycle(xs[:k])
        print(f"graphmodule {k} in turn: {per_call(lambda: g(next(it)), 2000):.2f} us")
    print(g.stats)
