"""Soak: many replays with changing inputs and CPU work in between.

Each workload runs ``--calls`` graphed calls (after warmup and capture) with new input
values at every call and some Python and NumPy work between calls, as a training loop
has. Every ``--check-every`` calls the result is compared with the eager function on the
same inputs (for the train step: one eager step of a copy of the model and optimizer,
taken just before the graphed step). Device memory (``torch.cuda.memory_allocated``) and
the process's resident memory are read after the first 1% of the calls and at the end:
both must stay flat.

    python benchmarks/soak.py --out DIR [--calls 100000]       # on a GPU

Without CUDA it runs the simulated backend (``--calls`` small): a smoke test.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
import warnings

import numpy as np
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from graphmodule import CudaGraphModule  # noqa: E402


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cpu_work(i: int) -> float:
    values = [float(j) * 0.5 for j in range(64 + i % 7)]
    return sum(values) + float(np.sqrt(np.arange(32.0)).sum())


def policy_workload(device, backend):
    net = nn.Sequential(nn.Linear(17, 64), nn.Tanh(), nn.Linear(64, 6)).to(device)
    g = CudaGraphModule(net, backend=backend)

    def call(i):
        x = torch.randn(32, 17, device=device)
        return x, g(x)

    def check(x, out):
        return torch.allclose(out, net(x), rtol=1e-5, atol=1e-6)

    return g, call, check, torch.no_grad


def td_policy_workload(device, backend):
    net = nn.Sequential(nn.Linear(17, 64), nn.Tanh(), nn.Linear(64, 6)).to(device)
    module = TensorDictModule(net, in_keys=["observation"], out_keys=["action"])
    g = CudaGraphModule(module, backend=backend)

    def call(i):
        td = TensorDict(observation=torch.randn(32, 17, device=device), reward=torch.zeros(32, 1, device=device),
                        batch_size=[32])
        return td, g(td)

    def check(td, out):
        return out is td and torch.allclose(td["action"], net(td["observation"]), rtol=1e-5, atol=1e-6)

    return g, call, check, torch.no_grad


def train_step_workload(device, backend):
    net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
    capturable = device.type == "cuda"
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, capturable=capturable)
    batch = {"x": torch.randn(64, 8, device=device), "y": torch.randn(64, 1, device=device)}

    def step(data):
        opt.zero_grad(set_to_none=False)
        loss = (net(data["x"]) - data["y"]).pow(2).mean()
        loss.backward()
        opt.step()
        return loss.detach()

    g = CudaGraphModule(step, backend=backend)
    state = {}

    def call(i):
        batch["x"].normal_()
        batch["y"].normal_()
        data = {"x": batch["x"].clone(), "y": batch["y"].clone()}
        if state.get("checking"):
            twin, twin_opt = copy.deepcopy(net), None
            twin_opt = torch.optim.Adam(twin.parameters(), lr=1e-3, capturable=capturable)
            twin_opt.load_state_dict(copy.deepcopy(opt.state_dict()))
            twin_opt.zero_grad(set_to_none=False)
            (twin(data["x"]) - data["y"]).pow(2).mean().backward()
            twin_opt.step()
            state["twin"] = twin
        return data, g(data)

    def check(data, out):
        twin = state.pop("twin")
        return all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(net.parameters(), twin.parameters()))

    def arm(on: bool) -> None:
        state["checking"] = on

    call.arm = arm
    return g, call, check, torch.enable_grad


WORKLOADS = {"policy": policy_workload, "td_policy": td_policy_workload, "train_step": train_step_workload}


def soak(name: str, calls: int, check_every: int, device, backend) -> dict:
    torch.manual_seed(0)
    g, call, check, mode = WORKLOADS[name](device, backend)
    arm = getattr(call, "arm", None)
    checks = failures = 0
    marks = {}
    start = time.perf_counter()
    with mode():
        for i in range(calls + 3):  # 2 warmup calls, the capture, then `calls` replays
            checking = i >= 3 and (i - 3) % check_every == 0
            if arm is not None:
                arm(checking)
            inputs, out = call(i)
            cpu_work(i)
            if checking:
                checks += 1
                failures += not check(inputs, out)
            if i == 3 + calls // 100:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                marks["early"] = (torch.cuda.memory_allocated() if device.type == "cuda" else 0, rss_mib())
    if device.type == "cuda":
        torch.cuda.synchronize()
    marks["end"] = (torch.cuda.memory_allocated() if device.type == "cuda" else 0, rss_mib())
    seconds = time.perf_counter() - start
    return {
        "workload": name,
        "replays": g.stats.replays - 1,
        "captures": g.stats.captures,
        "checks": checks,
        "check_failures": failures,
        "device_bytes_early": marks["early"][0],
        "device_bytes_end": marks["end"][0],
        "rss_mib_early": round(marks["early"][1], 1),
        "rss_mib_end": round(marks["end"][1], 1),
        "seconds": round(seconds, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--check-every", type=int, default=10_000)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    backend = "cuda" if cuda else "simulate"
    warnings.simplefilter("ignore")  # no-CUDA notices on CPU smoke runs
    results = [soak(w, args.calls, args.check_every, device, backend) for w in args.workloads.split(",")]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "soak.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
                   "results": results}, f, indent=2)
    print("| workload | replays | checks (failed) | device MiB early → end | RSS MiB early → end | s |")
    print("|---|---|---|---|---|---|")
    ok = True
    for r in results:
        grew_dev = r["device_bytes_end"] - r["device_bytes_early"]
        grew_rss = r["rss_mib_end"] - r["rss_mib_early"]
        ok &= r["check_failures"] == 0 and grew_dev <= 1 << 20 and grew_rss < 64
        print(f"| {r['workload']} | {r['replays']:,} | {r['checks']} ({r['check_failures']}) | "
              f"{r['device_bytes_early'] / 2**20:.2f} → {r['device_bytes_end'] / 2**20:.2f} | "
              f"{r['rss_mib_early']} → {r['rss_mib_end']} | {r['seconds']} |")
    print("flat and equal to eager" if ok else "FAILED: memory grew or a check failed")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
