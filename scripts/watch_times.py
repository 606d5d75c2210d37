"""What the staleness watch costs per call in the real programs, and its parts.

    python scripts/watch_times.py td3 sac

Runs a short program with graphmodule (simulated on CPU), then times each wrapped
function's ``Watch.check`` and its parts: the identity pass over the watched places, the
closure cells, the address check of the distinct tensors. Host microseconds, best of 7
rounds of 20 000 calls (hot: the watch in the caches), and cold: the median of 400 calls,
each after a sweep of 32 MB and a few hundred torch ops (what a training loop does between
two calls of one wrapped function).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import timeit
import warnings
from operator import getitem, is_

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
warnings.simplefilter("ignore")

import torch  # noqa: E402

from graphmodule import _stale  # noqa: E402
from tests.programs import sac, td3  # noqa: E402
from tests.programs.common import make_wrap  # noqa: E402

RUNS = {"td3": td3.run_td3, "sac": sac.run_sac}


def best_us(fn, n: int = 20_000) -> float:
    return min(timeit.repeat(fn, number=n, repeat=7)) / n * 1e6


_SWEEP: list = []


def sweep() -> None:
    if not _SWEEP:
        _SWEEP.append(torch.ones(8_000_000))
        _SWEEP.append(torch.ones(64, device="cuda" if torch.cuda.is_available() else "cpu"))
    _SWEEP[0].add_(1.0)
    x = _SWEEP[1]
    for _ in range(100):
        x = x.mul(1.0).add(0.0).clamp(-1e9, 1e9)


def cold_us(fn, reps: int = 400) -> float:
    times = []
    for _ in range(reps):
        sweep()
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("programs", nargs="+", choices=sorted(RUNS))
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    print(f"torch {torch.__version__}, {'cuda' if cuda else 'cpu'}; address check: {_stale._same_addresses.__name__}")
    print("| program | fn | places | cells | tensors (distinct) | check | identity pass | cells pass | addresses "
          "| cold: check | identity pass | addresses | addresses (Python) | one address | nothing |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for program in args.programs:
        wrap = make_wrap("graphmodule", backend="cuda" if cuda else "simulate")
        RUNS[program](wrap, steps=300, device="cuda" if cuda else "cpu", seed=0)
        for w in wrap.built:
            w_ = w._entries[0].watch
            identity = lambda: all(map(is_, map(getitem, w_._containers, w_._keys), w_._place_objects))  # noqa: E731
            addresses = lambda: _stale._same_addresses(w_._tobjs, w_._tptrs, w_._tindex)  # noqa: E731
            one = ([w_._tobjs[0]], [w_._tptrs[0]], [0])
            parts = [
                best_us(w_.check), best_us(identity),
                best_us(lambda: all(map(is_, map(_stale._contents, w_._cells), w_._cell_objects))),
                best_us(addresses),
                cold_us(w_.check), cold_us(identity), cold_us(addresses),
                cold_us(lambda: _stale._data_ptrs_equal(w_._tobjs, w_._tptrs, w_._tindex)),
                cold_us(lambda: _stale._same_addresses(*one)), cold_us(lambda: None),
            ]
            name = getattr(w.module, "__name__", type(w.module).__name__)
            print(f"| {program} | {name} | {len(w_._containers)} | {len(w_._cells)} | {len(w_._tensors)} "
                  f"({len(w_._tobjs)}) | " + " | ".join(f"{p:.2f}" for p in parts) + " |")


if __name__ == "__main__":
    main()
