"""PPO on a batched torch Pendulum: a whole training iteration as one CUDA graph.

    python examples/train_ppo.py --mode graph --out results/      # then: benchmarks/results_table.py results/
    python examples/train_ppo.py --mode eager --envs 1 --rollout 1024 --minibatch 64
    python examples/train_ppo.py --smoke --mode graph              # a few seconds on a CPU

``--mode graph`` wraps one function, ``iteration``, in ``graphmodule.CudaGraphModule``: the
rollout (policy, env step and auto-reset, storage), GAE and every epoch's minibatch updates
(Adam with ``capturable=True``), replayed once per iteration without a host synchronisation.
``eager`` runs the same function unwrapped, ``compile`` uses ``torch.compile``,
``compile+graph`` compiles inside the graph. Without CUDA the graph modes run eagerly (same
training). The run shows a progress bar and ends with a summary line (env steps/s, final
return, time to ``--threshold``); ``--out DIR`` writes a CSV, a JSON summary and a plot.
How it is built, and results on a GPU: docs/rl-guide.md.
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

from examples.common.envs import Pendulum
from examples.common.training import Report, compiled, graphed, parse_flags, run_training, wrap

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
    # for every parameter's update instead of a dozen multi-tensor kernels; a CPU: fused (the
    # step count stays a tensor, which a simulated graph needs)
    optimizer = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5, capturable=cuda,
                                 fused=True if not (cuda and compiling) else None)
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
