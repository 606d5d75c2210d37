"""A batched Pendulum and a batched CartPole in pure torch, in the TensorDict layout of TorchRL.

``Pendulum(num_envs, device, seed)`` follows gymnasium's ``Pendulum-v1`` exactly
(max_speed 8, max_torque 2, dt 0.05, g 10, m 1, l 1, truncation after 200 steps,
observation ``[cos th, sin th, thdot]``, reward ``-(angle_normalize(th)^2 + 0.1 thdot^2
+ 0.001 u^2)``), for ``num_envs`` pendulums at once, in float32 on any device.

``step`` and ``step_and_maybe_reset`` are tensor operations only: no ``.item()``, no
boolean-mask indexing, no Python branch on a tensor. They never wait for the device, so
a rollout queues its work without host synchronisation. They also keep the state in place
(``copy_``, ``add_``, ``masked_fill_`` into the same tensors, never a new tensor bound to
the attribute), so a CUDA graph that steps an env reads and writes the env's own memory at
every replay: ``examples/train_ppo.py`` captures a whole rollout of them as one graph. Inside
a graph, draw the reset states from torch's default generator (``seed=None``): a CUDA graph
captures that one only, and a ``torch.Generator`` of the env's own fails the capture.

>>> env = Pendulum(4, "cpu", seed=0)
>>> td = env.reset()
>>> td["action"] = torch.zeros(4, 1)
>>> td, next_td = env.step_and_maybe_reset(td)
>>> td["next", "reward"].shape, next_td["observation"].shape
(torch.Size([4, 1]), torch.Size([4, 3]))

``CartPole(num_envs, device, seed)`` follows gymnasium's ``CartPole-v1`` the same way (see
its docstring), with a discrete action: ``td["action"]`` holds one int64 0 or 1 per env.
"""

from __future__ import annotations

import math

import torch
from tensordict import TensorDict

__all__ = ["CartPole", "Pendulum", "angle_normalize"]


def angle_normalize(x: torch.Tensor) -> torch.Tensor:
    return ((x + math.pi) % (2 * math.pi)) - math.pi


def _generator(device: torch.device, seed: int | None) -> torch.Generator | None:
    """The reset states' generator: one of the env's own, or ``None`` (torch's default)."""
    return None if seed is None else torch.Generator(device=device).manual_seed(seed)


def _write_next(env, td: TensorDict, reward: torch.Tensor, terminated: torch.Tensor,
                truncated: torch.Tensor) -> TensorDict:
    """Write one step's ``"next"`` entries into ``td`` and return it: ``env``'s observation
    and return so far, and ``reward``, ``terminated``, ``truncated`` ([N] each) as [N, 1]."""
    td["next"] = TensorDict(
        observation=env.observation(),
        reward=reward.unsqueeze(-1),
        done=(terminated | truncated).unsqueeze(-1),
        terminated=terminated.unsqueeze(-1),
        truncated=truncated.unsqueeze(-1),
        # a copy: the env's running sum is reset in place when the episode ends
        episode_reward=env.episode_reward.unsqueeze(-1).clone(),
        batch_size=[env.num_envs],
        device=env.device,
    )
    return td


class Pendulum:
    """``num_envs`` Pendulum-v1 environments stepped together.

    Keys written by :meth:`step`: ``("next", "observation")`` [N, 3], ``("next", "reward")``,
    ``("next", "done")``, ``("next", "terminated")``, ``("next", "truncated")`` and
    ``("next", "episode_reward")`` (the return so far, TorchRL's ``RewardSum``), all [N, 1].
    Pendulum never terminates; an episode is truncated after ``max_steps`` steps.

    ``seed`` seeds a generator of the env's own for the reset states; ``seed=None`` draws them
    from torch's default generator instead (seed it with ``torch.manual_seed``), which is the
    one a CUDA graph can capture.
    """

    max_speed, max_torque, dt, g, m, l = 8.0, 2.0, 0.05, 10.0, 1.0, 1.0
    obs_dim, act_dim = 3, 1

    def __init__(self, num_envs: int, device: torch.device | str = "cpu", seed: int | None = 0,
                 max_steps: int = 200) -> None:
        self.num_envs, self.device, self.max_steps = num_envs, torch.device(device), max_steps
        self.generator = _generator(self.device, seed)
        zeros = torch.zeros(num_envs, device=self.device)
        self.th, self.thdot, self.episode_reward = zeros.clone(), zeros.clone(), zeros.clone()
        self.step_count = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        high = torch.tensor([math.pi, 1.0], device=self.device)
        self._low, self._span = -high, 2 * high  # a reset state is low + span * uniform(0, 1)

    # -- state ---------------------------------------------------------------------------
    def _random_state(self) -> torch.Tensor:
        # gymnasium: uniform(low=-[pi, 1], high=[pi, 1]); two kernels
        u = torch.rand(self.num_envs, 2, generator=self.generator, device=self.device)
        return torch.addcmul(self._low, u, self._span)

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
        """Apply ``td["action"]`` [N, 1]; write the ``"next"`` entries into ``td`` and return it.

        gymnasium's arithmetic in few kernels (a graphed rollout of one env costs a few
        microseconds per kernel, whatever the work): the cost's three terms in two ``addcmul``,
        the speed clamped straight into the state, the angle advanced with ``add_(alpha=dt)``.
        """
        u = td["action"].reshape(self.num_envs).clamp(-self.max_torque, self.max_torque)
        th, thdot = self.th, self.thdot
        g, m, l, dt = self.g, self.m, self.l, self.dt
        angle = angle_normalize(th)
        # -(angle^2 + 0.1 thdot^2 + 0.001 u^2)
        reward = torch.addcmul(torch.addcmul(angle * angle, thdot, thdot, value=0.1), u, u, value=0.001).neg_()
        # newthdot = clamp(thdot + (3 g / (2 l) sin(th) + 3 / (m l^2) u) dt); newth = th + newthdot dt
        accel = torch.add(th.sin().mul_(3 * g / (2 * l)), u, alpha=3.0 / (m * l ** 2))
        # in place (see the module's docstring): a graph replays into these same tensors
        torch.add(thdot, accel, alpha=dt, out=self.thdot).clamp_(-self.max_speed, self.max_speed)
        self.th.add_(self.thdot, alpha=dt)
        self.step_count.add_(1)
        self.episode_reward.add_(reward)
        truncated = self.step_count >= self.max_steps
        terminated = torch.zeros_like(truncated)
        return _write_next(self, td, reward, terminated, truncated)

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
        torch.where(done, fresh[:, 0], self.th, out=self.th)
        torch.where(done, fresh[:, 1], self.thdot, out=self.thdot)
        self.step_count.masked_fill_(done, 0)
        self.episode_reward.masked_fill_(done, 0.0)
        next_td = TensorDict(observation=self.observation(), batch_size=[self.num_envs], device=self.device)
        return td, next_td


class CartPole:
    """``num_envs`` CartPole-v1 environments stepped together.

    gymnasium's ``CartPole-v1`` exactly: gravity 9.8, cart mass 1, pole mass 0.1, half pole
    length 0.5, ``force_mag`` 10, ``tau`` 0.02 with the explicit Euler integrator; an episode
    terminates when ``|x| > 2.4`` or ``|theta| > 12 degrees`` and is truncated after
    ``max_steps`` (500) steps; the reward is 1 at every step, the terminating one included;
    a reset draws ``[x, x_dot, theta, theta_dot]`` uniformly in ``[-0.05, 0.05]``.

    The action is discrete: ``td["action"]`` is an int64 tensor of shape [N] or [N, 1] holding
    0 (push left) or 1 (push right); as in gymnasium, any value other than 1 pushes left.
    ``act_dim`` (= ``num_actions`` = 2) is the number of actions, the size of a policy's
    logits; the action itself is one index per env.

    Keys written by :meth:`step`: ``("next", "observation")`` [N, 4] (float32, gymnasium's
    ``[x, x_dot, theta, theta_dot]``), ``("next", "reward")``, ``("next", "done")``,
    ``("next", "terminated")``, ``("next", "truncated")`` and ``("next", "episode_reward")``,
    all [N, 1]. The state is kept in ``dtype`` (float32 by default; gymnasium computes in
    float64, which ``dtype=torch.float64`` reproduces to the last bits or so). Like
    :class:`Pendulum`, ``step`` and ``step_and_maybe_reset`` are tensor operations only, keep
    the state in place, and ``seed=None`` draws the reset states from torch's default generator.

    >>> env = CartPole(4, "cpu", seed=0)
    >>> td = env.reset()
    >>> td["action"] = torch.ones(4, dtype=torch.int64)
    >>> td, next_td = env.step_and_maybe_reset(td)
    >>> td["next", "reward"].shape, next_td["observation"].shape
    (torch.Size([4, 1]), torch.Size([4, 4]))
    """

    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    total_mass = masspole + masscart
    polemass_length = masspole * length
    theta_threshold_radians = 12 * 2 * math.pi / 360
    x_threshold = 2.4
    obs_dim, act_dim, num_actions = 4, 2, 2

    def __init__(self, num_envs: int, device: torch.device | str = "cpu", seed: int | None = 0,
                 max_steps: int = 500, dtype: torch.dtype = torch.float32) -> None:
        self.num_envs, self.device, self.max_steps, self.dtype = num_envs, torch.device(device), max_steps, dtype
        self.generator = _generator(self.device, seed)
        self.state = torch.zeros(num_envs, 4, device=self.device, dtype=dtype)
        self.episode_reward = torch.zeros(num_envs, device=self.device)
        self.step_count = torch.zeros(num_envs, dtype=torch.int64, device=self.device)

    # -- state ---------------------------------------------------------------------------
    def _random_state(self) -> torch.Tensor:
        # gymnasium: np_random.uniform(low=-0.05, high=0.05, size=(4,))
        u = torch.rand(self.num_envs, 4, generator=self.generator, device=self.device, dtype=self.dtype)
        return 0.1 * u - 0.05

    def observation(self) -> torch.Tensor:
        return self.state.to(torch.float32, copy=True)

    def set_state(self, state: torch.Tensor) -> TensorDict:
        """Set ``[x, x_dot, theta, theta_dot]`` ([N, 4]) of every cart (restarts their episodes)."""
        self.state.copy_(state)
        self.step_count.zero_()
        self.episode_reward.zero_()
        return TensorDict(observation=self.observation(), batch_size=[self.num_envs], device=self.device)

    def reset(self) -> TensorDict:
        return self.set_state(self._random_state())

    # -- dynamics ------------------------------------------------------------------------
    def step(self, td: TensorDict) -> TensorDict:
        """Apply ``td["action"]`` (int64 0/1, [N] or [N, 1]); write the ``"next"`` entries
        into ``td`` and return it."""
        action = td["action"].reshape(self.num_envs)
        force = torch.where(action == 1, self.force_mag, -self.force_mag).to(self.dtype)
        x, x_dot, theta, theta_dot = self.state.unbind(-1)
        costheta, sintheta = torch.cos(theta), torch.sin(theta)
        temp = (force + self.polemass_length * theta_dot.square() * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * costheta.square() / self.total_mass))
        xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass
        # euler: positions move with the old velocities
        x, x_dot = x + self.tau * x_dot, x_dot + self.tau * xacc
        theta, theta_dot = theta + self.tau * theta_dot, theta_dot + self.tau * thetaacc
        self.state.copy_(torch.stack([x, x_dot, theta, theta_dot], -1))  # in place, as Pendulum
        terminated = ((x < -self.x_threshold) | (x > self.x_threshold)
                      | (theta < -self.theta_threshold_radians) | (theta > self.theta_threshold_radians))
        self.step_count.add_(1)
        truncated = self.step_count >= self.max_steps
        reward = torch.ones(self.num_envs, device=self.device)
        self.episode_reward.add_(reward)
        return _write_next(self, td, reward, terminated, truncated)

    def step_and_maybe_reset(self, td: TensorDict) -> tuple[TensorDict, TensorDict]:
        """``step``, then reset the finished environments; returns ``(td, next_td)``, as
        :meth:`Pendulum.step_and_maybe_reset` does (no host synchronisation)."""
        td = self.step(td)
        done = td["next", "done"].reshape(self.num_envs)
        self.state.copy_(torch.where(done.unsqueeze(-1), self._random_state(), self.state))
        self.step_count.masked_fill_(done, 0)
        self.episode_reward.masked_fill_(done, 0.0)
        next_td = TensorDict(observation=self.observation(), batch_size=[self.num_envs], device=self.device)
        return td, next_td
