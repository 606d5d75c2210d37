"""An RL policy as a TensorDict module: rollouts with TensorDicts, and keyword calls.

    python examples/rl_policy.py [--steps N]

The policy samples Gaussian actions (fresh noise at every replay) and writes
"loc", "scale" and "action" into the rollout's TensorDict, as tensordict's own
CudaGraphModule does; the same wrapper also answers ``policy(observation=obs)``.
"""

import argparse
import time
import warnings

import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn

from graphmodule import CudaGraphModule

OBS, ACT, ENVS = 17, 6, 16


def make_policy(device):
    net = nn.Sequential(nn.Linear(OBS, 128), nn.Tanh(), nn.Linear(128, 2 * ACT)).to(device)

    def split(params):
        loc, log_scale = params.chunk(2, -1)
        return loc, log_scale.clamp(-5, 2).exp()

    def sample(loc, scale):
        return (loc + scale * torch.randn_like(loc)).tanh()

    return TensorDictSequential(
        TensorDictModule(net, in_keys=["observation"], out_keys=["params"]),
        TensorDictModule(split, in_keys=["params"], out_keys=["loc", "scale"]),
        TensorDictModule(sample, in_keys=["loc", "scale"], out_keys=["action"]),
    )


def rollout(policy, steps, device):
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    td = TensorDict(observation=torch.randn(ENVS, OBS, device=device), batch_size=[ENVS], device=device)
    actions = []
    with torch.no_grad():
        policy(td.clone())  # first call out of the timing (lazy init; a warmup call when graphed)
    sync()
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(steps):
            policy(td)  # writes loc, scale and action into td
            actions.append(td["action"])
            td["observation"] = td["observation"] * 0.9 + 0.1 * td["action"].sum(-1, keepdim=True)
    sync()
    return (time.perf_counter() - start) / steps * 1e6, torch.stack(actions), td


def main(steps: int = 500) -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        print("CUDA is not available: graphmodule runs eagerly here (same results, same checks).")
    policy = make_policy(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graphed = CudaGraphModule(policy)
    print(f"in_keys={graphed.in_keys} out_keys={graphed.out_keys}")

    eager_us, _, _ = rollout(policy, steps, device)
    graphed_us, actions, last = rollout(graphed, steps, device)
    # The deterministic part must match eager; the noise must differ at each step.
    with torch.no_grad():
        ref = policy(last.select("observation").clone())
        graphed(last)
    loc_diff = (last["loc"] - ref["loc"]).abs().max().item()
    fresh = not torch.equal(actions[-1], actions[-2])
    if graphed.stats.replays:
        print(f"rollout of {steps} steps x {ENVS} envs: eager {eager_us:.1f} us/step, graphed {graphed_us:.1f} us/step "
              f"({eager_us / graphed_us:.1f}x)")
    else:
        print(f"rollout of {steps} steps x {ENVS} envs: no CUDA: ran eagerly, no speed-up measured")
    print(f"max |loc graphed - eager| = {loc_diff:.2e}; fresh noise at each replay: {fresh}")

    with torch.no_grad():
        obs = torch.randn(ENVS, OBS, device=device)
        policy_kw = CudaGraphModule(policy, backend="auto" if device.type == "cuda" else "eager")
        for _ in range(4):
            params, loc, scale, action = policy_kw(observation=obs)  # keyword call: returns out_keys
    print(f"keyword call returned {len(policy_kw.out_keys)} tensors; action shape {tuple(action.shape)}; "
          f"max |loc - eager| = {(loc - policy(observation=obs)[1]).abs().max().item():.2e}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=500)
    main(parser.parse_args().steps)
