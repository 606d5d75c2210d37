"""Where a real program's loop spends its host time outside the wrapped calls, per wrapper:
the env step, the replay buffer's write and sample, the soft updates, the garbage
collector; wrappers alternated run by run.

    python scripts/loop_sections.py td3 [--steps 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
import warnings
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
warnings.simplefilter("ignore")

import torch  # noqa: E402
from tensordict import TensorDictBase  # noqa: E402

from examples.envs import Pendulum  # noqa: E402
from tests.programs import common, sac, td3  # noqa: E402

RUNS = {"td3": td3, "sac": sac}
ACC: dict = defaultdict(float)
ON = [False]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def timer(fn, label: str):
    """``fn``, its time added to ``ACC[label]`` while the measured part runs."""

    def inner(*a, **k):
        if not ON[0]:
            return fn(*a, **k)
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            ACC[label] += time.perf_counter() - t0

    return inner


def timed(owner, name: str, label: str) -> None:
    setattr(owner, name, timer(getattr(owner, name), label))


def gc_timer(phase: str, info: dict) -> None:
    if not ON[0]:
        return
    if phase == "start":
        ACC["_gc_start"] = time.perf_counter()
    else:
        ACC[f"gc gen{info['generation']}"] += time.perf_counter() - ACC["_gc_start"]
        ACC[f"gc gen{info['generation']} count"] += 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("program", choices=sorted(RUNS))
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    mod = RUNS[args.program]
    timed(Pendulum, "step_and_maybe_reset", "env step")
    timed(mod, "store_transition", "store transition")
    timed(common.ReplayBuffer, "sample", "rb.sample")
    timed(TensorDictBase, "lerp_", "lerp_ (soft updates)")
    begin, stop = common.Clock.begin, common.Clock.stop

    def begin_(clock):
        begin(clock)
        ON[0] = True

    def stop_(clock, unit):
        ON[0] = False
        return stop(clock, unit)

    common.Clock.begin, common.Clock.stop = begin_, stop_
    gc.callbacks.append(gc_timer)
    rows: dict = defaultdict(lambda: defaultdict(list))
    for _ in range(args.rounds):
        for wrapper in ("tensordict", "graphmodule"):
            ACC.clear()
            wrap = common.make_wrap(wrapper)
            built = wrap.built

            def wrap_timed(fn, _wrap=wrap, **kw):
                inner = _wrap(fn, **kw)
                return timer(inner, f"call {len(built) - 1}")

            timing = getattr(mod, f"run_{args.program}")(wrap_timed, steps=args.steps, device=DEVICE, seed=0)["timing"]
            n = timing["steps"]
            rows[wrapper]["wall"].append(timing["seconds"] / n * 1e6)
            for k, v in ACC.items():
                if k.startswith("_"):
                    continue
                rows[wrapper][k].append(v / n * (1 if k.endswith("count") else 1e6))
            del wrap, built
            gc.collect()
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
    keys = sorted({k for r in rows.values() for k in r}, key=lambda k: (k != "wall", k))
    print(f"== {args.program}: µs per env step (median of {args.rounds} runs each, alternated; gc counts per env step)")
    print("| section | tensordict | graphmodule | gm - td |")
    print("|---|---|---|---|")
    for k in keys:
        td = statistics.median(rows["tensordict"].get(k, [0.0]))
        gm = statistics.median(rows["graphmodule"].get(k, [0.0]))
        print(f"| {k} | {td:.2f} | {gm:.2f} | {gm - td:+.2f} |")


if __name__ == "__main__":
    main()
