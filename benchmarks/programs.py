"""Real programs through three wrappers: throughput, and where a step's time goes.

    python benchmarks/programs.py --out results/programs            # on a GPU
    python benchmarks/programs.py --smoke --out /tmp/programs       # tiny sizes, anywhere
    python benchmarks/programs.py --paired 10 --programs td3,sac --out results/paired   # A/B in one process
    python benchmarks/programs.py --interleaved 20 --programs td3,sac --out results/ab  # A/B in one run

The programs are those of ``tests/programs`` (PPO with a closure update or a
TensorDictModule update, SAC, TD3, a no-argument train step, the same compiled), each run
with no wrapper (``eager``), ``tensordict.nn.CudaGraphModule`` and
``graphmodule.CudaGraphModule``, only the wrapper changing. The table gives the median
steps/s of the measured part of each run (after warmup, compilation and capture).

One more run per wrapper is instrumented: every call of a wrapped function is timed on the
host (``perf_counter`` around the call) and on the GPU (CUDA events around it: the span of
the caller's stream from the call's first to its last work, idle gaps included, so a
host-bound eager call shows about its host time). Those times are shown per step and as
shares of the step's wall time: how much of a step the wrapped calls take, for each wrapper.

Every run is made in a child process (``--one PROGRAM --jobs WRAPPER:KIND,... --json PATH``,
KIND ``timed`` or ``profile``), one child at a time, never two at once. A capture that fails
inside tensordict's wrapper leaves its process broken (the CUDA generator refuses every
later ``torch.randn``, and destroying the half-built graph aborts the process), so in one
process one such failure would fail or crash every later run of every wrapper.

The choice: program by program, ``--rounds`` passes each run one child per wrapper in turn
(eager, tensordict, graphmodule), each child one timed run, so the rounds alternate between
the wrappers across processes; the child of the last pass also makes the instrumented run,
after its timed one (``--rounds 0``: one pass, the instrumented run only). That is 3 children
per pass and program (54 with ``--rounds 3``), each paying an interpreter start, the imports
and CUDA's initialisation (some 5 s) besides its runs: about 3 minutes more than one child
per wrapper and program making all its rounds, which would time a wrapper's rounds back to
back in one process. ``--smoke``: one child per program makes the instrumented runs of the
three wrappers (CI, on CPU: 6 children, not 18).

A child writes its results as JSON after every run and stops at its first failure; a child
that fails, crashes or outlives ``--timeout`` has its error recorded (the exception, or the
exit status and the last lines of its output), that wrapper's later runs are dropped, and a
fresh child takes the runs it left: the others go on. ``--strict`` exits with status 1 if
any run failed. The parent process imports no torch and never touches the GPU. Without
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
import tempfile
import time
import traceback
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "tests")):  # graphmodule, examples; the programs package
    if path not in sys.path:
        sys.path.insert(0, path)

from programs.isolated import exit_after_failure, how_it_ended, last_lines, run_child  # noqa: E402 (no torch)

WRAPPERS = ("eager", "tensordict", "graphmodule")  # programs.common.WRAPPERS (it imports torch)
RUNNERS = {  # module.function of the programs package (imported by the children only)
    "ppo_closure": "ppo.run_ppo",
    "ppo_tdmodule": "ppo.run_ppo",
    "sac": "sac.run_sac",
    "td3": "td3.run_td3",
    "train_step": "train_step.run_train_step",
    "train_step_compiled": "train_step.run_train_step",
}
# GPU sizes: near the published defaults, a few seconds per eager run.
FULL = {
    "ppo_closure": dict(steps=8, variant="closure"),
    "ppo_tdmodule": dict(steps=8, variant="tdmodule"),
    "sac": dict(steps=700, learning_starts=100),
    "td3": dict(steps=700, learning_starts=100),
    "train_step": dict(steps=400),
    "train_step_compiled": dict(steps=400, compile=True),
}
# --interleaved: longer runs, and a burn-in long enough for both wrappers of every function to
# capture while each function's calls alternate between them.
INTERLEAVED = {
    "ppo_closure": dict(steps=40, variant="closure", burnin=8),
    "ppo_tdmodule": dict(steps=40, variant="tdmodule", burnin=8),
    "sac": dict(steps=2140, learning_starts=100, burnin=40),
    "td3": dict(steps=2140, learning_starts=100, burnin=40),
    "train_step": dict(steps=1000),
    "train_step_compiled": dict(steps=1000, compile=True),
}
BLOCK = {"ppo_closure": 1, "ppo_tdmodule": 1}  # iterations per block (others: --interleaved)
# --smoke: tiny sizes, as in the CPU tests (compiled with dynamo's eager backend: no build).
SMOKE = {
    "ppo_closure": dict(steps=3, variant="closure", num_envs=4, rollout=8, minibatch=16, epochs=2, hidden=32,
                        max_episode_steps=10, burnin=1),
    "ppo_tdmodule": dict(steps=3, variant="tdmodule", num_envs=4, rollout=8, minibatch=16, epochs=2, hidden=32,
                         max_episode_steps=10, burnin=1),
    "sac": dict(steps=24, num_envs=4, learning_starts=8, batch_size=16, hidden=32, burnin=4),
    "td3": dict(steps=24, num_envs=4, learning_starts=8, batch_size=16, hidden=32, burnin=4),
    "train_step": dict(steps=12, batch_size=32, hidden=32),
    "train_step_compiled": dict(steps=12, batch_size=32, hidden=32, compile=True, compile_backend="eager"),
}


# -- in a child process: the runs ---------------------------------------------------------
class Meter:
    """Host and GPU time of every call of the wrapped functions of one run."""

    def __init__(self, cuda: bool) -> None:
        import torch

        self.cuda = cuda
        self.event = torch.cuda.Event if cuda else None
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
            e0 = meter.event(enable_timing=True)
            e0.record()
        t0 = time.perf_counter()
        out = self.inner(*args, **kwargs)
        t1 = time.perf_counter()
        if meter.cuda:
            e1 = meter.event(enable_timing=True)
            e1.record()
        meter.calls.append((t0, t1, e0, e1))
        return out


def instrumented(wrap, meter: Meter):
    def timed_wrap(fn, **kwargs):
        return Timed(wrap(fn, **kwargs), meter)

    timed_wrap.built = wrap.built
    return timed_wrap


class Interleave:
    """tensordict's wrapper and graphmodule's around every wrapped function of one run,
    switched every ``block`` iterations of the measured part (the program's ``Clock.tick``):
    the two share the run's modules, optimizers, buffers and environment, and every drift of
    the machine (clocks, other tenants) falls on both. Before the measured part each function
    alternates call by call, so both wrappers of it warm up and capture.

    Per wrapper: the wall time of its blocks and the host time inside its calls.
    """

    NAMES = ("tensordict", "graphmodule")

    def __init__(self, block: int, backend: str) -> None:
        from programs.common import make_wrap

        self.block, self.active = block, None
        self.wraps = (make_wrap("tensordict"), make_wrap("graphmodule", backend=backend))
        self.built: list = []
        self.per_fn: list[list[list[float]]] = []  # [function][wrapper] = [host seconds, calls]
        self.blocks: list[tuple[int, float, int]] = []  # (wrapper, seconds, steps)
        self.t_block, self.steps_in_block, self.ticks = 0.0, 0, 0

    def wrap(self, fn, **kwargs):
        pair = (self.wraps[0](fn, **kwargs), self.wraps[1](fn, **kwargs))
        self.built.append(pair)
        counter = [0]
        mine = [[0.0, 0], [0.0, 0]]
        self.per_fn.append(mine)

        def call(*args, **kw):
            which = self.active
            if which is None:
                which = counter[0] % 2
                counter[0] += 1
                return pair[which](*args, **kw)
            t0 = time.perf_counter()
            out = pair[which](*args, **kw)
            mine[which][0] += time.perf_counter() - t0
            mine[which][1] += 1
            return out

        return call

    def begin(self, clock) -> None:
        self.active, self.t_block = 0, clock.start

    def tick(self, clock, n: int) -> None:
        if self.active is None:
            return
        self.steps_in_block += n
        self.ticks += 1
        if self.ticks % self.block == 0:
            now = time.perf_counter()
            self.blocks.append((self.active, now - self.t_block, self.steps_in_block))
            self.active, self.t_block, self.steps_in_block = 1 - self.active, now, 0

    def summary(self) -> dict:
        out = {}
        for i, name in enumerate(self.NAMES):
            blocks = [(sec, steps) for w, sec, steps in self.blocks if w == i]
            seconds, steps = sum(b[0] for b in blocks), sum(b[1] for b in blocks)
            out[name] = {"blocks": len(blocks), "seconds": seconds, "steps": steps,
                         "steps_per_s": steps / seconds if seconds else math.nan,
                         "host_s": sum(fn[i][0] for fn in self.per_fn),
                         "calls": sum(fn[i][1] for fn in self.per_fn),
                         "block_s": [b[0] / b[1] for b in blocks]}  # seconds per step, block by block
        # each graphmodule block against the mean of its tensordict neighbours (drift cancels)
        per = [(w, sec / steps) for w, sec, steps in self.blocks if steps]
        ratios = []
        for k, (w, v) in enumerate(per):
            if w == 1:
                near = [per[j][1] for j in (k - 1, k + 1) if 0 <= j < len(per) and per[j][0] == 0]
                if near:
                    ratios.append(statistics.fmean(near) / v)  # > 1: graphmodule's block was faster
        out["gm_over_td_speed"] = ratios
        # host µs per call of each wrapped function (in the order the program wrapped them)
        out["host_us_per_call"] = [
            {name: (fn[i][0] / fn[i][1] * 1e6 if fn[i][1] else math.nan) for i, name in enumerate(self.NAMES)}
            for fn in self.per_fn]
        return out


def interleaved_run(program: str, config: dict, device, backend: str, block: int) -> dict:
    import importlib

    from programs import common

    module, function = RUNNERS[program].split(".")
    run = getattr(importlib.import_module(f"programs.{module}"), function)
    inter = Interleave(block, backend)
    def wrap(fn, **kwargs):
        return inter.wrap(fn, **kwargs)

    wrap.built = inter.built
    begin, tick = common.Clock.begin, common.Clock.tick

    def begin_(clock):
        begin(clock)
        inter.begin(clock)

    def tick_(clock, n):
        tick(clock, n)
        inter.tick(clock, n)

    common.Clock.begin, common.Clock.tick = begin_, tick_
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = run(wrap, device=device, seed=0, **config)
    finally:
        common.Clock.begin, common.Clock.tick = begin, tick
    timing = result["timing"]
    timing["interleaved"] = inter.summary()
    timing["block"] = block
    return timing


def one_run(program: str, wrapper: str, config: dict, device, backend: str, profile: bool) -> dict:
    import importlib

    import torch
    from programs.common import make_wrap

    module, function = RUNNERS[program].split(".")
    run = getattr(importlib.import_module(f"programs.{module}"), function)
    wrap = make_wrap(wrapper, backend=backend)
    meter = Meter(device.type == "cuda")
    if profile:
        wrap = instrumented(wrap, meter)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # compile chatter, tensordict's FutureWarnings
        result = run(wrap, device=device, seed=0, **config)
    timing = result["timing"]
    if profile:
        timing.update(meter.summary(timing["t_start"], timing["t_end"]))
    del wrap, meter, result
    gc.collect()  # free the graphs (and their memory pools) before the next run
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return timing


def environment(device) -> dict:
    import graphmodule
    import tensordict
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "tensordict": tensordict.__version__,
            "graphmodule": graphmodule.__version__, "device": str(device)}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def ablate(parts: str) -> None:
    """Diagnosis only (env ``GM_ABLATE``, comma-separated): switch off one of graphmodule's
    per-call checks, to see what it costs in a real program (``docs/performance.md`` has the
    table). Each leaves a real change unnoticed; never for results.

    ``watch``: the whole staleness check passes. ``addresses``: only the comparison of the
    watched tensors' addresses (``p.data = ...``). ``places``: only the read of the places no
    dict watcher covers (list items, closure cells). ``grads``: a train step's ``.grad`` kept
    bound from its last call are reused without checking that nothing holds them.
    ``extra``: aliasing, strides and inference-tensor inputs."""
    from graphmodule import _entry, _lend, _stale

    for part in filter(None, parts.split(",")):
        if part == "watch":
            _stale.Watch.check = lambda self: True
        elif part == "addresses":
            _stale._same_addresses = lambda tensors, ptrs, index: True
        elif part == "places":
            _stale.Watch._places_same = lambda self: True
        elif part == "grads":
            made = _lend.DroppingLender.__init__

            def init(self, *args, made=made, **kwargs):
                made(self, *args, **kwargs)
                checked = self.free
                self.free = lambda: self._bound is not None or checked()

            _lend.DroppingLender.__init__ = init
        elif part == "extra":
            _entry.Entry.extra_ok = lambda self, leaves, objs: True
        else:
            raise ValueError(f"GM_ABLATE: unknown part {part!r} (known: watch, addresses, places, grads, extra)")


def delay(spec: str) -> None:
    """Diagnosis only (env ``GM_DELAY=K:US``): graphmodule's wrapper of the program's K-th
    wrapped function (0 first, in the order the program wraps them) spends US more
    microseconds of host time before each call. What that costs the program's steps/s says
    how much of that call's host time the loop waits for (``docs/performance.md``)."""
    if not spec:
        return
    try:
        index, micros = spec.split(":")
        index, seconds = int(index), float(micros) * 1e-6
    except ValueError:
        raise ValueError(f"GM_DELAY: expected FUNCTION:MICROSECONDS (as 1:100), got {spec!r}") from None
    import graphmodule

    cls, made, count = graphmodule.CudaGraphModule, graphmodule.CudaGraphModule.__init__, [0]

    class Delayed(cls):
        def __call__(self, *args, **kwargs):
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                pass
            return cls.__call__(self, *args, **kwargs)

    def init(self, *args, **kwargs):
        made(self, *args, **kwargs)
        if count[0] == index:
            self.__class__ = Delayed  # (this wrapper alone: the others' calls are untouched)
        count[0] += 1

    cls.__init__ = init


def child(program: str, jobs: list[tuple[str, str]], smoke: bool, path: str) -> None:
    """Make the runs ``jobs`` ((wrapper, "timed" | "profile")) of ``program`` in turn, here,
    writing what was done to ``path`` (JSON) after each; stop at the first failure."""
    import torch

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    logging.getLogger("tensordict").setLevel(logging.WARNING)  # its per-wrapper INFO lines
    if not cuda:
        torch.set_num_threads(1)  # tiny CPU workloads; far faster on a loaded machine
    ablate(os.environ.get("GM_ABLATE", ""))
    delay(os.environ.get("GM_DELAY", ""))
    report = {"environment": environment(device), "done": []}
    for wrapper, kind in jobs:
        if os.environ.get("GRAPHMODULE_BENCH_ABORT") == f"{program}/{wrapper}":
            os.abort()  # a crashing child, for this script's test
        done = {"wrapper": wrapper, "kind": kind}
        try:
            if kind.startswith("interleaved"):
                block = int(kind.split("=")[1]) if "=" in kind else 20
                done["timing"] = interleaved_run(program, (SMOKE if smoke else INTERLEAVED)[program], device,
                                                 "cuda" if cuda else "simulate", BLOCK.get(program, block))
                report["done"].append(done)
                with open(path + ".tmp", "w") as f:
                    json.dump(report, f, default=str)
                os.replace(path + ".tmp", path)
                continue
            done["timing"] = one_run(program, wrapper, (SMOKE if smoke else FULL)[program], device,
                                     "cuda" if cuda else "simulate", kind == "profile")
        except Exception as exc:  # noqa: BLE001 - recorded, the parent goes on
            gc.disable()  # see exit_after_failure
            head = " / ".join(line.strip() for line in str(exc).strip().splitlines()[:2])
            done.update(error=f"{type(exc).__name__}: {head}"[:300], detail=traceback.format_exc()[-4000:])
        report["done"].append(done)
        with open(path + ".tmp", "w") as f:
            json.dump(report, f, default=str)
        os.replace(path + ".tmp", path)
        if "error" in done:
            exit_after_failure()


# -- in the parent process: the children, one at a time --------------------------------
def schedule(rounds: int, smoke: bool, paired: int = 0) -> list[list[tuple[str, str]]]:
    """The children of one program, in order: the runs (wrapper, kind) each one makes."""
    if smoke:
        return [[(w, "profile") for w in WRAPPERS]]
    if paired:  # one child: tensordict and graphmodule in turn, then one instrumented run each
        runs = [(w, "timed") for _ in range(paired) for w in ("tensordict", "graphmodule")]
        return [runs + [("tensordict", "profile"), ("graphmodule", "profile")]]
    passes = max(rounds, 1)
    children = []
    for r in range(passes):
        for wrapper in WRAPPERS:
            runs = [(wrapper, "timed")] if r < rounds else []
            if r == passes - 1:
                runs.append((wrapper, "profile"))
            children.append(runs)
    return children


def run_jobs(program: str, jobs: list[tuple[str, str]], args, results: dict) -> tuple[dict | None, int]:
    """Make ``jobs`` in a child process and record them in ``results``; after a failure,
    in a fresh child, the jobs left less the failed wrapper's. Returns the children's
    environment and how many children ran."""
    environment, children = None, 0
    while jobs:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "runs.json")
            spec = ",".join(f"{wrapper}:{kind}" for wrapper, kind in jobs)
            code, output = run_child([os.path.abspath(__file__), "--one", program, "--jobs", spec, "--json", path]
                                     + (["--smoke"] if args.smoke else []), args.timeout)
            children += 1
            report = {"done": []}
            if os.path.exists(path):
                with open(path) as f:
                    report = json.load(f)
        environment = report.get("environment", environment)
        for done in report["done"]:
            entry = results[program][done["wrapper"]]
            if "error" in done:
                entry.update(error=done["error"], detail=done["detail"])
                print(f"  {program:20s} {done['wrapper']:12s} FAILED {entry['error']}", flush=True)
                continue
            timing = done["timing"]
            if done["kind"] == "profile":
                entry["profile"] = timing
            else:
                entry["runs"].append(timing)
            kind = "profile" if done["kind"] == "profile" else f"round {len(entry['runs'])}"
            print(f"  {program:20s} {done['wrapper']:12s} {kind:8s} {timing['steps_per_s']:12.1f} "
                  f"{timing['unit']}s/s", flush=True)
        jobs = jobs[len(report["done"]):]
        if code != 0 or not report["done"]:  # crashed, hung, or did nothing: blame the run it was on
            wrapper = jobs[0][0] if jobs else report["done"][-1]["wrapper"]
            entry = results[program][wrapper]
            if not entry["error"]:
                how, gist = f"child {how_it_ended(code, args.timeout)}", last_lines(output)
                entry.update(error=(f"{how}: {gist}" if gist else how)[:300], detail=output[-4000:])
                print(f"  {program:20s} {wrapper:12s} FAILED {entry['error']}", flush=True)
        jobs = [(w, k) for w, k in jobs if not results[program][w]["error"]]
    return environment, children


def run_all(programs, rounds: int, args) -> tuple[dict, dict | None, int]:
    results = {p: {w: {"runs": [], "profile": None, "error": None} for w in WRAPPERS} for p in programs}
    environment, children = None, 0
    for program in programs:
        for jobs in schedule(rounds, args.smoke, args.paired):
            jobs = [(w, k) for w, k in jobs if not results[program][w]["error"]]
            if not jobs:
                continue
            env, n = run_jobs(program, jobs, args, results)
            children += n
            if env and not environment:
                environment = env
                cuda = env["device"].startswith("cuda")
                print(f"  (on {env.get('gpu', env['device'])}" + (")" if cuda else
                      ": no CUDA, graphmodule simulated, tensordict eager; timings mean nothing)"), flush=True)
    for program in programs:
        for entry in results[program].values():
            runs = entry["runs"] or ([entry["profile"]] if entry["profile"] else [])  # --rounds 0
            rates = [t["steps_per_s"] for t in runs]
            entry["median_steps_per_s"] = statistics.median(rates) if rates else math.nan
    return results, environment, children


def run_interleaved(programs, block: int, args) -> tuple[dict, dict | None, int]:
    """One child per program making one interleaved run (see ``Interleave``)."""
    results, environment = {}, None
    for program in programs:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "runs.json")
            code, output = run_child([os.path.abspath(__file__), "--one", program, "--jobs",
                                      f"ab:interleaved={block}", "--json", path]
                                     + (["--smoke"] if args.smoke else []), args.timeout)
            report = {"done": []}
            if os.path.exists(path):
                with open(path) as f:
                    report = json.load(f)
        environment = report.get("environment", environment)
        done = report["done"][0] if report["done"] else {}
        if "timing" in done:
            results[program] = done["timing"]
            inter = done["timing"]["interleaved"]
            print(f"  {program:20s} " + "  ".join(f"{name} {inter[name]['steps_per_s']:10.1f}/s"
                                               for name in Interleave.NAMES), flush=True)
        else:
            gist = done.get("error") or f"child {how_it_ended(code, args.timeout)}: {last_lines(output)}"
            results[program] = {"error": gist[:300], "detail": done.get("detail", output[-4000:])}
            print(f"  {program:20s} FAILED {results[program]['error']}", flush=True)
    return results, environment, len(programs)


def interleaved_table(results: dict) -> str:
    lines = ["| program | block (iterations) | blocks td / gm | steps/s td | steps/s gm | gm/td (whole) "
             "| gm/td, median of each gm block against its td neighbours | host in wrapped µs/step td / gm "
             "| host µs per call td / gm, each wrapped function |",
             "|---|---|---|---|---|---|---|---|---|"]
    for program, timing in results.items():
        if "error" in timing:
            lines.append(f"| {program} | failed: {timing['error'].replace('|', '/')} | | | | | | | |")
            continue
        inter = timing["interleaved"]
        td, gm = inter["tensordict"], inter["graphmodule"]
        ratios = inter["gm_over_td_speed"]
        host = " / ".join(fmt(w["host_s"] / w["steps"] * 1e6 if w["steps"] else math.nan) for w in (td, gm))
        per_call = ", ".join(f"{fmt(f['tensordict'])} / {fmt(f['graphmodule'])}"
                             for f in inter.get("host_us_per_call", []))
        lines.append(f"| {program} | {timing['block']} | {td['blocks']} / {gm['blocks']} | {fmt(td['steps_per_s'])} "
                     f"| {fmt(gm['steps_per_s'])} | {fmt(gm['steps_per_s'] / td['steps_per_s'], 3)}x "
                     f"| {fmt(statistics.median(ratios), 3) if ratios else '—'}x | {host} | {per_call} |")
    return "\n".join(lines)


def paired_table(results: dict) -> str:
    """graphmodule's steps/s over tensordict's, pair by pair (runs made in turn in one process)."""
    lines = ["| program | pairs | gm/td per pair | median gm/td |", "|---|---|---|---|"]
    for program, by_wrapper in results.items():
        td = [t["steps_per_s"] for t in by_wrapper["tensordict"]["runs"]]
        gm = [t["steps_per_s"] for t in by_wrapper["graphmodule"]["runs"]]
        ratios = [g / t for g, t in zip(gm, td)]
        shown = ", ".join(f"{r:.2f}" for r in ratios)
        lines.append(f"| {program} | {len(ratios)} | {shown} | {fmt(statistics.median(ratios), 2) if ratios else '—'}x |")
    return "\n".join(lines)


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
            if not (entry["error"] or entry["runs"] or entry["profile"]):
                continue  # not run (--paired has no eager runs)
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="folder for programs.json and programs.md")
    parser.add_argument("--rounds", type=int, default=3,
                        help="timed runs per wrapper and program, besides the instrumented one (0: that one only)")
    parser.add_argument("--programs", default=",".join(RUNNERS), help="comma-separated subset")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, the instrumented run only (CI)")
    parser.add_argument("--paired", type=int, default=0, metavar="N",
                        help="instead of rounds: per program one child running tensordict and graphmodule "
                             "in turn N times (no eager run); the table adds each pair's ratio")
    parser.add_argument("--interleaved", type=int, default=0, metavar="K",
                        help="instead of rounds: per program one run with both wrappers around every function, "
                             "switched every K iterations of the measured part (PPO: every iteration)")
    parser.add_argument("--strict", action="store_true", help="exit 1 if any run failed")
    parser.add_argument("--timeout", type=float, default=240, help="seconds a child process may take (default 240)")
    parser.add_argument("--one", metavar="PROGRAM", help="(a child process) make runs of PROGRAM here")
    parser.add_argument("--jobs", help="(with --one) the runs, WRAPPER:KIND,... with KIND timed or profile")
    parser.add_argument("--json", help="(with --one) where the child writes its results")
    args = parser.parse_args(argv)
    if args.one:
        jobs = [tuple(job.split(":")) for job in args.jobs.split(",")]
        child(args.one, jobs, args.smoke, args.json)
        return 0
    if not args.out:
        parser.error("--out is required")
    programs = [p for p in args.programs.split(",") if p]
    unknown = set(programs) - set(RUNNERS)
    if unknown:
        parser.error(f"unknown programs {sorted(unknown)}; choose from {list(RUNNERS)}")
    rounds = 0 if args.smoke else args.rounds
    if args.interleaved:
        t0 = time.perf_counter()
        results, env, children = run_interleaved(programs, args.interleaved, args)
        md = interleaved_table(results)
        print("\n" + md)
        os.makedirs(args.out, exist_ok=True)
        record = {"environment": env or {"python": platform.python_version()}, "smoke": args.smoke,
                  "interleaved": args.interleaved, "wall_s": time.perf_counter() - t0,
                  "sizes": {p: (SMOKE if args.smoke else INTERLEAVED)[p] for p in programs}, "results": results}
        with open(os.path.join(args.out, "interleaved.json"), "w") as f:
            json.dump(record, f, indent=1, default=str)
        with open(os.path.join(args.out, "interleaved.md"), "w") as f:
            f.write(md + "\n")
        failed = [p for p, t in results.items() if "error" in t]
        return 1 if args.strict and failed else 0
    isolation = ("one child process per program (--smoke)" if args.smoke else
                 f"one child process per program, tensordict and graphmodule in turn {args.paired} times"
                 if args.paired else
                 "one child process per program, wrapper and round (the instrumented run with the last round)")
    print(f"{len(programs)} programs x {len(WRAPPERS)} wrappers x {rounds} rounds (+1 instrumented), "
          f"{isolation}", flush=True)
    t0 = time.perf_counter()
    results, env, children = run_all(programs, rounds, args)
    wall = time.perf_counter() - t0
    md = table(results)
    if args.paired:
        md += "\n\n" + paired_table(results)
    print("\n" + md)
    os.makedirs(args.out, exist_ok=True)
    record = {"environment": env or {"python": platform.python_version()}, "smoke": args.smoke, "rounds": rounds,
              "isolation": isolation, "children": children, "wall_s": wall,
              "sizes": {p: (SMOKE if args.smoke else FULL)[p] for p in programs}, "results": results}
    with open(os.path.join(args.out, "programs.json"), "w") as f:
        json.dump(record, f, indent=1, default=str)
    with open(os.path.join(args.out, "programs.md"), "w") as f:
        f.write(md + "\n")
    print(f"\n{children} child processes, {wall:.0f} s")
    failed = [(p, w) for p, by_w in results.items() for w, e in by_w.items() if e["error"]]
    if failed:
        print(f"{len(failed)} failed: " + ", ".join(f"{p}/{w}" for p, w in failed))
    return 1 if args.strict and failed else 0


if __name__ == "__main__":
    sys.exit(main())
