"""PPO on the batched Pendulum, in the shape of the published PPO scripts.

- Policy (LeanRL ppo_continuous_action_torchcompile.py): a copy of the agent whose
  parameters are detached views of the trained ones (``from_module(agent).data``), its
  ``act`` method wrapped and called with keyword arguments, ``policy(obs=obs)``.
- GAE: a function over the rollout's TensorDict, wrapped too (``gae(container)``).
- ``variant="closure"`` (TorchRL sota-implementations/ppo/ppo_mujoco.py): ``update(batch,
  num_network_updates)`` with a tensor counter that anneals the learning rate and the clip
  epsilon inside the graph, wrapped as ``wrap(update, in_keys=[], out_keys=[], warmup=5)``.
- ``variant="tdmodule"`` (LeanRL): the update is a ``TensorDictModule`` called as
  ``update(minibatch, tensordict_out=TensorDict())``; the learning rate is a tensor
  annealed in place outside the graph.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from tensordict import TensorDict, from_module
from tensordict.nn import TensorDictModule
from torch import nn
from torch.distributions import Normal

from examples.common.envs import Pendulum

from .common import Clock, step_flags, episode_return, finish, mlp, seed_everything

LOSS_KEYS = ("loss_objective", "loss_critic", "loss_entropy", "approx_kl", "grad_norm")


@dataclass
class PPOConfig:
    variant: str = "closure"  # or "tdmodule"
    num_envs: int = 32
    rollout: int = 64  # steps per env per iteration
    minibatch: int = 256
    epochs: int = 4
    hidden: int = 64
    lr: float = 1e-3
    gamma: float = 0.9  # rl-zoo's Pendulum settings: gamma 0.9, lr 1e-3
    lmbda: float = 0.95
    reward_scale: float = 0.1  # the losses see reward * reward_scale (a RewardScaling transform)
    clip: float = 0.2
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    max_episode_steps: int = 200
    burnin: int = 3  # iterations before the clock starts (gae captures at its third call)


class Agent(nn.Module):
    def __init__(self, hidden: int, device) -> None:
        super().__init__()
        self.actor = mlp(Pendulum.obs_dim, hidden, Pendulum.act_dim, nn.Tanh, device)
        self.log_std = nn.Parameter(torch.full((1, Pendulum.act_dim), -0.5, device=device))
        self.critic = mlp(Pendulum.obs_dim, hidden, 1, nn.Tanh, device)

    def dist(self, obs):
        loc = self.actor(obs)
        return Normal(loc, self.log_std.exp().expand_as(loc), validate_args=False)

    def act(self, obs):
        """A tanh-squashed Gaussian action; the log-prob is the pre-tanh one (PPO's ratio
        is the same either way: the tanh Jacobian cancels)."""
        dist = self.dist(obs)
        # rsample, not sample: Normal.sample() calls torch.normal(loc, std), which checks on
        # the host that std >= 0 and so cannot be captured (graphmodule names this cause)
        raw = dist.rsample()
        return Pendulum.max_torque * raw.tanh(), raw, dist.log_prob(raw).sum(-1), self.critic(obs).squeeze(-1)

    def losses(self, obs, raw_action, logprob, advantages, returns, clip):
        dist = self.dist(obs)
        logratio = dist.log_prob(raw_action).sum(-1) - logprob
        ratio = logratio.exp()
        adv = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        objective = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)).mean()
        critic = 0.5 * (self.critic(obs).squeeze(-1) - returns).pow(2).mean()
        entropy = -dist.entropy().sum(-1).mean()
        approx_kl = ((ratio - 1) - logratio).mean().detach()
        return objective, critic, entropy, approx_kl


def run_ppo(wrap, *, steps: int, device, seed: int = 0, **config) -> dict:
    """``steps`` PPO iterations (rollout of ``rollout`` x ``num_envs`` steps, then updates)."""
    cfg = replace(PPOConfig(), **config)
    device = torch.device(device)
    seed_everything(seed)
    env = Pendulum(cfg.num_envs, device, seed=seed, max_steps=cfg.max_episode_steps)
    agent = Agent(cfg.hidden, device)
    agent_inference = Agent(cfg.hidden, device)
    from_module(agent).data.to_module(agent_inference)  # the same storage...
    agent_inference.requires_grad_(False)  # ...and no autograd history in the rollout
    frames = cfg.num_envs * cfg.rollout
    assert frames % cfg.minibatch == 0, "minibatches of one shape (one graph)"
    total_updates = steps * cfg.epochs * (frames // cfg.minibatch)

    policy = wrap(agent_inference.act)

    def gae(container):
        next_value = agent_inference.critic(container["next_obs"]).squeeze(-1)
        not_terminated = (~container["terminated"]).float()
        not_done = (~container["done"]).float()
        delta = cfg.reward_scale * container["reward"] + cfg.gamma * next_value * not_terminated - container["value"]
        advantages, last = [], torch.zeros_like(delta[0])
        for t in range(delta.shape[0] - 1, -1, -1):
            last = delta[t] + cfg.gamma * cfg.lmbda * not_done[t] * last
            advantages.append(last)
        container["advantages"] = torch.stack(advantages[::-1])
        container["returns"] = container["advantages"] + container["value"]
        return container

    gae = wrap(gae)
    if cfg.variant == "closure":  # TorchRL ppo_mujoco.py
        lr0 = torch.tensor(cfg.lr, device=device)
        clip_epsilon = torch.tensor(cfg.clip, device=device)
        optim = torch.optim.Adam(agent.parameters(), lr=lr0.clone(), eps=1e-5, **step_flags(device))

        def update(batch, num_network_updates):
            optim.zero_grad(set_to_none=True)
            alpha = 1 - num_network_updates / total_updates
            for group in optim.param_groups:
                group["lr"] = lr0 * alpha
            clip_epsilon.copy_(cfg.clip * alpha)
            num_network_updates = num_network_updates + 1
            objective, critic, entropy, approx_kl = agent.losses(
                batch["obs"], batch["raw_action"], batch["logprob"], batch["advantages"], batch["returns"],
                clip_epsilon)
            (objective + cfg.vf_coef * critic + cfg.ent_coef * entropy).backward()
            grad_norm = nn.utils.clip_grad_norm_(agent.parameters(), cfg.max_grad_norm)
            optim.step()
            losses = TensorDict(loss_objective=objective, loss_critic=critic, loss_entropy=entropy,
                                approx_kl=approx_kl, grad_norm=grad_norm)
            return losses.detach().set("alpha", alpha), num_network_updates

        update = wrap(update, in_keys=[], out_keys=[], warmup=5)
        num_network_updates = torch.zeros((), dtype=torch.int64, device=device)
    elif cfg.variant == "tdmodule":  # LeanRL ppo_continuous_action_torchcompile.py
        optim = torch.optim.Adam(agent.parameters(), lr=torch.tensor(cfg.lr, device=device), eps=1e-5,
                                 **step_flags(device))

        def update_fn(obs, raw_action, logprob, advantages, returns):
            optim.zero_grad()
            objective, critic, entropy, approx_kl = agent.losses(
                obs, raw_action, logprob, advantages, returns, cfg.clip)
            (objective + cfg.vf_coef * critic + cfg.ent_coef * entropy).backward()
            grad_norm = nn.utils.clip_grad_norm_(agent.parameters(), cfg.max_grad_norm)
            optim.step()
            return objective.detach(), critic.detach(), entropy.detach(), approx_kl, grad_norm

        update = wrap(TensorDictModule(update_fn, in_keys=["obs", "raw_action", "logprob", "advantages", "returns"],
                                       out_keys=list(LOSS_KEYS)))
    else:
        raise ValueError(f"unknown variant {cfg.variant!r}")

    metrics = {k: [] for k in ("reward", "episode_return", *LOSS_KEYS)}
    clock = Clock(device)
    td = env.reset()
    for iteration in range(steps):
        if iteration == cfg.burnin:
            clock.begin()
        if cfg.variant == "tdmodule":  # anneal the tensor learning rate in place
            optim.param_groups[0]["lr"].copy_((1 - iteration / steps) * cfg.lr)
        # rollout
        transitions = []
        for _ in range(cfg.rollout):
            action, raw, logprob, value = policy(obs=td["observation"])
            td["action"] = action
            td, next_td = env.step_and_maybe_reset(td)
            transitions.append(TensorDict(
                obs=td["observation"], raw_action=raw, logprob=logprob, value=value,
                next_obs=td["next", "observation"], reward=td["next", "reward"].squeeze(-1),
                done=td["next", "done"].squeeze(-1), terminated=td["next", "terminated"].squeeze(-1),
                episode_reward=td["next", "episode_reward"].squeeze(-1), batch_size=[cfg.num_envs]))
            td = next_td
        container = torch.stack(transitions)  # [rollout, num_envs]
        metrics["reward"].append(container["reward"].mean())
        metrics["episode_return"].append(episode_return(container["episode_reward"], container["done"]))
        clock.tick(frames)
        # advantages, then minibatch epochs
        with torch.no_grad():
            container = gae(container)
        flat = container.reshape(-1)
        losses = []
        for _ in range(cfg.epochs):
            for index in torch.randperm(frames, device=device).split(cfg.minibatch):
                batch = flat[index]
                if cfg.variant == "closure":
                    out, num_network_updates = update(batch, num_network_updates=num_network_updates)
                else:
                    out = update(batch, tensordict_out=TensorDict())
                losses.append(torch.stack([out[k] for k in LOSS_KEYS]))
        for key, value in zip(LOSS_KEYS, torch.stack(losses).mean(0)):
            metrics[key].append(value)
    return finish(metrics, clock.stop("env step"))
