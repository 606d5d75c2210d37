"""PPO on the batched torch Pendulum, eagerly, as CUDA graphs, compiled, or both.

    python examples/train_ppo.py --mode graph --out results/
    python examples/train_ppo.py --mode eager --envs 1 --rollout 1024 --minibatch 64 --max-seconds 60
    python examples/train_ppo.py --smoke --mode graph       # a few seconds on a CPU

``--mode``:

- ``eager``: plain PyTorch.
- ``graph``: ``graphmodule.CudaGraphModule`` around one function, ``iteration``: a whole PPO
  iteration as one CUDA graph, replayed once per iteration with no host synchronisation. It
  holds the learning rate's annealing step (a device tensor computed from a device counter),
  the rollout (``--rollout`` steps of policy, env step and auto-reset), the rollout's storage,
  GAE, the finished episodes' returns counted on the device, and then ``--epochs`` passes over
  the rollout in shuffled minibatches, each one update (loss, ``backward()``, gradient
  clipping, ``Adam.step()``; Adam with ``capturable=True``, fused). The shuffles are drawn on
  the device (``argsort`` of ``torch.rand``) and the minibatches gathered with
  ``index_select``, inside the graph. Outside it: the loop and the progress report.
- ``compile``: ``torch.compile`` on one env step (policy and env) and on the update. Not on
  GAE: dynamo would unroll its loop over the rollout, which takes minutes to compile for long
  rollouts.
- ``compile+graph``: the same compiled functions inside the iteration graph (compiled during
  the warmup calls).

``eager`` runs the very function the graph modes wrap. Without CUDA the graph modes still
run: graphmodule warns once and calls the function eagerly (with its input checks), so they
train exactly like ``eager``; ``--graph-backend simulate`` runs graphmodule's capture and replay
machinery on the CPU instead, with the same result.

An iteration can be one graph because everything it touches stays on the device and in place:
``examples.envs.Pendulum`` is tensor operations only (no host synchronisation; its state is
updated in place and its reset states come from torch's default generator), the rollout's
noise is ``torch.randn`` (actions are ``loc + scale * noise`` squashed by tanh;
``torch.distributions`` would check ``scale`` on the host), the episode counters, the learning
rate and its counter are device tensors written in place, and Adam's step counts live on the
device (``capturable=True``). Every random number (noise, resets, shuffles) comes from torch's
default generator, which a CUDA graph registers by itself and advances at every replay: each
replay draws fresh numbers. The host reads the device only to report progress (once per
``--log-every`` iterations). At one env a graphed step costs a few microseconds per kernel,
whatever the work, so the rollout step is written in few kernels (the noise drawn for the
whole rollout at once, the scale computed once, ``addcmul``; see also ``Pendulum.step``).

A rollout lasts one whole episode (200 steps) by default: the envs start together and
Pendulum truncates them all at step 200, so a shorter rollout of many envs trains on one phase
of the episode at a time (all swing-up, then all balancing) and forgets the other; in runs on
CPU, 256 envs with 16-step rollouts hovered between -200 and -600 for a million steps, and with
200-step rollouts climbed steadily past -200. With one env, a rollout of 1024 steps spans five
episodes; ``--envs 1 --rollout 1024 --minibatch 64`` (``scripts/gpu_examples.sh``) runs 160
updates per 1024 env steps, the ratio of CleanRL's ``ppo_continuous_action`` (2048 steps, 32
minibatches, 10 epochs).

Output: a progress bar (tqdm if installed, else a printed line now and then) with env steps/s
and the mean return of the latest finished episodes. With ``--out DIR``:
``DIR/train_ppo_<mode>.csv`` (wall_seconds, env_steps, mean_return),
``DIR/train_ppo_<mode>_summary.json`` (what the summary line says, with the device, the torch
version, the graphs' counters and the settings) and ``DIR/train_ppo.png`` (mean return against
wall-clock seconds for every ``train_ppo_*.csv`` in DIR; needs matplotlib). Last, one summary
line: steps/s, the final return, the return of a uniformly random policy on the same
environment (about -1260), and when the return first reached ``--threshold`` (default -200:
the mean of the latest 10 or more finished episodes), in seconds and env steps.
Wall-clock time counts everything from the first rollout on: warmup, graph capture and
compilation included; ``steady_steps_per_s`` counts from the report after the third
iteration (warmup, capture and compilation done) to the last report. ``--max-seconds S`` ends
the run early (at the first report after S).

Observed on CPU (2 cores shared with other work, torch 2.13 CPU build, ``--mode eager``, default
settings: 64 envs, 200-step rollouts, 10 epochs of 512-sample minibatches, lr 1e-3 annealed,
40 iterations = 512 000 env steps, seed 0): 253 s in all, about 2 000 env steps/s (an idle CPU
ran an earlier version of this script in 48 s). The mean return of the finished training
episodes rose from -1 161 (first episodes; random policy: -1 263) through -667 at 102 400 steps
to -171 at 166 400 (the threshold), stayed between -153 and -205 after that, and ended at -159;
the final policy's mean action scored -160.
A run with ``--envs 1 --rollout 1024 --minibatch 64`` (eagerly, on the same CPU) reached the
threshold at 27 648 env steps. GPU numbers: see benchmarks/RESULTS.md
(``scripts/gpu_examples.sh`` runs every mode with one env and with many).
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
from examples.training import Report, compiled, graphed, parse_flags, run_training, wrap

SCRIPT, ALGO = "train_ppo", "PPO"

# --envs, --steps and the rest; --smoke swaps in tiny sizes (explicit flags still win)
DEFAULTS = dict(envs=64, steps=512_000, rollout=200, minibatch=512, epochs=10, hidden=64, log_every=1)
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

    def act(self, obs: torch.Tensor, scale: torch.Tensor, noise: torch.Tensor):
        """An action and its pre-tanh value: ``(action, raw)``, ``raw = loc + scale * noise``,
        ``scale = log_std.exp()`` and ``noise`` standard normal, both given: a rollout draws
        the noise of all its steps at once and computes the scale once (fewer kernels per
        step). Not a distribution's ``sample()``: ``torch.normal`` checks ``scale >= 0`` on the
        host, which a CUDA graph cannot capture. The log-prob (:meth:`noise_log_prob`) and the
        value are computed for the whole rollout at once, after it."""
        raw = torch.addcmul(self.actor(obs), scale, noise)
        return raw.tanh().mul_(Pendulum.max_torque), raw

    def noise_log_prob(self, noise: torch.Tensor) -> torch.Tensor:
        """The log-prob of ``raw = loc + scale * noise`` (``gaussian_log_prob(raw, loc, log_std)``
        without ``loc``). Pre-tanh: the tanh Jacobian cancels in PPO's probability ratio."""
        return (-0.5 * noise.pow(2) - self.log_std - 0.5 * LOG_2PI).sum(-1)

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

UPDATE_KEYS = ("obs", "raw", "logprob", "advantages", "returns")  # what the minibatch updates read


def train(args) -> None:
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    # seed=None: the reset states come from torch's default generator (seeded above), the one
    # generator a CUDA graph registers by itself; the iteration graph replays the env's resets too
    env = Pendulum(args.envs, device, seed=None)
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
    # The learning rate, annealed linearly to 0 over the run, is a device tensor that the
    # iteration itself updates from a device counter: a graph reads and writes both at every
    # replay (a Python float changed after the capture would be a StaleGraphError).
    lr = torch.tensor(LR, device=device)
    iterations_done = torch.zeros((), device=device)
    cuda, compiling = device.type == "cuda", args.mode in ("compile", "compile+graph")
    # CUDA: capturable (its step count stays on the device) and, uncompiled, fused: one kernel
    # for every parameter's update instead of a dozen multi-tensor kernels
    optimizer = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5, capturable=cuda,
                                 fused=True if cuda and not compiling else None)
    # steady speed: from the report after the third iteration (warmup, capture, compilation done)
    report = Report(args, iterations, frames, SCRIPT, ALGO, burn_in=3)

    def env_step(obs, scale, noise):
        """One step of every env under the current policy; the transition and the next observation."""
        action, raw = agent_inference.act(obs, scale, noise)
        td, next_td = env.step_and_maybe_reset(TensorDict(observation=obs, action=action, batch_size=[args.envs]))
        transition = TensorDict(
            obs=obs, raw=raw, next_obs=td["next", "observation"],
            reward=td["next", "reward"].squeeze(-1), done=td["next", "done"].squeeze(-1),
            terminated=td["next", "terminated"].squeeze(-1), episode_reward=td["next", "episode_reward"].squeeze(-1),
            batch_size=[args.envs])
        return transition, next_td["observation"]

    def gae(container):
        """The log-probs, values, advantages and returns of a rollout ([rollout, envs])."""
        container["logprob"] = agent_inference.noise_log_prob(container["noise"])
        value = container["value"] = agent_inference.critic(container["obs"]).squeeze(-1)
        next_value = agent_inference.critic(container["next_obs"]).squeeze(-1)
        not_terminated = (~container["terminated"]).float()
        discount = GAMMA * LMBDA * (~container["done"]).float()
        delta = REWARD_SCALE * container["reward"] + GAMMA * next_value * not_terminated - value
        advantages, last = [], torch.zeros_like(delta[0])
        for t in range(delta.shape[0] - 1, -1, -1):
            last = torch.addcmul(delta[t], discount[t], last)  # one kernel a step
            advantages.append(last)
        container["advantages"] = torch.stack(advantages[::-1])
        container["returns"] = container["advantages"] + value
        return container

    # GAE stays uncompiled: dynamo would unroll its loop over the rollout (minutes of
    # compilation for a 1024-step rollout); inside the iteration graph it costs no launches
    env_step = compiled(env_step, args.mode)

    @torch.no_grad()
    def collect():
        """``--rollout`` steps of every env, their advantages, and the finished episodes
        counted; returns the updates' inputs, flattened to [envs x rollout, ...]. It reads the
        env, the agent and the counters from their own memory and updates them in place, so
        every call continues where the last one stopped; the Python ``for`` is unrolled into
        the graph. The rollout's noise is drawn at once, and the policy's scale computed once."""
        obs = env.observation()
        noise = torch.randn(args.rollout, args.envs, Pendulum.act_dim, device=device)
        scale = agent_inference.log_std.exp()
        transitions = []
        for t in range(args.rollout):
            transition, obs = env_step(obs, scale, noise[t])
            transitions.append(transition)
        container = torch.stack(transitions)  # [rollout, envs]
        container["noise"] = noise
        gae(container)
        report.add_episodes(container["done"], container["episode_reward"])
        return [container[key].reshape(frames, *container[key].shape[2:]) for key in UPDATE_KEYS]

    def update(obs, raw, logprob, advantages, returns):
        optimizer.zero_grad()
        policy_loss, value_loss, approx_kl = agent.losses(obs, raw, logprob, advantages, returns)
        (policy_loss + VF_COEF * value_loss).backward()
        nn.utils.clip_grad_norm_(agent.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        return policy_loss.detach(), value_loss.detach(), approx_kl

    update = compiled(update, args.mode)

    def iteration():
        """One whole PPO iteration: the learning rate's annealing step, the rollout and GAE
        (``collect``), then ``--epochs`` passes over it in shuffled minibatches, each one
        update. In the graph modes this function is one CUDA graph, replayed once per
        iteration with no host synchronisation: the shuffles are drawn on the device
        (``argsort`` of ``torch.rand``, from torch's default generator, which the graph
        replays afresh) and the minibatches gathered with ``index_select``."""
        torch.mul(iterations_done, -LR / iterations, out=lr).add_(LR)  # LR * (1 - done / iterations)
        iterations_done.add_(1)
        batch = collect()
        for _ in range(args.epochs):
            order = torch.rand(frames, device=device).argsort()
            for index in order.split(args.minibatch):
                update(*(x.index_select(0, index) for x in batch))

    # compiled functions need a second warmup call (a recompilation once the optimizer has state)
    iteration = graphed(iteration, args.mode, warmup=2 if compiling else 1, backend=args.graph_backend)

    env.reset()
    for _ in report:  # counts the env steps; reports progress every --log-every iterations
        iteration()
    report.finish(dict(iteration=iteration), agent_inference.mean_action)


def main(argv=None) -> None:
    run_training(parse_flags(argv, __doc__, SCRIPT, DEFAULTS, SMOKE, FLAGS), train)


if __name__ == "__main__":
    main()
