"""Where one replay's host time goes, phase by phase, for the functions of the real programs.

Runs a short program (``td3``, ``sac``, ``ppo_tdmodule``, ``ppo_closure``) with graphmodule
and, on CUDA, with tensordict's wrapper; records each wrapped function's last call; then times
those calls repeatedly, the two wrappers' calls interleaved and the GPU drained before each
(a full launch queue does not count): whole, and graphmodule's phase by phase (match, mode,
watch, extra, copy, replay, finish). Host microseconds, median of ``--reps`` calls.

    python scripts/phase_times.py td3 ppo_tdmodule [--reps 2000]

On CPU the graph is simulated and its replay is left out of the phases ("replay" is 0).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
warnings.simplefilter("ignore")

import torch  # noqa: E402

from tests.programs import ppo, sac, td3  # noqa: E402
from tests.programs.common import make_wrap  # noqa: E402

RUNS = {
    "td3": (td3.run_td3, 300),
    "sac": (sac.run_sac, 300),
    "ppo_tdmodule": (lambda w, **k: ppo.run_ppo(w, variant="tdmodule", **k), 3),
    "ppo_closure": (lambda w, **k: ppo.run_ppo(w, variant="closure", **k), 3),
}


def recording(wrap):
    """``wrap`` whose wrappers remember their last call's arguments."""
    calls = {}

    def rec(fn, **kwargs):
        inner = wrap(fn, **kwargs)
        index = len(wrap.built) - 1

        def call(*args, **kw):
            calls[index] = (inner, args, kw, torch.is_grad_enabled())
            return inner(*args, **kw)

        call.inner = inner
        return call

    rec.built = wrap.built
    return rec, calls


def median_us(fn, reps: int, cuda: bool) -> float:
    """Host time of one call with the GPU idle when it starts (a sync before each, not
    timed): the call's own cost, not the queue's."""
    times = []
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def trace(call, n: int = 200) -> str:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            call()
        torch.cuda.synchronize()
    lines = []
    for ev in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:25]:
        gpu = getattr(ev, "self_device_time_total", 0) or getattr(ev, "self_cuda_time_total", 0)
        lines.append(f"  {ev.key[:60]:60s} n={ev.count / n:6.2f} cpu={ev.self_cpu_time_total / n:8.1f}us gpu={gpu / n:8.1f}us")
    return "\n".join(lines)


def phases(wrapper, args, kwargs, reps: int, cuda: bool) -> dict:
    entry = wrapper._entries[0]
    if kwargs and wrapper._sort_kwargs:
        from graphmodule._dispatch import sorted_kwargs
        kwargs = sorted_kwargs(kwargs)
    split = entry.spec.match(args, kwargs)
    assert split is not None, "the recorded call does not match the captured graph"
    leaves, objs = split
    replay = (lambda: entry.runner.replay(entry.handle)) if cuda else (lambda: None)
    out = {
        "match": median_us(lambda: entry.spec.match(args, kwargs), reps, cuda),
        "mode": median_us(wrapper._mode.read, reps, cuda),
        "watch": median_us(entry.watch.check, reps, cuda),
        "extra": median_us(lambda: entry.extra_ok(leaves, objs), reps, cuda),
        "copy": median_us(lambda: entry.inputs.copy_from(leaves), reps, cuda),
        "replay": median_us(replay, reps, cuda),
        "finish": median_us(lambda: entry.finish(leaves, objs, (args, kwargs)) if not entry.single else None, reps, cuda),
    }
    out["sum"] = sum(out.values())
    # the same work in bigger pieces: what the phases leave out shows as the difference
    out["entry.replay"] = median_us(lambda: entry.replay(leaves, objs, (args, kwargs)), reps, cuda)
    sizes = {"watched tensors": len(entry.watch._t[0]), "watched objects": len(entry.watch._o[0]),
             "watched values": len(entry.watch._v[0]), "input leaves": len(leaves)}
    return out, sizes


def paired_us(fns: list, reps: int, cuda: bool) -> list[float]:
    """Host time of each of ``fns`` (one call each), interleaved call by call (ABAB...), so
    that drift in the machine's speed affects every one alike; median per function."""
    times = [[] for _ in fns]
    for _ in range(reps):
        for fn, ts in zip(fns, times):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            fn()
            ts.append(time.perf_counter_ns() - t0)
    return [statistics.median(ts) / 1e3 for ts in times]


def label_of(inner) -> str:
    module = getattr(inner, "module", inner)
    return getattr(module, "__name__", None) or type(module).__name__


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("programs", nargs="+", choices=sorted(RUNS))
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--trace", action="store_true", help="torch.profiler: CUDA runtime calls per call")
    args = parser.parse_args()
    traces = []
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    backend = "cuda" if cuda else "simulate"
    names = ("graphmodule", "tensordict") if cuda else ("graphmodule",)
    for program in args.programs:
        run, steps = RUNS[program]
        recorded = {}
        for name in names:
            wrap, calls = recording(make_wrap(name, backend=backend) if name == "graphmodule" else make_wrap(name))
            run(wrap, steps=steps, device=device, seed=0)
            recorded[name] = calls
        rows = []
        for k, (inner, a, kw, grad) in sorted(recorded["graphmodule"].items()):
            row = {"fn": f"{k}:{label_of(inner)}"}
            pairs = [(name, recorded[name][k]) for name in names if k in recorded[name]]
            with torch.set_grad_enabled(grad):
                try:
                    for _, (w, wa, wkw, _) in pairs:
                        w(*wa, **wkw)
                except Exception as e:  # a call that changed its arguments (gae adds keys)
                    row["fn"] += f" (not repeatable: {type(e).__name__})"
                    rows.append(row)
                    continue
                whole = paired_us([lambda w=w, wa=wa, wkw=wkw: w(*wa, **wkw) for _, (w, wa, wkw, _) in pairs],
                                  args.reps, cuda)
                for (name, _), us in zip(pairs, whole):
                    row[name] = us
                if "tensordict" in row:
                    row["gm/td"] = row["graphmodule"] / row["tensordict"]
                ph, sizes = phases(inner, a, kw, args.reps, cuda)
                row.update(ph)
                row.update(sizes)
                if args.trace and cuda:
                    for name, (w, wa, wkw, _) in pairs:
                        traces.append((program, row["fn"], name, trace(lambda: w(*wa, **wkw))))
            rows.append(row)
        print(f"== {program} ({device}, torch {torch.__version__}; whole calls interleaved, GPU drained before each)")
        cols = ["fn", "tensordict", "graphmodule", "gm/td", "match", "mode", "watch", "extra", "copy", "replay",
                "finish", "sum", "entry.replay",
                "watched tensors", "watched objects", "watched values", "input leaves"]
        print("| " + " | ".join(cols) + " |")
        print("|" + "---|" * len(cols))
        for row in rows:
            print("| " + " | ".join(f"{row[c]:.2f}" if c == "gm/td" and c in row else
                                    f"{row[c]:.1f}" if isinstance(row.get(c), float) else str(row.get(c, ""))
                                    for c in cols) + " |")
    for program, fn, name, table in traces:
        print(f"\n== trace {program} {fn} {name}: per call, CPU-side events (count, host us)")
        print(table)


if __name__ == "__main__":
    main()
