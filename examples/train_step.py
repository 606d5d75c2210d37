"""A whole train step as one CUDA graph: critic and actor updates with Adam.

    python examples/train_step.py [--steps N]

``loss.backward()`` and ``optimizer.step()`` run inside the wrapped function; the
optimizers are created with ``capturable=True``. The graphed run is compared with
an eager run from the same initial weights on the same batches.
"""

import argparse
import copy
import time
import warnings

import torch
from torch import nn

from graphmodule import CudaGraphModule

OBS, ACT, BATCH = 17, 6, 256


def make_step(critic, actor):
    # capturable=True keeps the optimizer's step counts on the GPU, as a graph needs
    capturable = next(critic.parameters()).is_cuda
    # (on a CPU: fused, whose step counts stay tensors, which a simulated graph needs)
    q_opt = torch.optim.Adam(critic.parameters(), lr=3e-4, capturable=capturable, fused=not capturable)
    a_opt = torch.optim.Adam(actor.parameters(), lr=3e-4, capturable=capturable, fused=not capturable)

    def step(obs, act, target):
        q_loss = (critic(torch.cat([obs, act], -1)) - target).pow(2).mean()
        q_opt.zero_grad()
        q_loss.backward()
        q_opt.step()
        a_loss = -critic(torch.cat([obs, actor(obs)], -1)).mean()
        a_opt.zero_grad()
        a_loss.backward()
        a_opt.step()
        return q_loss.detach(), a_loss.detach()

    return step


def train(step, batches, device):
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    losses = [step(*batch) for batch in batches]
    sync()
    return (time.perf_counter() - start) / len(batches) * 1e6, losses


def main(steps: int = 200) -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        print("CUDA is not available: graphmodule runs eagerly here (same results, same checks).")
    torch.manual_seed(0)
    critic = nn.Sequential(nn.Linear(OBS + ACT, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
    actor = nn.Sequential(nn.Linear(OBS, 256), nn.ReLU(), nn.Linear(256, ACT), nn.Tanh())
    critic, actor = critic.to(device), actor.to(device)
    critic_ref, actor_ref = copy.deepcopy(critic), copy.deepcopy(actor)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graphed = CudaGraphModule(make_step(critic, actor), warmup=3)
    eager = make_step(critic_ref, actor_ref)

    gen = torch.Generator(device=device).manual_seed(1)
    batches = [
        (torch.randn(BATCH, OBS, device=device, generator=gen),
         torch.rand(BATCH, ACT, device=device, generator=gen) * 2 - 1,
         torch.randn(BATCH, 1, device=device, generator=gen))
        for _ in range(steps)
    ]
    eager_us, eager_losses = train(eager, batches, device)
    graphed_us, graphed_losses = train(graphed, batches, device)
    loss_diff = max(abs(a.item() - b.item()) for ga, ea in zip(graphed_losses, eager_losses) for a, b in zip(ga, ea))
    weight_diff = max((p - q).abs().max().item() for p, q in zip(critic.parameters(), critic_ref.parameters()))
    if graphed.stats.replays:
        print(f"{steps} steps: eager {eager_us:.0f} us/step, graphed {graphed_us:.0f} us/step "
              f"({eager_us / graphed_us:.1f}x)")
    elif device.type == "cpu":
        print(f"{steps} steps: no CUDA: ran eagerly, no speed-up measured")
    else:  # fewer steps than the warmup calls: never captured
        print(f"{steps} steps: all of them warmup calls, nothing captured: no speed-up measured")
    print(f"max |loss graphed - eager| = {loss_diff:.2e}; max |critic weight diff| = {weight_diff:.2e}; "
          f"stats: {graphed.stats.warmup_calls} warmup, {graphed.stats.captures} capture, {graphed.stats.replays} replays")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    main(parser.parse_args().steps)
