"""Where a replay's host time goes on the GPU (batch-1 policy), two ways:

- ``steps``: each step of one replay timed alone, default and static outputs: the whole call,
  the wrapper's checks, the entry's replay and its parts (host µs per call, no synchronisation
  inside the timed loop, median of 7 x 5 000 calls);
- ``lookup``: the cost of finding a call's graph among several (``max_graphs``): 1, 2 or 4
  signatures (batch 1, 2, 4, 8) in turn, against hand-captured graphs copied and replayed in the
  same turns, the floor (µs per call, median of 7 x 2 000 calls).

    python scripts/replay_steps.py [steps|lookup]...   (default: both)
"""

import itertools
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "benchmarks"), ROOT]

import torch  # noqa: E402
from profile_hot_path import per_call  # noqa: E402
from workloads import WORKLOADS, capture_by_hand  # noqa: E402

from graphmodule import CudaGraphModule  # noqa: E402

case = WORKLOADS["policy_b1"](torch.device("cuda"))
x = case.args[0]


def steps() -> None:
    for mode in ("safe", "static"):
        g = CudaGraphModule(case.fn, warmup=2, outputs=mode)
        for _ in range(4):
            g(x)
        e = g._entries[0]
        leaves, objs = e.spec.match((x,), {})
        lender = e.plan.lender
        rows = [("g(x)", lambda: g(x)),
                ("entry.replay", lambda: e.replay(leaves, objs, ((x,), {}))),
                ("entry._replay", lambda: e._replay(leaves, objs, ((x,), {}))),
                ("copy_from", lambda: e.inputs.copy_from(leaves)),
                ("runner.replay", lambda: e.runner.replay(e.handle)),
                ("graph.replay", lambda: e.handle.replay()),
                ("match", lambda: e.spec.match((x,), {})), ("mode", g._mode.read), ("watch", e.watch.check)]
        if lender is not None:
            rows += [("lender.busy", lender.busy), ("lender.single", lender.single)]
        for label, fn in rows:
            fn()
            print(f"{mode:6s} {label:14s} {per_call(fn, 5000, wait=False):7.2f} us host")


def lookup() -> None:
    xs = [torch.randn(b, *x.shape[1:], device="cuda") for b in (1, 2, 4, 8)]
    graphs = []
    for each in xs:
        static = each.clone()
        graph, _ = capture_by_hand(case.fn, (static,))
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


if __name__ == "__main__":
    with torch.no_grad():
        for what in sys.argv[1:] or ["steps", "lookup"]:
            {"steps": steps, "lookup": lookup}[what]()
