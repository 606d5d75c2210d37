"""The compiled hot path against the Python one and the floor, in one process (#8).

Usage: python benchmarks/native_bench.py [--calls N] [--rounds R] [--out DIR]

For the tiny graph and the batch-1 policy (``workloads.py``), in alternating rounds:
``floor`` (the hand-written copy+replay loop), graphmodule's default outputs through the
Python path, and the same wrapper through the compiled path (``enable_native``), then the
same two with ``outputs="static"``. Each result is held until the next call returns, as
``out = g(x)`` in a loop holds it. Wall µs per call (one synchronisation per round),
median over the rounds; ratios to the floor of the same rounds. Needs CUDA.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

from workloads import WORKLOADS, hand_floor  # noqa: E402

import graphmodule  # noqa: E402
from graphmodule import CudaGraphModule, _native  # noqa: E402


def per_call(fn, calls: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = None
    for _ in range(calls):
        out = fn()  # noqa: F841 (held until the next call returns)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", default=None)
    a = parser.parse_args()
    if not graphmodule.enable_native():
        raise SystemExit("the compiled hot path could not be built")
    lines = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}: wall µs per call, median of "
             f"{a.rounds} alternating rounds of {a.calls} calls, each result held",
             "", "| workload | floor | default, Python | default, compiled | static, Python | static, compiled |",
             "|---|---:|---:|---:|---:|---:|"]
    for name in ("tiny_fn", "policy_b1"):
        case = WORKLOADS[name](torch.device("cuda"))
        with torch.no_grad():
            floor = hand_floor(case)
            wrappers = {o: CudaGraphModule(case.fn, warmup=case.warmup, outputs=o) for o in ("safe", "static")}
            kinds = {"floor": (floor, None, None)}
            for o, g in wrappers.items():
                call = (lambda g=g: g(*case.args))
                kinds[f"{o} python"] = (call, False, g)
                kinds[f"{o} native"] = (call, True, g)
            times: dict[str, list[float]] = {k: [] for k in kinds}
            served: dict[str, int] = {}
            for r in range(a.rounds + 1):
                for k, (fn, native, g) in kinds.items():
                    if native is True:
                        graphmodule.enable_native()
                    elif native is False:
                        _native.disable_native()
                    for _ in range(50):  # (warm up, capture, re-arm)
                        out = fn()
                    del out
                    t = per_call(fn, a.calls)
                    if r:
                        times[k].append(t)
                    if native is True:  # the calls it served, of the round's 50 + calls
                        served[k] = _native.served(g._hot) if g._hot else 0
            _native.disable_native()
        med = {k: statistics.median(v) for k, v in times.items()}
        f = med["floor"]
        cells = [f"{med[k]:.2f} ({med[k] / f:.2f}x)" for k in ("safe python", "safe native", "static python",
                                                                 "static native")]
        lines.append(f"| {name} | {f:.2f} | " + " | ".join(cells) + " |")
        lines.append(f"<!-- {name}: calls the compiled path served in its last round (of {a.calls + 50}): {served} -->")
    text = "\n".join(lines)
    print(text)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "native_bench.md"), "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
