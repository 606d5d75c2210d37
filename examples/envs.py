"""A batched Pendulum in pure torch, in the TensorDict layout of TorchRL.

``Pendulum(num_envs, device, seed)`` follows gymnasium's ``Pendulum-v1`` exactly
(max_speed 8, max_torque 2, dt 0.05, g 10, m 1, l 1, truncation after 200 steps,
observation ``[cos th, sin th, thdot]``, reward ``-(angle_normalize(th)^2 + 0.1 thdot^2
+ 0.001 u^2)``), for ``num_envs`` pendulums at once, in float32 on any device.

``step`` and ``step_and_maybe_reset`` are tensor operations only: no ``.item()``, no
boolean-mask indexing, no Python branch on a tensor. They never wait for the device, so
a rollout queues its work without host synchronisation (and ``step`` could be graphed).

>>> env = Pendulum(4, "cpu", seed=0)
>>> td = env.reset()
>>> td["action"] = torch.zeros(4, 1)
>>> td, next_td = env.step_and_maybe_reset(td)
>>> td["next", "reward"].shape, next_td["observation"].shape
(torch.Size([4, 1]), torch.Size([4, 3]))
"""

from __future__ import annotations

import math

import torch
from tensordict import TensorDict

__all__ = ["Pendulum", "angle_normalize"]


def angle_normalize(x: torch.Tensor) -> torch.Tensor:
    return ((x + math.pi) % (2 * math.pi)) - math.pi


class Pendulum:
    """``num_envs`` Pendulum-v1 environments stepped together.

    Keys written by :meth:`step`: ``("next", "observation")`` [N, 3], ``("next", "reward")``,
    ``("next", "done")``, ``("next", "terminated")``, ``("next", "truncated")`` and
    ``("next", "episode_reward")`` (the return so far, TorchRL's ``RewardSum``), all [N, 1].
    Pendulum never terminates; an episode is truncated after ``max_steps`` steps.
    """

    max_speed, max_torque, dt, g, m, l = 8.0, 2.0, 0.05, 10.0, 1.0, 1.0
    obs_dim, act_dim = 3, 1

    def __init__(self, num_envs: int, device: torch.device | str = "cpu", seed: int = 0,
                 max_steps: int = 200) -> None:
        self.num_envs, self.device, self.max_steps = num_envs, torch.device(device), max_steps
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        zeros = torch.zeros(num_envs, device=self.device)
        self.th, self.thdot, self.episode_reward = zeros.clone(), zeros.clone(), zeros.clone()
        self.step_count = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        self._high = torch.tensor([math.pi, 1.0], device=self.device)

    # -- state ---------------------------------------------------------------------------
    def _random_state(self) -> torch.Tensor:
        # gymnasium: uniform(low=-[pi, 1], high=[pi, 1])
        u = torch.rand(self.num_envs, 2, generator=self.generator, device=self.device)
        return (2 * u - 1) * self._high

    def observation(self) -> torch.Tensor:
        return torch.stack([self.th.cos(), self.th.sin(), self.thdot], -1)

    def set_state(self, th: torch.Tensor, thdot: torch.Tensor) -> TensorDict:
        """Set the angle and angular velocity of every pendulum (restarts their episodes)."""
        self.th.copy_(th)
        self.thdot.copy_(thdot)
        self.step_count.zero_()
        self.episode_reward.zero_()
        return TensorDict(observation=self.observation(), batch_size=[self.num_envs], device=self.device)

    def reset(self) -> TensorDict:
        state = self._random_state()
        return self.set_state(state[:, 0], state[:, 1])

    # -- dynamics ------------------------------------------------------------------------
    def step(self, td: TensorDict) -> TensorDict:
        """Apply ``td["action"]`` [N, 1]; write the ``"next"`` entries into ``td`` and return it."""
        u = td["action"].reshape(self.num_envs).clamp(-self.max_torque, self.max_torque)
        th, thdot = self.th, self.thdot
        g, m, l, dt = self.g, self.m, self.l, self.dt
        costs = angle_normalize(th) ** 2 + 0.1 * thdot ** 2 + 0.001 * u ** 2
        newthdot = thdot + (3 * g / (2 * l) * torch.sin(th) + 3.0 / (m * l ** 2) * u) * dt
        newthdot = newthdot.clamp(-self.max_speed, self.max_speed)
        self.th = th + newthdot * dt
        self.thdot = newthdot
        self.step_count = self.step_count + 1
        reward = -costs
        self.episode_reward = self.episode_reward + reward
        truncated = self.step_count >= self.max_steps
        terminated = torch.zeros_like(truncated)
        td["next"] = TensorDict(
            observation=self.observation(),
            reward=reward.unsqueeze(-1),
            done=(terminated | truncated).unsqueeze(-1),
            terminated=terminated.unsqueeze(-1),
            truncated=truncated.unsqueeze(-1),
            episode_reward=self.episode_reward.unsqueeze(-1),
            batch_size=[self.num_envs],
            device=self.device,
        )
        return td

    def step_and_maybe_reset(self, td: TensorDict) -> tuple[TensorDict, TensorDict]:
        """``step``, then reset the finished environments; returns ``(td, next_td)``.

        ``td["next", "observation"]`` keeps the last observation of a finished episode;
        ``next_td["observation"]`` is the first one of the new episode. Every call draws a
        fresh reset state and keeps it only where an episode ended (``torch.where``), so
        nothing depends on the host reading ``done``.
        """
        td = self.step(td)
        done = td["next", "done"].reshape(self.num_envs)
        fresh = self._random_state()
        self.th = torch.where(done, fresh[:, 0], self.th)
        self.thdot = torch.where(done, fresh[:, 1], self.thdot)
        self.step_count = torch.where(done, 0, self.step_count)
        self.episode_reward = torch.where(done, 0.0, self.episode_reward)
        next_td = TensorDict(observation=self.observation(), batch_size=[self.num_envs], device=self.device)
        return td, next_td
