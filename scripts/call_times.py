"""Host time of every wrapped call inside a real program, as a distribution, per wrapper.

Means hide stalls that medians do not show (a host sync, a garbage collection, a full
launch queue): this prints, for each wrapped function of a program run with tensordict's
wrapper and with graphmodule, the number of calls and the median, mean, p90, p99 and
maximum host microseconds of a call (``perf_counter`` around it, no sync), measured in the
program's own loop. With ``--profile`` it also prints the CUDA runtime and aten events of
the measured steps per wrapped call (torch.profiler).

    python scripts/call_times.py td3 ppo_tdmodule sac [--profile]

Each (program, wrapper) runs in its own process: a failed capture cannot spoil the next.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

PROGRAMS = {
    "td3": ("td3", "run_td3", dict(steps=700, learning_starts=100)),
    "sac": ("sac", "run_sac", dict(steps=700, learning_starts=100)),
    "ppo_tdmodule": ("ppo", "run_ppo", dict(steps=8, variant="tdmodule")),
    "ppo_closure": ("ppo", "run_ppo", dict(steps=8, variant="closure")),
}


def child(program: str, wrapper: str, profile: bool) -> dict:
    warnings.simplefilter("ignore")
    import importlib

    import torch

    from tests.programs.common import make_wrap

    module, fn, kwargs = PROGRAMS[program]
    run = getattr(importlib.import_module(f"tests.programs.{module}"), fn)
    cuda = torch.cuda.is_available()
    base = make_wrap(wrapper, backend="cuda" if cuda else "simulate")
    times: dict[str, list[int]] = {}

    def wrap(f, **kw):
        inner = base(f, **kw)
        name = f"{len(base.built) - 1}:{getattr(f, '__name__', type(f).__name__)}"
        bucket = times.setdefault(name, [])

        def call(*a, **k):
            t0 = time.perf_counter_ns()
            out = inner(*a, **k)
            bucket.append(time.perf_counter_ns() - t0)
            return out

        return call

    wrap.built = base.built
    prof = None
    if profile:
        from torch.profiler import ProfilerActivity, profile as make_profile

        prof = make_profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []))
        prof.__enter__()
    result = run(wrap, device="cuda" if cuda else "cpu", seed=0, **kwargs)
    if prof is not None:
        torch.cuda.synchronize() if cuda else None
        prof.__exit__(None, None, None)
    out = {"steps_per_s": result["timing"]["steps_per_s"], "calls": {}}
    for name, ts in times.items():
        ts = ts[len(ts) // 4:]  # leave out warmup and capture
        if not ts:
            continue
        s = sorted(ts)
        q = lambda p: s[min(len(s) - 1, int(p * len(s)))] / 1e3  # noqa: E731
        out["calls"][name] = {"n": len(s), "median": statistics.median(s) / 1e3, "mean": sum(s) / len(s) / 1e3,
                              "p90": q(0.9), "p99": q(0.99), "max": s[-1] / 1e3, "total_ms": sum(s) / 1e6}
    if prof is not None:
        events = []
        for ev in prof.key_averages():
            events.append((ev.key, ev.count, ev.self_cpu_time_total,
                           getattr(ev, "self_device_time_total", 0) or 0))
        events.sort(key=lambda e: -e[2])
        out["events"] = events[:40]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("programs", nargs="+", choices=sorted(PROGRAMS))
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--wrappers", default="tensordict,graphmodule")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(*args.child, args.profile)))
        return
    for program in args.programs:
        print(f"== {program}")
        print("| wrapper | fn | calls | median | mean | p90 | p99 | max | total ms |")
        print("|---|---|---|---|---|---|---|---|---|")
        profiles = []
        for wrapper in args.wrappers.split(","):
            cmd = [sys.executable, os.path.abspath(__file__), program, "--child", program, wrapper]
            if args.profile:
                cmd.append("--profile")
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if not lines:
                print(f"| {wrapper} | failed rc={proc.returncode}: {proc.stderr.strip().splitlines()[-1:]} |")
                continue
            res = json.loads(lines[-1][7:])
            for name, c in res["calls"].items():
                print(f"| {wrapper} | {name} | {c['n']} | {c['median']:.1f} | {c['mean']:.1f} | {c['p90']:.1f} | "
                      f"{c['p99']:.1f} | {c['max']:.1f} | {c['total_ms']:.1f} |")
            print(f"| {wrapper} | steps/s {res['steps_per_s']:.0f} |")
            if "events" in res:
                profiles.append((wrapper, res["events"]))
        for wrapper, events in profiles:
            print(f"\n-- {program} {wrapper}: top events by self CPU time (count, self cpu ms, self device ms)")
            for key, count, cpu, dev in events:
                print(f"  {key[:70]:70s} {count:8d} {cpu / 1e3:9.2f} {dev / 1e3:9.2f}")


if __name__ == "__main__":
    main()
