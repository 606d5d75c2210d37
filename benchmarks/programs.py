"""Real programs through three wrappers: throughput, and where a step's time goes.

    python benchmarks/programs.py --out results/programs            # on a GPU
    python benchmarks/programs.py --smoke --out /tmp/programs       # tiny sizes, anywhere

The programs are those of ``tests/programs`` (PPO with a closure update or a
TensorDictModule update, SAC, TD3, a no-argument train step, the same compiled), each run
with no wrapper (``eager``), ``tensordict.nn.CudaGraphModule`` and
``graphmodule.CudaGraphModule``, only the wrapper changing. Runs alternate between the
wrappers, ``--rounds`` times, in one process; the table gives the median steps/s of the
measured part of each run (after warmup, compilation and capture).

One more run per wrapper is instrumented: every call of a wrapped function is timed on the
host (``perf_counter`` around the call) and on the GPU (CUDA events around it: the span of
the caller's stream from the call's first to its last work, idle gaps included, so a
host-bound eager call shows about its host time). Those times are shown per step and as
shares of the step's wall time: how much of a step the wrapped calls take, for each wrapper.

A failing run (e.g. a wrapper that refuses a program's calling convention) is recorded with
its error and the others go on; ``--strict`` exits with status 1 if any run failed. Without
CUDA, graphmodule uses its simulated backend and tensordict runs eagerly: the numbers mean
nothing then, the point is that the script keeps working (``--smoke`` in CI).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import platform
import statistics
import sys
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "tests")):  # graphmodule, examples; the programs package
    if path not in sys.path:
        sys.path.insert(0, path)

import torch  # noqa: E402

from programs import ppo, sac, td3, train_step  # noqa: E402
from programs.common import WRAPPERS, make_wrap  # noqa: E402

RUNNERS = {
    "ppo_closure": ppo.run_ppo,
    "ppo_tdmodule": ppo.run_ppo,
    "sac": sac.run_sac,
    "td3": td3.run_td3,
    "train_step": train_step.run_train_step,
    "train_step_compiled": train_step.run_train_step,
}
# GPU sizes: near the published defaults, a few seconds per eager run.
FULL = {
    "ppo_closure": dict(steps=6, variant="closure"),
    "ppo_tdmodule": dict(steps=6, variant="tdmodule"),
    "sac": dict(steps=700, learning_starts=100),
    "td3": dict(steps=700, learning_starts=100),
    "train_step": dict(steps=400),
    "train_step_compiled": dict(steps=400, compile=True),
}
# --smoke: tiny sizes, as in the CPU tests (compiled with dynamo's eager backend: no build).
SMOKE = {
    "ppo_closure": dict(steps=3, variant="closure", num_envs=4, rollout=8, minibatch=16, epochs=2, hidden=32,
                        max_episode_steps=10),
    "ppo_tdmodule": dict(steps=3, variant="tdmodule", num_envs=4, rollout=8, minibatch=16, epochs=2, hidden=32,
                         max_episode_steps=10),
    "sac": dict(steps=24, num_envs=4, learning_starts=8, batch_size=16, hidden=32, burnin=4),
    "td3": dict(steps=24, num_envs=4, learning_starts=8, batch_size=16, hidden=32, burnin=4),
    "train_step": dict(steps=12, batch_size=32, hidden=32),
    "train_step_compiled": dict(steps=12, batch_size=32, hidden=32, compile=True, compile_backend="eager"),
}


class Meter:
    """Host and GPU time of every call of the wrapped functions of one run."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.calls: list[tuple] = []  # (t0, t1, start event, end event)

    def summary(self, t_start: float, t_end: float) -> dict:
        calls = [c for c in self.calls if c[0] >= t_start and c[1] <= t_end]
        host = sum(t1 - t0 for t0, t1, _, _ in calls)
        gpu = sum(e0.elapsed_time(e1) for _, _, e0, e1 in calls) / 1e3 if self.cuda else math.nan
        return {"calls": len(calls), "host_s": host, "gpu_s": gpu}


class Timed:
    def __init__(self, inner, meter: Meter) -> None:
        self.inner, self.meter = inner, meter

    def __call__(self, *args, **kwargs):
        meter = self.meter
        e0 = e1 = None
        if meter.cuda:
            e0 = torch.cuda.Event(enable_timing=True)
            e0.record()
        t0 = time.perf_counter()
        out = self.inner(*args, **kwargs)
        t1 = time.perf_counter()
        if meter.cuda:
            e1 = torch.cuda.Event(enable_timing=True)
            e1.record()
        meter.calls.append((t0, t1, e0, e1))
        return out


def instrumented(wrap, meter: Meter):
    def timed_wrap(fn, **kwargs):
        return Timed(wrap(fn, **kwargs), meter)

    timed_wrap.built = wrap.built
    return timed_wrap


def one_run(program: str, wrapper: str, config: dict, device, backend: str, profile: bool) -> dict:
    wrap = make_wrap(wrapper, backend=backend)
    meter = Meter(device.type == "cuda")
    if profile:
        wrap = instrumented(wrap, meter)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # compile chatter, tensordict's FutureWarnings
        result = RUNNERS[program](wrap, device=device, seed=0, **config)
    timing = result["timing"]
    if profile:
        timing.update(meter.summary(timing["t_start"], timing["t_end"]))
    del wrap, meter, result
    gc.collect()  # free the graphs (and their memory pools) before the next run
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return timing


def run_all(programs, rounds: int, device, backend: str, sizes: dict) -> dict:
    results = {p: {w: {"runs": [], "profile": None, "error": None} for w in WRAPPERS} for p in programs}
    for program in programs:
        for r in range(rounds + 1):  # the last round is the instrumented one
            profile = r == rounds
            for wrapper in WRAPPERS:
                entry = results[program][wrapper]
                if entry["error"]:
                    continue
                try:
                    timing = one_run(program, wrapper, sizes[program], device, backend, profile)
                except Exception as exc:  # noqa: BLE001 - recorded, the others go on
                    head = " / ".join(line.strip() for line in str(exc).strip().splitlines()[:2])
                    entry["error"] = f"{type(exc).__name__}: {head}"[:300]
                    print(f"  {program:20s} {wrapper:12s} FAILED {entry['error']}", flush=True)
                    continue
                if profile:
                    entry["profile"] = timing
                else:
                    entry["runs"].append(timing)
                kind = "profile" if profile else f"round {r + 1}"
                print(f"  {program:20s} {wrapper:12s} {kind:8s} {timing['steps_per_s']:12.1f} "
                      f"{timing['unit']}s/s", flush=True)
    for program in programs:
        for entry in results[program].values():
            runs = entry["runs"] or ([entry["profile"]] if entry["profile"] else [])  # --rounds 0
            rates = [t["steps_per_s"] for t in runs]
            entry["median_steps_per_s"] = statistics.median(rates) if rates else math.nan
    return results


def fmt(value: float, digits: int = 1) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:,.{digits}f}"


def table(results: dict) -> str:
    lines = [
        "| program | wrapper | steps/s (median) | vs eager | µs/step | host in wrapped µs/step (share) "
        "| GPU in wrapped µs/step (share) | wrapped calls/step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for program, by_wrapper in results.items():
        eager = by_wrapper["eager"]["median_steps_per_s"]
        for wrapper, entry in by_wrapper.items():
            if entry["error"] and not (entry["runs"] or entry["profile"]):
                lines.append(f"| {program} | {wrapper} | failed: {entry['error'].replace('|', '/')} | | | | | |")
                continue
            rate = entry["median_steps_per_s"]
            prof = entry["profile"] or {}
            steps, wall = prof.get("steps"), prof.get("seconds")
            per = (lambda s: s / steps * 1e6) if steps else (lambda s: math.nan)
            share = (lambda s: f" ({100 * s / wall:.0f}%)" if wall and math.isfinite(s) else "")
            host, gpu = prof.get("host_s", math.nan), prof.get("gpu_s", math.nan)
            calls = fmt(prof["calls"] / steps, 2) if steps else "—"
            step_us = fmt(per(wall) if wall else math.nan)
            lines.append(
                f"| {program} | {wrapper} | {fmt(rate)} | {fmt(rate / eager, 2)}x | {step_us} "
                f"| {fmt(per(host))}{share(host)} | {fmt(per(gpu))}{share(gpu)} | {calls} |")
    return "\n".join(lines)


def environment(device) -> dict:
    import graphmodule
    import tensordict

    info = {"python": platform.python_version(), "torch": torch.__version__, "tensordict": tensordict.__version__,
            "graphmodule": graphmodule.__version__, "device": str(device)}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for programs.json and programs.md")
    parser.add_argument("--rounds", type=int, default=3,
                        help="timed runs per wrapper and program, besides the instrumented one (0: that one only)")
    parser.add_argument("--programs", default=",".join(RUNNERS), help="comma-separated subset")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, the instrumented run only (CI)")
    parser.add_argument("--strict", action="store_true", help="exit 1 if any run failed")
    args = parser.parse_args(argv)
    programs = [p for p in args.programs.split(",") if p]
    unknown = set(programs) - set(RUNNERS)
    if unknown:
        parser.error(f"unknown programs {sorted(unknown)}; choose from {list(RUNNERS)}")
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    backend = "cuda" if cuda else "simulate"
    rounds = 0 if args.smoke else args.rounds
    logging.getLogger("tensordict").setLevel(logging.WARNING)  # its per-wrapper INFO lines
    if not cuda:
        torch.set_num_threads(1)  # tiny CPU workloads; far faster on a loaded machine
    print(f"{len(programs)} programs x {len(WRAPPERS)} wrappers x {rounds} rounds (+1 instrumented) on {device}"
          + ("" if cuda else " (no CUDA: graphmodule simulated, tensordict eager; timings mean nothing)"), flush=True)
    results = run_all(programs, rounds, device, backend, SMOKE if args.smoke else FULL)
    md = table(results)
    print("\n" + md)
    os.makedirs(args.out, exist_ok=True)
    record = {"environment": environment(device), "smoke": args.smoke, "rounds": rounds,
              "sizes": {p: (SMOKE if args.smoke else FULL)[p] for p in programs}, "results": results}
    with open(os.path.join(args.out, "programs.json"), "w") as f:
        json.dump(record, f, indent=1, default=str)
    with open(os.path.join(args.out, "programs.md"), "w") as f:
        f.write(md + "\n")
    failed = [(p, w) for p, by_w in results.items() for w, e in by_w.items() if e["error"]]
    if failed:
        print(f"\n{len(failed)} failed: " + ", ".join(f"{p}/{w}" for p, w in failed))
    return 1 if args.strict and failed else 0


if __name__ == "__main__":
    sys.exit(main())
