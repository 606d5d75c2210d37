"""SAC on the batched Pendulum, in the shape of the published SAC scripts.

- Policy (LeanRL sac_continuous_action_torchcompile.py): ``TensorDictModule`` over the
  ``get_action`` of an actor copy with detached parameters, wrapped and called with the
  environment's TensorDict (``td = policy(td)`` writes the action into it).
- Replay buffer on the device, sampled outside the graph (``rb.sample()`` as in TorchRL's
  sota-implementations/sac/sac.py and LeanRL).
- ``update_main(data)``: critic loss, ``q_optimizer.step()`` and the target critics' update
  in place (``lerp_``, TorchRL's ``target_net_updater.step()``), all in the graph.
- ``update_pol(data)``: actor loss through the critics with detached parameters
  (``functional_call``; LeanRL swaps them in with ``to_module``), then the entropy
  temperature; ``alpha`` is a tensor refreshed in place outside the graph.
- Both updates are ``wrap(fn, in_keys=[], out_keys=[], warmup=5)``, return TensorDicts,
  and use Adam with ``capturable=True`` on CUDA (``fused=True`` on the CPU).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from tensordict import TensorDict, from_module
from tensordict.nn import TensorDictModule
from torch import nn
from torch.distributions import Normal

from examples.common.envs import Pendulum

from .common import Clock, ReplayBuffer, step_flags, finish, mlp, seed_everything, store_transition


@dataclass
class SACConfig:
    num_envs: int = 4
    hidden: int = 128
    batch_size: int = 256
    buffer_size: int = 100_000
    learning_starts: int = 250  # batched env steps with random actions
    gamma: float = 0.99
    tau: float = 0.005
    policy_lr: float = 3e-4
    q_lr: float = 1e-3
    policy_frequency: int = 2
    max_episode_steps: int = 200
    burnin: int = 20  # steps after learning_starts before the clock starts (every update captured)


class Actor(nn.Module):
    def __init__(self, hidden: int, device) -> None:
        super().__init__()
        self.trunk = mlp(Pendulum.obs_dim, hidden, 2 * Pendulum.act_dim, nn.ReLU, device)

    def get_action(self, obs):
        mean, log_std = self.trunk(obs).chunk(2, -1)
        log_std = -5 + 3.5 * (log_std.tanh() + 1)  # in [-5, 2]
        normal = Normal(mean, log_std.exp(), validate_args=False)
        x = normal.rsample()
        y = x.tanh()
        log_prob = normal.log_prob(x) - torch.log(Pendulum.max_torque * (1 - y.pow(2)) + 1e-6)
        return Pendulum.max_torque * y, log_prob.sum(-1, keepdim=True), Pendulum.max_torque * mean.tanh()


class QNet(nn.Module):
    def __init__(self, hidden: int, device) -> None:
        super().__init__()
        self.net = mlp(Pendulum.obs_dim + Pendulum.act_dim, hidden, 1, nn.ReLU, device)

    def forward(self, obs, action):
        return self.net(torch.cat([obs, action], -1))


def frozen(module: nn.Module, *args):
    """Call ``module`` with its parameters detached: gradients reach the inputs only."""
    params = {name: p.detach() for name, p in module.named_parameters()}
    return torch.func.functional_call(module, params, args)


def run_sac(wrap, *, steps: int, device, seed: int = 0, **config) -> dict:
    """``steps`` batched env steps; one critic update per step after ``learning_starts``."""
    cfg = replace(SACConfig(), **config)
    device = torch.device(device)
    seed_everything(seed)
    env = Pendulum(cfg.num_envs, device, seed=seed, max_steps=cfg.max_episode_steps)
    actor, actor_detach = Actor(cfg.hidden, device), Actor(cfg.hidden, device)
    from_module(actor).data.to_module(actor_detach)
    actor_detach.requires_grad_(False)
    qnets = nn.ModuleList([QNet(cfg.hidden, device), QNet(cfg.hidden, device)])
    qnets_target = copy.deepcopy(qnets).requires_grad_(False)
    q_params, q_target_params = from_module(qnets).data, from_module(qnets_target).data
    q_optimizer = torch.optim.Adam(qnets.parameters(), lr=cfg.q_lr, **step_flags(device))
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=cfg.policy_lr, **step_flags(device))
    target_entropy = -float(Pendulum.act_dim)
    log_alpha = torch.zeros(1, device=device, requires_grad=True)
    alpha = log_alpha.detach().exp()
    a_optimizer = torch.optim.Adam([log_alpha], lr=cfg.q_lr, **step_flags(device))
    rb = ReplayBuffer(cfg.buffer_size, device)

    policy = TensorDictModule(actor_detach.get_action, in_keys=["observation"],
                              out_keys=["action", "sample_log_prob", "loc"])
    policy = wrap(policy)

    def update_main(data):
        obs, action = data["observations"], data["actions"]
        with torch.no_grad():
            next_action, next_log_pi, _ = actor.get_action(data["next_observations"])
            next_q = torch.min(*(q(data["next_observations"], next_action) for q in qnets_target))
            target = data["rewards"] + (~data["dones"]).float() * cfg.gamma * (next_q - alpha * next_log_pi)
        qf_loss = sum(F.mse_loss(q(obs, action), target) for q in qnets)
        q_optimizer.zero_grad()
        qf_loss.backward()
        q_optimizer.step()
        q_target_params.lerp_(q_params, cfg.tau)  # target_net_updater.step()
        return TensorDict(qf_loss=qf_loss.detach())

    def update_pol(data):
        obs = data["observations"]
        actor_optimizer.zero_grad()
        pi, log_pi, _ = actor.get_action(obs)
        min_q = torch.min(*(frozen(q, obs, pi) for q in qnets))
        actor_loss = (alpha * log_pi - min_q).mean()
        actor_loss.backward()
        actor_optimizer.step()
        a_optimizer.zero_grad()
        with torch.no_grad():
            _, log_pi, _ = actor.get_action(obs)
        alpha_loss = (-log_alpha.exp() * (log_pi + target_entropy)).mean()
        alpha_loss.backward()
        a_optimizer.step()
        return TensorDict(actor_loss=actor_loss.detach(), alpha_loss=alpha_loss.detach(), alpha=alpha.detach())

    update_main = wrap(update_main, in_keys=[], out_keys=[], warmup=5)
    update_pol = wrap(update_pol, in_keys=[], out_keys=[], warmup=5)

    metrics = {k: [] for k in ("reward", "episode_return", "qf_loss", "actor_loss", "alpha_loss", "alpha")}
    clock = Clock(device)
    td = env.reset()
    for step in range(steps):
        if step == cfg.learning_starts + cfg.burnin:
            clock.begin()
        if step < cfg.learning_starts:
            td["action"] = (2 * torch.rand(cfg.num_envs, Pendulum.act_dim, device=device) - 1) * Pendulum.max_torque
        else:
            td = policy(td)
        td, next_td = env.step_and_maybe_reset(td)
        store_transition(rb, td, metrics)
        clock.tick(cfg.num_envs)
        if step >= cfg.learning_starts:
            data = rb.sample(cfg.batch_size)
            out = update_main(data)
            if step % cfg.policy_frequency == 0:
                for _ in range(cfg.policy_frequency):  # LeanRL: catch up on the delayed updates
                    out.update(update_pol(data))
                    alpha.copy_(log_alpha.detach().exp())
                for key in ("actor_loss", "alpha_loss"):
                    metrics[key].append(out[key])
                # not out["alpha"]: eagerly that is a view of `alpha`, which moves on
                metrics["alpha"].append(alpha.clone())
            metrics["qf_loss"].append(out["qf_loss"])
        td = next_td
    return finish(metrics, clock.stop("env step"))
