"""Why one wrapper's real-program steps/s differ from the other's: a GPU diagnosis.

    python scripts/program_diag.py td3 --pairs 3 --steps 1700

In one process, runs the program with tensordict's wrapper and graphmodule's in ABBA order
(so neither always runs second) and reports per run: wall seconds of the measured part, the
garbage collector's collections and time inside the measured part (``gc.callbacks``), the
caching allocator's device mallocs, the slowest iterations, and (one short run each, with
``torch.cuda.set_sync_debug_mode``) the host syncs each wrapper's calls cause. ``--no-gc``
repeats the pairs with the collector off during the measured part.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "tests")):
    if path not in sys.path:
        sys.path.insert(0, path)

import torch  # noqa: E402

from programs import common  # noqa: E402
from programs.common import make_wrap  # noqa: E402

RUNNERS = {"td3": ("td3", "run_td3"), "sac": ("sac", "run_sac"), "ppo_tdmodule": ("ppo", "run_ppo")}


class GcMeter:
    def __init__(self) -> None:
        self.on = False
        self.t0 = 0.0
        self.times = {0: [], 1: [], 2: []}
        gc.callbacks.append(self)

    def __call__(self, phase: str, info: dict) -> None:
        if not self.on:
            return
        if phase == "start":
            self.t0 = time.perf_counter()
        else:
            self.times[info["generation"]].append(time.perf_counter() - self.t0)


def patch_clock(ticks: list, meter: GcMeter, no_gc: list) -> None:
    begin, stop, tick = common.Clock.begin, common.Clock.stop, common.Clock.tick

    def begin_(self):
        begin(self)
        ticks.clear()
        meter.on = True
        if no_gc[0]:
            gc.disable()

    def tick_(self, n):
        tick(self, n)
        if self.start is not None:
            ticks.append(time.perf_counter())

    def stop_(self, unit):
        out = stop(self, unit)
        meter.on = False
        gc.enable()
        return out

    common.Clock.begin, common.Clock.tick, common.Clock.stop = begin_, tick_, stop_


def one(program: str, wrapper: str, steps: int, meter: GcMeter, ticks: list) -> dict:
    import importlib

    module, fn = RUNNERS[program]
    run = getattr(importlib.import_module(f"programs.{module}"), fn)
    for g in meter.times.values():
        g.clear()
    mallocs0 = torch.cuda.memory_stats().get("num_device_alloc", 0)
    config = dict(steps=steps, learning_starts=100) if program != "ppo_tdmodule" else dict(steps=steps, variant="tdmodule")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = run(make_wrap(wrapper), device="cuda", seed=0, **config)
    timing = result["timing"]
    gaps = sorted((b - a for a, b in zip(ticks, ticks[1:])), reverse=True)
    out = {
        "wrapper": wrapper,
        "seconds": timing["seconds"],
        "iters": len(ticks),
        "median_iter_us": statistics.median(gaps) * 1e6 if gaps else float("nan"),
        "slowest_ms": [round(g * 1e3, 2) for g in gaps[:5]],
        "gc": {g: (len(t), round(sum(t) * 1e3, 2)) for g, t in meter.times.items()},
        "device_mallocs": torch.cuda.memory_stats().get("num_device_alloc", 0) - mallocs0,
    }
    del result
    gc.collect()
    torch.cuda.empty_cache()
    return out


def syncs(program: str, wrapper: str) -> int:
    """Host syncs warned by the sync debug mode inside the wrapped calls of a short run."""
    import importlib

    module, fn = RUNNERS[program]
    run = getattr(importlib.import_module(f"programs.{module}"), fn)
    wrap = make_wrap(wrapper)
    count = [0, 0]

    def counting(f, **kw):
        w = wrap(f, **kw)

        def call(*a, **k):
            count[1] += 1
            if count[1] > 60:  # past warmup and capture
                torch.cuda.set_sync_debug_mode("warn")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    return w(*a, **k)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
                    count[0] += sum("synchroniz" in str(c.message) for c in caught)
        return call

    counting.built = wrap.built
    config = dict(steps=300, learning_starts=100) if program != "ppo_tdmodule" else dict(steps=4, variant="tdmodule")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run(counting, device="cuda", seed=0, **config)
    return count[0], count[1]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("program", choices=sorted(RUNNERS))
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--steps", type=int, default=1700)
    p.add_argument("--no-gc", action="store_true")
    args = p.parse_args()
    meter, ticks = GcMeter(), []
    for wrapper in ("tensordict", "graphmodule"):
        n, calls = syncs(args.program, wrapper)
        print(f"syncs inside wrapped calls, {wrapper}: {n} over {calls} calls", flush=True)
    gc_off = [False]
    patch_clock(ticks, meter, gc_off)
    for no_gc in ((False, True) if args.no_gc else (False,)):
        gc_off[0] = no_gc
        order = []
        for i in range(args.pairs):
            order += ["tensordict", "graphmodule"] if i % 2 == 0 else ["graphmodule", "tensordict"]
        runs = [one(args.program, w, args.steps, meter, ticks) for w in order]
        for r in runs:
            print(f"{'gc off' if no_gc else 'gc on '} {r}", flush=True)
        for w in ("tensordict", "graphmodule"):
            s = [r["seconds"] for r in runs if r["wrapper"] == w]
            print(f"{'gc off' if no_gc else 'gc on '} {w}: seconds {[round(x, 3) for x in s]} median "
                  f"{statistics.median(s):.3f}", flush=True)


if __name__ == "__main__":
    main()
