"""Quickstart: wrap a policy, call it as before, get a CUDA graph, and a clear error on bad input.

    python examples/quickstart.py [--calls N]

Without CUDA it says so, runs eagerly (same results) and still checks inputs.
"""

import argparse
import time
import warnings

import torch
from torch import nn

from graphmodule import CudaGraphModule, InputMismatchError


def per_call_us(fn, x, calls):
    fn(x)
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn(x)
    sync()
    return (time.perf_counter() - start) / calls * 1e6


def main(calls: int = 1000) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        print("CUDA is not available: graphmodule runs eagerly here (same results, same checks).")
    policy = nn.Sequential(nn.Linear(17, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 6), nn.Tanh())
    policy = policy.to(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the no-CUDA warning, printed above in plain words
        graphed = CudaGraphModule(policy)  # the one line

    with torch.no_grad():
        obs = torch.randn(1, 17, device=device)
        for _ in range(3):  # two warmup calls, then the capture
            graphed(obs)
        obs = torch.randn(1, 17, device=device)
        diff = (graphed(obs) - policy(obs)).abs().max().item()
        eager_us, graphed_us = per_call_us(policy, obs, calls), per_call_us(graphed, obs, calls)
    print(f"state: {graphed.state}; max |graphed - eager| = {diff:.2e}")
    if graphed.stats.replays:
        print(f"eager {eager_us:.1f} us/call, graphed {graphed_us:.1f} us/call ({eager_us / graphed_us:.1f}x)")
    else:
        print("no CUDA: ran eagerly, no speed-up measured")

    try:
        graphed(torch.randn(1, 17, device=device, dtype=torch.float64))
    except InputMismatchError as err:
        print("a float64 input is refused, not silently cast:\n" + str(err))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=1000)
    main(parser.parse_args().calls)
