"""TD3 on the batched Pendulum, in the shape of LeanRL's td3_continuous_action_torchcompile.py.

- Policy: ``actor_detach.explore`` (an actor copy with detached parameters, plus Gaussian
  exploration noise), wrapped and called with a keyword argument, ``policy(obs=obs)``.
- ``update_main(data)``: critics' loss with target policy smoothing (fresh noise at every
  call), ``q_optimizer.step()``. ``update_pol(data)``: the deterministic actor's loss.
  Both ``wrap(fn, in_keys=[], out_keys=[], warmup=5)``, returning TensorDicts.
- Delayed policy update: every ``policy_frequency`` steps, ``update_pol`` and then the
  target critics and target actor updated in place outside the graph (``lerp_``).

TorchRL's sota-implementations/td3/td3.py instead passes ``update_actor`` as a Python
bool to one graphed ``update``; a graph replays the branch it captured, so graphmodule keeps
a graph for each value of the bool (``max_graphs=None``, tests/test_variants.py) while
tensordict 0.15.3 warns and replays the captured branch; that shape is not used here.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from tensordict import TensorDict, from_module
from torch import nn

from examples.common.envs import Pendulum

from .common import Clock, ReplayBuffer, step_flags, finish, mlp, seed_everything, store_transition
from .sac import QNet, frozen


@dataclass
class TD3Config:
    num_envs: int = 4
    hidden: int = 128
    batch_size: int = 256
    buffer_size: int = 100_000
    learning_starts: int = 250  # batched env steps with random actions
    lr: float = 3e-4
    gamma: float = 0.99
    tau: float = 0.005
    exploration_noise: float = 0.1
    policy_noise: float = 0.2
    noise_clip: float = 0.5
    policy_frequency: int = 2
    max_episode_steps: int = 200
    burnin: int = 20  # steps after learning_starts before the clock starts (every update captured)


class Actor(nn.Module):
    def __init__(self, hidden: int, device, exploration_noise: float) -> None:
        super().__init__()
        self.net = mlp(Pendulum.obs_dim, hidden, Pendulum.act_dim, nn.ReLU, device)
        self.register_buffer("exploration_noise", torch.tensor(exploration_noise, device=device))

    def forward(self, obs):
        return Pendulum.max_torque * self.net(obs).tanh()

    def explore(self, obs):
        action = self(obs)
        return action + torch.randn_like(action).mul(Pendulum.max_torque * self.exploration_noise)


def run_td3(wrap, *, steps: int, device, seed: int = 0, **config) -> dict:
    """``steps`` batched env steps; one critic update per step after ``learning_starts``."""
    cfg = replace(TD3Config(), **config)
    device = torch.device(device)
    seed_everything(seed)
    env = Pendulum(cfg.num_envs, device, seed=seed, max_steps=cfg.max_episode_steps)
    actor = Actor(cfg.hidden, device, cfg.exploration_noise)
    actor_detach = Actor(cfg.hidden, device, cfg.exploration_noise)
    from_module(actor).data.to_module(actor_detach)
    actor_detach.requires_grad_(False)
    target_actor = copy.deepcopy(actor).requires_grad_(False)
    qnets = nn.ModuleList([QNet(cfg.hidden, device), QNet(cfg.hidden, device)])
    qnets_target = copy.deepcopy(qnets).requires_grad_(False)
    q_params, q_target_params = from_module(qnets).data, from_module(qnets_target).data
    actor_params, target_actor_params = from_module(actor).data, from_module(target_actor).data
    q_optimizer = torch.optim.Adam(qnets.parameters(), lr=cfg.lr, **step_flags(device))
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=cfg.lr, **step_flags(device))
    rb = ReplayBuffer(cfg.buffer_size, device)
    max_a = Pendulum.max_torque

    policy = wrap(actor_detach.explore)

    def update_main(data):
        obs, actions, next_obs = data["observations"], data["actions"], data["next_observations"]
        with torch.no_grad():
            noise = torch.randn_like(actions).mul(cfg.policy_noise).clamp(-cfg.noise_clip, cfg.noise_clip).mul(max_a)
            next_actions = (target_actor(next_obs) + noise).clamp(-max_a, max_a)
            next_q = torch.min(*(q(next_obs, next_actions) for q in qnets_target))
            target = data["rewards"] + (~data["dones"]).float() * cfg.gamma * next_q
        qf_loss = sum(F.mse_loss(q(obs, actions), target) for q in qnets)
        q_optimizer.zero_grad()
        qf_loss.backward()
        q_optimizer.step()
        return TensorDict(qf_loss=qf_loss.detach())

    def update_pol(data):
        obs = data["observations"]
        actor_optimizer.zero_grad()
        actor_loss = -frozen(qnets[0], obs, actor(obs)).mean()
        actor_loss.backward()
        actor_optimizer.step()
        return TensorDict(actor_loss=actor_loss.detach())

    update_main = wrap(update_main, in_keys=[], out_keys=[], warmup=5)
    update_pol = wrap(update_pol, in_keys=[], out_keys=[], warmup=5)

    metrics = {k: [] for k in ("reward", "episode_return", "qf_loss", "actor_loss")}
    clock = Clock(device)
    td = env.reset()
    for step in range(steps):
        if step == cfg.learning_starts + cfg.burnin:
            clock.begin()
        if step < cfg.learning_starts:
            td["action"] = (2 * torch.rand(cfg.num_envs, Pendulum.act_dim, device=device) - 1) * max_a
        else:
            td["action"] = policy(obs=td["observation"]).clamp(-max_a, max_a)
        td, next_td = env.step_and_maybe_reset(td)
        store_transition(rb, td, metrics)
        clock.tick(cfg.num_envs)
        if step >= cfg.learning_starts:
            data = rb.sample(cfg.batch_size)
            out = update_main(data)
            if step % cfg.policy_frequency == 0:
                out.update(update_pol(data))
                # lerp: x' = x + w (y - x), the in-place soft update of the targets
                q_target_params.lerp_(q_params, cfg.tau)
                target_actor_params.lerp_(actor_params, cfg.tau)
                metrics["actor_loss"].append(out["actor_loss"])
            metrics["qf_loss"].append(out["qf_loss"])
        td = next_td
    return finish(metrics, clock.stop("env step"))
