"""Is a real program's loop bound by the host or by the GPU? For each wrapper: wall time per
iteration (an unprofiled run) against the GPU's kernel time per iteration (a torch.profiler
run of the same program), kernels per iteration, and the top kernels. Where GPU time is close
to wall time, no wrapper's host savings can show in steps/s.

    python scripts/gpu_busy.py td3 [--steps 600] [--wrappers tensordict,graphmodule]
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
warnings.simplefilter("ignore")

import torch  # noqa: E402

from tests.programs import common, ppo, sac, td3  # noqa: E402

RUNS = {"td3": td3.run_td3, "sac": sac.run_sac,
        "ppo_tdmodule": lambda w, **k: ppo.run_ppo(w, variant="tdmodule", **k)}


def profiled(run, wrapper: str, steps: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    begin, stop = common.Clock.begin, common.Clock.stop

    def begin_(clock):
        begin(clock)
        prof.__enter__()

    def stop_(clock, unit):
        torch.cuda.synchronize()
        prof.__exit__(None, None, None)
        return stop(clock, unit)

    common.Clock.begin, common.Clock.stop = begin_, stop_
    try:
        result = run(common.make_wrap(wrapper), steps=steps, device="cuda", seed=0)
    finally:
        common.Clock.begin, common.Clock.stop = begin, stop
    timing = result["timing"]
    kernels, gpu_us, names = 0, 0.0, Counter()
    for ev in prof.key_averages():
        dev = getattr(ev, "self_device_time_total", 0) or 0
        if dev > 0 and ev.device_type == torch.autograd.DeviceType.CUDA:
            kernels += ev.count
            gpu_us += dev
            names[ev.key[:50]] += dev
    return {"iterations": timing["steps"], "gpu_us": gpu_us, "kernels": kernels, "top": names.most_common(8)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("program", choices=sorted(RUNS))
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--wrappers", default="tensordict,graphmodule")
    args = parser.parse_args()
    run = RUNS[args.program]
    print(f"== {args.program}: per measured env step (torch {torch.__version__}, {torch.cuda.get_device_name()})")
    print("| wrapper | wall µs (unprofiled) | GPU kernel µs | GPU / wall | kernels |")
    print("|---|---|---|---|---|")
    tops = []
    for wrapper in args.wrappers.split(","):
        walls = []
        for _ in range(3):
            timing = run(common.make_wrap(wrapper), steps=args.steps, device="cuda", seed=0)["timing"]
            walls.append(timing["seconds"] / timing["steps"] * 1e6)
        wall = sorted(walls)[1]
        p = profiled(run, wrapper, args.steps)
        n = p["iterations"]
        print(f"| {wrapper} | {wall:.1f} | {p['gpu_us'] / n:.1f} | {p['gpu_us'] / n / wall:.2f} | {p['kernels'] / n:.1f} |")
        tops.append((wrapper, [(k, v / n) for k, v in p["top"]]))
    for wrapper, top in tops:
        print(f"\n{wrapper}: top kernels, µs per env step")
        for k, v in top:
            print(f"  {v:8.1f}  {k}")


if __name__ == "__main__":
    main()
