"""Each step of one replay, timed alone on the GPU host (batch-1 policy), for the default and
the static outputs: the whole call, the wrapper's checks, the entry's replay and its parts.
Host µs per call (no synchronisation inside the timed loop), median of 7 x 5 000 calls.

    python scripts/replay_steps.py
"""

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
    for mode in ("safe", "static"):
        g = CudaGraphModule(case.fn, warmup=2, outputs=mode)
        for _ in range(4):
            g(x)
        e = g._entries[0]
        leaves, objs = e.spec.match((x,), {})
        lender = e.plan.lender
        rows = [("g(x)", lambda: g(x)), ("_run", lambda: g._run((x,), {})),
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
