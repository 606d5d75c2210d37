"""The wrapper's own cost per call, on any machine: graphmodule's call path with a replay that
does nothing, against the hand-written copy + replay loop on the same replay.

A GPU call costs the host the wrapper's Python, the input copy's launch and the graph's launch;
where the host is the bottleneck (small policies), the Python is what separates graphmodule from
the floor. Here the graph is the simulated one (``backend="simulate"``) with its replay made a
no-op, so that only the Python is timed: reading the call, ``decide`` (the signature, the modes,
what the graph reads), the input copy, the output sets (which set a call's results come from
while the last ones are held), the result handed out.

Two ways of calling, as loops call:

- *held*: ``out = g(x)`` in a loop: the last result is alive while the next call runs, so the
  default ``outputs="safe"`` serves it from its other output set (a twin); the floor alternates
  between two output sets too;
- *dropped*: ``g(x)`` whose result is gone before the next call: one set.

    python benchmarks/overhead.py            # the table: µs per call, ours and the floor
    python benchmarks/overhead.py --profile  # and where graphmodule's time goes (cProfile)

``test_overhead.py`` runs the same under pytest-benchmark.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
import warnings
from typing import Any, Callable, NamedTuple

import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from graphmodule import CudaGraphModule  # noqa: E402

WORKLOADS = ("policy", "tiny", "policy_td")
LABELS = {"policy": "MLP policy 8-64-64-2, batch 1", "tiny": "`x*2+1`, 16 floats",
          "policy_td": "same policy, TensorDictModule, TensorDict in/out"}
VARIANTS = ("floor", "graphmodule")
CALLINGS = ("held", "dropped")


class Case(NamedTuple):
    fn: Callable[..., Any]
    args: tuple


def case(name: str) -> Case:
    torch.manual_seed(0)
    if name == "tiny":
        return Case(lambda x: x * 2 + 1, (torch.randn(16),))
    net = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))
    if name == "policy":
        return Case(net, (torch.randn(1, 8),))
    module = TensorDictModule(net, in_keys=["observation"], out_keys=["action"])
    return Case(module, (TensorDict(observation=torch.randn(1, 8), batch_size=[1]),))


def _no_replay(handle: Any) -> None:
    """A replay that does nothing (the graph's kernels are not what is timed)."""


def graphmodule_call(c: Case) -> functools.partial:
    """``g(*args)`` of a wrapper whose graphs and twins are captured, replaying nothing (a
    ``partial``, called as a loop calls ``g(obs)``: no frame of its own; ``.func`` is ``g``)."""
    g = CudaGraphModule(c.fn, backend="simulate")
    # this wrapper's runner only (its graphs and twins share it), before they are captured
    # (a capture records, it does not replay): nothing else is touched
    g._runner.replay = _no_replay
    args = c.args
    with torch.no_grad():
        out = None
        for _ in range(6):  # warmup, capture, and the twin a held result asks for
            out = g(*args)
        del out
    return functools.partial(g, *args)


def floor_call(c: Case, held: bool) -> Callable[[], Any]:
    """The hand-written loop: copy the inputs into static buffers, replay (a no-op here), return
    the output set's results; held: two sets, alternating (no checks either way)."""
    td = isinstance(c.args[0], TensorDict)
    source = c.args[0]["observation"] if td else c.args[0]
    net = c.fn.module if td else c.fn
    sets = []
    with torch.no_grad():
        for _ in range(2 if held else 1):
            static = source.clone()
            sets.append((static, net(static)))
    replay = _no_replay
    turn = [0]

    def call() -> Any:
        static, out = sets[turn[0]]
        turn[0] = (turn[0] + 1) % len(sets)
        static.copy_(source)
        replay(None)
        return out

    if not td:
        return call
    given = c.args[0]

    def call_td() -> Any:
        given.set("action", call())
        return given

    return call_td


def timed(call: Callable[[], Any], held: bool, calls: int) -> float:
    """Seconds of this thread's CPU for ``calls`` calls (a busy machine's other work excluded)."""
    clock = time.thread_time
    with torch.no_grad():
        if held:
            start = clock()
            out = [None]  # the last result, held until the next call returns (as a loop holds it)
            for _ in range(calls):
                out[0] = call()
            del out
        else:
            start = clock()
            for _ in range(calls):
                call()
        return clock() - start


def measure(names=WORKLOADS, calls: int = 2000, repeats: int = 25) -> dict[str, dict[str, float]]:
    """``{workload: {"floor held": µs, "graphmodule held": µs, ...}}``: the least time per call
    over ``repeats`` rounds, the variants interleaved round by round (drift falls on all)."""
    results = {}
    for name in names:
        c = case(name)
        runs = {f"floor {how}": (floor_call(c, how == "held"), how == "held") for how in CALLINGS}
        ours = graphmodule_call(c)
        runs.update({f"graphmodule {how}": (ours, how == "held") for how in CALLINGS})
        best = {key: float("inf") for key in runs}
        for _ in range(repeats):
            for key, (call, held) in runs.items():
                best[key] = min(best[key], timed(call, held, calls))
        results[name] = {key: 1e6 * t / calls for key, t in best.items()}
    return results


def table(results: dict[str, dict[str, float]]) -> str:
    lines = ["| workload (µs per call, host) | floor held | graphmodule held | floor dropped | graphmodule dropped |",
             "|---|---:|---:|---:|---:|"]
    for name, row in results.items():
        cells = []
        for how in CALLINGS:
            floor, ours = row[f"floor {how}"], row[f"graphmodule {how}"]
            cells += [f"{floor:.2f}", f"{ours:.2f} (+{ours - floor:.2f})"]
        lines.append(f"| {LABELS[name]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def profile(name: str, calls: int = 20000) -> str:
    import cProfile
    import io
    import pstats

    call = graphmodule_call(case(name))
    prof = cProfile.Profile()
    with torch.no_grad():
        prof.enable()
        out = None
        for _ in range(calls):
            out = call()
        prof.disable()
    del out
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(20)
    return text.getvalue()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000, help="calls per round (default 2000)")
    parser.add_argument("--repeats", type=int, default=25, help="rounds; the least is kept (default 25)")
    parser.add_argument("--profile", action="store_true", help="then cProfile graphmodule's held calls")
    parser.add_argument("workloads", nargs="*", help=f"some of {', '.join(WORKLOADS)} (default: all)")
    args = parser.parse_args(argv)
    args.workloads = args.workloads or list(WORKLOADS)
    unknown = set(args.workloads) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads {sorted(unknown)}: expected some of {list(WORKLOADS)}")
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    print(table(measure(args.workloads, args.calls, args.repeats)))
    if args.profile:
        for name in args.workloads:
            print(f"\n{LABELS[name]}, held:\n{profile(name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
