"""What outputs="safe" does per call in the benchmark's loop: first graph, twin, or a capture anew.

Usage: python scripts/lend_diag.py [WORKLOAD ...] [--backend cuda|simulate] [--rounds N]
Runs each workload's graphmodule variant (the default outputs, "safe") the way benchmarks/test_benchmarks.py does
(rounds of 200 calls, ``out = call()``, the previous round's result held while the next
round runs) and prints, per round, the time per call and how many calls replayed the first
graph, its twin, or asked the wrapper for fresh buffers (renew: a twin or a graph returning
copies captured). The graphmodule
logger runs at INFO, so a failed twin capture shows its reason.
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))
sys.path.insert(0, os.path.join(HERE, ".."))

import torch  # noqa: E402

import graphmodule._entry as entry_mod  # noqa: E402
import graphmodule._lend as lend  # noqa: E402
from graphmodule import CudaGraphModule  # noqa: E402
from workloads import WORKLOADS  # noqa: E402

counts: collections.Counter = collections.Counter()


def instrument() -> None:
    values, replay = lend.Lender.values, entry_mod.Entry._replay
    single = lend.Lender.single

    def counted_values(self):
        counts["lent"] += 1
        return values(self)

    def counted_single(self):
        counts["lent"] += 1
        return single(self)

    def counted_replay(self, *a):
        counts["twin" if getattr(self, "_is_twin", False) else "first"] += 1
        return replay(self, *a)

    lend.Lender.values, lend.Lender.single, entry_mod.Entry._replay = counted_values, counted_single, counted_replay


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("workloads", nargs="*", default=["tiny_fn", "policy_b1", "policy_td_b1"])
    p.add_argument("--backend", default="cuda" if torch.cuda.is_available() else "simulate")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--profile", action="store_true", help="torch.profiler table of one safe round")
    p.add_argument("--hold-round", type=int, default=1, help="hold the previous round's result (as pytest-benchmark)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="  log: %(message)s")
    logging.getLogger("graphmodule").setLevel(logging.INFO)
    instrument()
    device = torch.device("cuda" if args.backend == "cuda" else "cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for name in args.workloads:
        case = WORKLOADS[name](device)
        for outputs in ("static", "clone", "safe"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                g = CudaGraphModule(case.fn, warmup=case.warmup, outputs=outputs, backend=args.backend)
            call = lambda: g(*case.args, **case.kwargs)  # noqa: E731
            for _ in range(case.warmup + 3):
                call()
            sync()

            def many():
                out = None
                for _ in range(args.calls):
                    out = call()
                sync()
                return out

            result = many()
            print(f"{name} outputs={outputs}")
            for r in range(args.rounds):
                counts.clear()
                for e in g._entries:
                    for other in e.others:
                        other._is_twin = True
                t0 = time.perf_counter()
                got = many()
                dt = (time.perf_counter() - t0) / args.calls * 1e6
                result = got if args.hold_round else None
                print(f"  round {r}: {dt:6.1f} us/call  {dict(sorted(counts.items()))}")
            if args.profile and outputs == "safe":
                from torch.profiler import ProfilerActivity, profile

                acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
                with profile(activities=acts) as prof:
                    got = many()
                print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=18))
            print(f"  stats: twin_captures={g.stats.twin_captures} copy_recaptures={g.stats.copy_recaptures}")
            del result, got, g
            sync()


if __name__ == "__main__":
    main()
