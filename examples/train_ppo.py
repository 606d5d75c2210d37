"""PPO on the batched torch Pendulum, eagerly, as CUDA graphs, compiled, or both.

    python examples/train_ppo.py --mode graph --out results/
    python examples/train_ppo.py --mode eager --envs 64 --steps 400000 --seed 1
    python examples/train_ppo.py --smoke --mode graph       # a few seconds on a CPU

``--mode``:

- ``eager``: plain PyTorch.
- ``graph``: ``graphmodule.CudaGraphModule`` around the three hot functions: the policy step
  (one call per env step), GAE (one per rollout) and the PPO update (one per minibatch: loss,
  ``backward()``, gradient clipping and ``Adam.step()``, Adam with ``capturable=True``).
- ``compile``: ``torch.compile`` on the same three functions.
- ``compile+graph``: ``torch.compile`` inside the wrapper (compiled during the warmup calls).

Without CUDA the graph modes still run: graphmodule warns once and calls the functions
eagerly (with its input checks), so they train exactly like ``eager``.

Everything stays on the device: the environment is ``examples.envs.Pendulum`` (tensor ops,
no host synchronisation), actions are sampled as ``loc + scale * torch.randn_like(loc)``
(capturable: fresh noise at every replay), and the learning rate is a tensor annealed in
place outside the graphs. The host reads the device only to report progress (once per
``--log-every`` iterations).

Output: a progress bar (tqdm if installed, else a printed line now and then) with env steps/s
and the mean return of the latest finished episodes; with ``--out DIR``,
``DIR/train_ppo_<mode>.csv`` (wall_seconds, env_steps, mean_return) and ``DIR/train_ppo.png``
(mean return against wall-clock seconds for every ``train_ppo_*.csv`` in DIR; needs
matplotlib). Last, one summary line, with the return of a uniformly random policy on the
same environment for comparison (about -1200 on Pendulum). Wall-clock time counts
everything from the first rollout on: warmup, graph capture and compilation included.

Observed on CPU (2 cores, torch 2.13 CPU build, ``--mode eager``, default settings: 32 envs,
64-step rollouts, 10 epochs of 256-sample minibatches, lr 1e-3 annealed, 150 iterations =
307 200 env steps, seed 0): 36 s in all, about 8 600 env steps/s. The mean return of the
finished training episodes went from -1 065 (first episodes; random policy: -1 263) to -742
after 27 000 steps and -196 after 45 000 (6 s), then wandered between -200 and -340 with one
dip to -757 around 160 000 steps (PPO on Pendulum without state-dependent exploration is not
monotone), and ended at -245; the final policy's mean action scored -199. ``--mode graph``
without CUDA trains identically (eager fallback). ``--mode compile`` compiles for the CPU
(some 20 s of compilation in a smoke run) and trains on different random numbers. GPU numbers
are still to be measured.
"""

from __future__ import annotations

import math
import os
import sys

if __package__ in (None, ""):  # run as a file: make ``examples`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from tensordict import TensorDict, from_module
from torch import nn

from examples.envs import Pendulum
from examples.training import Report, parse_flags, run_training, wrap

SCRIPT, ALGO = "train_ppo", "PPO"

# --envs, --steps and the rest; --smoke swaps in tiny sizes (explicit flags still win)
DEFAULTS = dict(envs=32, steps=307_200, rollout=64, minibatch=256, epochs=10, hidden=64, log_every=1)
SMOKE = dict(envs=4, steps=4 * 32 * 20, rollout=32, minibatch=32, epochs=2, hidden=16, log_every=2)
# this script's own flags (integers; --help lists them between --steps and --seed)
FLAGS = {
    "--rollout": f"steps per env per iteration (default {DEFAULTS['rollout']})",
    "--minibatch": f"default {DEFAULTS['minibatch']}",
    "--epochs": f"default {DEFAULTS['epochs']}",
    "--hidden": f"hidden units (default {DEFAULTS['hidden']})",
    "--log-every": "iterations between progress reports (each reads the device)",
}
GAMMA, LMBDA = 0.9, 0.95  # rl-zoo's Pendulum settings: gamma 0.9, lr 1e-3
LR, CLIP, VF_COEF, MAX_GRAD_NORM = 1e-3, 0.2, 0.5, 0.5
REWARD_SCALE = 0.1  # the losses see reward * 0.1 (Pendulum's rewards reach -16 per step)
LOG_2PI = math.log(2 * math.pi)


# -- the agent ----------------------------------------------------------------------------------

def mlp(n_in: int, hidden: int, n_out: int, device) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, hidden, device=device), nn.Tanh(),
                         nn.Linear(hidden, hidden, device=device), nn.Tanh(),
                         nn.Linear(hidden, n_out, device=device))


def gaussian_log_prob(x: torch.Tensor, loc: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    return (-0.5 * ((x - loc) / log_std.exp()).pow(2) - log_std - 0.5 * LOG_2PI).sum(-1)


class Agent(nn.Module):
    """A Gaussian policy (state-independent log std) squashed by tanh, and a value network."""

    def __init__(self, hidden: int, device) -> None:
        super().__init__()
        self.actor = mlp(Pendulum.obs_dim, hidden, Pendulum.act_dim, device)
        self.log_std = nn.Parameter(torch.full((Pendulum.act_dim,), -0.5, device=device))
        self.critic = mlp(Pendulum.obs_dim, hidden, 1, device)

    def act(self, obs: torch.Tensor):
        """Sample an action. ``loc + scale * randn_like(loc)`` rather than a distribution's
        ``sample()``: ``torch.normal`` checks ``scale >= 0`` on the host, which a CUDA graph
        cannot capture. The log-prob is the pre-tanh one: the tanh Jacobian cancels in PPO's
        probability ratio."""
        loc = self.actor(obs)
        raw = loc + self.log_std.exp() * torch.randn_like(loc)
        action = Pendulum.max_torque * raw.tanh()
        return action, raw, gaussian_log_prob(raw, loc, self.log_std), self.critic(obs).squeeze(-1)

    def mean_action(self, obs: torch.Tensor) -> torch.Tensor:
        return Pendulum.max_torque * self.actor(obs).tanh()

    def losses(self, obs, raw, logprob, advantages, returns):
        logratio = gaussian_log_prob(raw, self.actor(obs), self.log_std) - logprob
        ratio = logratio.exp()
        adv = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        policy_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - CLIP, 1 + CLIP)).mean()
        value_loss = 0.5 * (self.critic(obs).squeeze(-1) - returns).pow(2).mean()
        approx_kl = ((ratio - 1) - logratio).mean().detach()
        return policy_loss, value_loss, approx_kl


# -- training ---------------------------------------------------------------------------------

def train(args) -> None:
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    env = Pendulum(args.envs, device, seed=args.seed)
    agent = Agent(args.hidden, device)
    # The rollout's copy of the agent: the same storage, detached (no autograd history)
    agent_inference = Agent(args.hidden, device)
    from_module(agent).data.to_module(agent_inference)
    agent_inference.requires_grad_(False)

    frames = args.envs * args.rollout
    if frames % args.minibatch:
        raise SystemExit(f"--envs x rollout ({frames}) must be a multiple of the minibatch ({args.minibatch}): "
                         "one shape, one graph")
    iterations = max(1, args.steps // frames)
    # a tensor learning rate, annealed in place: a graph reads it at every replay
    # (a Python float changed after the capture would be a StaleGraphError)
    lr = torch.tensor(LR, device=device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5, capturable=device.type == "cuda")

    def policy(obs):
        return agent_inference.act(obs)

    def gae(container):
        next_value = agent_inference.critic(container["next_obs"]).squeeze(-1)
        not_terminated = (~container["terminated"]).float()
        not_done = (~container["done"]).float()
        delta = REWARD_SCALE * container["reward"] + GAMMA * next_value * not_terminated - container["value"]
        advantages, last = [], torch.zeros_like(delta[0])
        for t in range(delta.shape[0] - 1, -1, -1):
            last = delta[t] + GAMMA * LMBDA * not_done[t] * last
            advantages.append(last)
        container["advantages"] = torch.stack(advantages[::-1])
        container["returns"] = container["advantages"] + container["value"]
        return container

    def update(obs, raw, logprob, advantages, returns):
        optimizer.zero_grad()
        policy_loss, value_loss, approx_kl = agent.losses(obs, raw, logprob, advantages, returns)
        (policy_loss + VF_COEF * value_loss).backward()
        nn.utils.clip_grad_norm_(agent.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        return policy_loss.detach(), value_loss.detach(), approx_kl

    backend = dict(backend=args.graph_backend)
    policy = wrap(policy, args.mode, **backend)
    gae = wrap(gae, args.mode, **backend)
    update = wrap(update, args.mode, warmup=5, **backend)

    report = Report(args, iterations, frames, SCRIPT, ALGO)
    td = env.reset()
    for iteration in report:  # counts the env steps; reports progress every --log-every iterations
        lr.fill_(LR * (1 - iteration / iterations))
        transitions = []
        with torch.no_grad():
            for _ in range(args.rollout):
                action, raw, logprob, value = policy(td["observation"])
                td["action"] = action
                td, next_td = env.step_and_maybe_reset(td)
                transitions.append(TensorDict(
                    obs=td["observation"], raw=raw, logprob=logprob, value=value,
                    next_obs=td["next", "observation"], reward=td["next", "reward"].squeeze(-1),
                    done=td["next", "done"].squeeze(-1), terminated=td["next", "terminated"].squeeze(-1),
                    batch_size=[args.envs]))
                report.add_episodes(td)
                td = next_td
            container = gae(torch.stack(transitions))  # [rollout, envs]
        flat = container.reshape(-1)
        for _ in range(args.epochs):
            for index in torch.randperm(frames, device=device).split(args.minibatch):
                batch = flat[index]
                update(batch["obs"], batch["raw"], batch["logprob"], batch["advantages"], batch["returns"])
    report.finish(dict(policy=policy, gae=gae, update=update), agent_inference.mean_action)


def main(argv=None) -> None:
    run_training(parse_flags(argv, __doc__, SCRIPT, DEFAULTS, SMOKE, FLAGS), train)


if __name__ == "__main__":
    main()
