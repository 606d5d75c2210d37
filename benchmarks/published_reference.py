"""How many env steps the published single-file scripts need to reach -200 on Pendulum-v1.

The training examples (``examples/train_ppo.py``, ``train_sac.py``) are compared with the published single-file scripts (CleanRL's
``ppo_continuous_action.py``, ``sac_continuous_action.py``, ``td3_continuous_action.py`` and
LeanRL's ``*_torchcompile.py`` versions of them, which keep CleanRL's hyperparameters) by
wall-clock time to a return of -200. Their speed is published (H200, gymnasium's Pendulum-v1,
one CPU env: PPO about 1 800 env steps/s, SAC about 520, TD3 about 650); the number of env steps
they need to reach -200 is not. This script measures it: it re-implements the three algorithms
with the scripts' default hyperparameters (``PPO``, ``SAC``, ``TD3`` below) on gymnasium's real
``Pendulum-v1``, one env, eager torch on the CPU, and for each (algorithm, seed) records the env
steps (and finished episodes) at which the mean *raw* return of the latest ``--window`` (10)
finished episodes first reaches ``--threshold`` (-200), stopping there or at a cap (PPO
1 000 000 env steps, SAC and TD3 60 000). The published time-to-threshold is then estimated
as env steps / published env steps/s.

    python benchmarks/published_reference.py --algos sac,td3,ppo --seeds 0 1 2 \\
        --out benchmarks/results/published-reference
    python benchmarks/published_reference.py --smoke --out /tmp/ref   # a few seconds

Writes ``OUT/published_reference.json`` (every run: steps and episodes to the threshold, the
finished episodes' raw returns, wall time; the hyperparameters and their sources) and
``OUT/published_reference.md`` (the table, with the median per algorithm). Runs already in
``OUT`` from earlier invocations (same ``--smoke``, threshold and window) are kept, so the
algorithms can be run one invocation at a time; a run of the same (algorithm, seed) replaces
the older one.

Faithfulness, and what differs from the published scripts:

- The environment is ``gymnasium.make("Pendulum-v1")`` (200-step episodes, truncation only).
  PPO wraps it as CleanRL does: ``RecordEpisodeStatistics``, ``ClipAction``,
  ``NormalizeObservation``, ``TransformObservation`` (clip to [-10, 10]), ``NormalizeReward``
  (gamma 0.99), ``TransformReward`` (clip to [-10, 10]); the return compared with the threshold
  is ``RecordEpisodeStatistics``'s, i.e. the raw return before the reward normalization, as
  CleanRL logs it. SAC and TD3 wrap it in ``RecordEpisodeStatistics`` only, as CleanRL does.
- One plain env with "same-step" auto-reset (on the episode's end the transition keeps the
  final observation, then the env is reset) instead of ``SyncVectorEnv`` with one env: the
  same transitions (the scripts copy ``final_observation`` into the replay buffer on
  truncation, and PPO runs its vector env with ``AutoresetMode.SAME_STEP``).
- The replay buffer is a NumPy array sampled uniformly with replacement (as SB3's
  ``ReplayBuffer`` in CleanRL and torchrl's in LeanRL do); with the caps here it never wraps.
  Stored ``dones`` are terminations (``handle_timeout_termination=False``): Pendulum never
  terminates, so the critics always bootstrap.
- Eager torch on the CPU with float32, not the GPU (and not torch.compile / CUDA graphs):
  the same algorithm, so the same number of env steps up to floating-point and RNG streams.
- Seeds: the scripts' default seed is 1; here each seed seeds ``random``, NumPy, torch, the
  env's first reset and (SAC, TD3) the action space used for the random warm-up actions.
- The threshold statistic is ours (the scripts print each episode's return; LeanRL's bar shows
  the mean of the latest 20): the mean of the latest ``--window`` finished episodes.

``--smoke`` shrinks the caps and the warm-up/batch sizes to run in a few seconds (a test of
the code paths, not a measurement).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

PUBLISHED_STEPS_PER_S = {"ppo": 1800.0, "sac": 520.0, "td3": 650.0}  # H200, Pendulum-v1, 1 CPU env (published)
CAPS = {"ppo": 1_000_000, "sac": 60_000, "td3": 60_000}
SMOKE_CAPS = {"ppo": 512, "sac": 300, "td3": 300}
ALGOS = ("sac", "td3", "ppo")

SOURCES = {
    "ppo": [
        "vwxyzjn/cleanrl cleanrl/ppo_continuous_action.py @ 016ca33aa70f188ef385082524373ccb6dd14e03 (Args defaults, make_env)",
        "pytorch-labs/LeanRL leanrl/ppo_continuous_action_torchcompile.py @ 20bfe6794aa488e896ae51588164ac5b4d865a9f (same defaults)",
    ],
    "sac": [
        "vwxyzjn/cleanrl cleanrl/sac_continuous_action.py @ 004f8a086a892a2a180f4dd332b90d83a968aa7a (Args defaults)",
        "pytorch-labs/LeanRL leanrl/sac_continuous_action_torchcompile.py @ 20bfe6794aa488e896ae51588164ac5b4d865a9f (same defaults)",
    ],
    "td3": [
        "vwxyzjn/cleanrl cleanrl/td3_continuous_action.py @ 004f8a086a892a2a180f4dd332b90d83a968aa7a (Args defaults)",
        "pytorch-labs/LeanRL leanrl/td3_continuous_action_torchcompile.py @ 20bfe6794aa488e896ae51588164ac5b4d865a9f (same defaults)",
    ],
}


# -- hyperparameters: the published scripts' defaults -------------------------------------------

@dataclass
class PPO:
    total_timesteps: int = 1_000_000  # sets the learning-rate annealing: num_iterations = 488
    learning_rate: float = 3e-4
    adam_eps: float = 1e-5
    num_envs: int = 1
    num_steps: int = 2048
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    num_minibatches: int = 32
    update_epochs: int = 10
    norm_adv: bool = True
    clip_coef: float = 0.2
    clip_vloss: bool = True
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    target_kl: float | None = None
    hidden: int = 64  # tanh MLPs, orthogonal init (sqrt 2; actor head 0.01, critic head 1.0)
    obs_clip: float = 10.0
    reward_clip: float = 10.0


@dataclass
class SAC:
    buffer_size: int = 1_000_000
    gamma: float = 0.99
    tau: float = 0.005
    batch_size: int = 256
    learning_starts: int = 5_000
    policy_lr: float = 3e-4
    q_lr: float = 1e-3  # also the entropy temperature's learning rate
    policy_frequency: int = 2  # and policy_frequency actor updates each time
    target_network_frequency: int = 1
    alpha: float = 0.2  # unused with autotune
    autotune: bool = True  # target entropy -dim(A) = -1
    hidden: int = 256  # relu MLPs, torch's default init
    log_std_min: float = -5.0
    log_std_max: float = 2.0


@dataclass
class TD3:
    learning_rate: float = 3e-4
    buffer_size: int = 1_000_000
    gamma: float = 0.99
    tau: float = 0.005
    batch_size: int = 256
    policy_noise: float = 0.2
    exploration_noise: float = 0.1
    learning_starts: int = 25_000
    policy_frequency: int = 2  # the targets are updated with the actor
    noise_clip: float = 0.5
    hidden: int = 256  # relu MLPs, torch's default init


HYPER = {"ppo": PPO, "sac": SAC, "td3": TD3}
SMOKE_HYPER = {
    "ppo": dict(num_steps=128, num_minibatches=4, update_epochs=2, total_timesteps=SMOKE_CAPS["ppo"]),
    "sac": dict(learning_starts=200, batch_size=32),
    "td3": dict(learning_starts=200, batch_size=32),
}


# -- the threshold ------------------------------------------------------------------------------

class Tracker:
    """Finished episodes' raw returns; ``reached_at`` is the first (env steps, episodes) where the
    mean of the latest ``window`` reaches ``threshold``."""

    def __init__(self, threshold: float, window: int):
        self.threshold, self.window = threshold, window
        self.recent: deque[float] = deque(maxlen=window)
        self.episodes: list[tuple[int, float]] = []
        self.reached_at: tuple[int, int] | None = None
        self.reached_mean: float | None = None

    def add(self, env_steps: int, ret: float) -> bool:
        self.episodes.append((env_steps, round(float(ret), 3)))
        self.recent.append(float(ret))
        if self.reached_at is None and len(self.recent) == self.window:
            mean = sum(self.recent) / self.window
            if mean >= self.threshold:
                self.reached_at = (env_steps, len(self.episodes))
                self.reached_mean = mean
        return self.reached_at is not None

    def mean(self) -> float | None:
        return sum(self.recent) / len(self.recent) if self.recent else None


def _episode_return(info) -> float:
    return float(np.asarray(info["episode"]["r"]).reshape(()))


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Progress:
    def __init__(self, algo: str, seed: int, quiet: bool, every_s: float = 15.0):
        self.algo, self.seed, self.quiet, self.every_s = algo, seed, quiet, every_s
        self.start = time.perf_counter()
        self.last = self.start

    def maybe(self, steps: int, tracker: Tracker, force: bool = False) -> None:
        now = time.perf_counter()
        if self.quiet or (not force and now - self.last < self.every_s):
            return
        self.last = now
        m = tracker.mean()
        print(f"[{self.algo} seed {self.seed}] {steps} env steps, {len(tracker.episodes)} episodes, "
              f"mean of latest {len(tracker.recent)}: {'-' if m is None else f'{m:.1f}'}, "
              f"{now - self.start:.0f} s", flush=True)


# -- SAC / TD3 ----------------------------------------------------------------------------------

class Replay:
    def __init__(self, capacity: int, n_obs: int, n_act: int):
        self.obs = np.zeros((capacity, n_obs), np.float32)
        self.next_obs = np.zeros((capacity, n_obs), np.float32)
        self.act = np.zeros((capacity, n_act), np.float32)
        self.rew = np.zeros((capacity,), np.float32)
        self.done = np.zeros((capacity,), np.float32)
        self.capacity, self.pos, self.full = capacity, 0, False

    def add(self, obs, next_obs, act, rew, done) -> None:
        i = self.pos
        self.obs[i], self.next_obs[i], self.act[i], self.rew[i], self.done[i] = obs, next_obs, act, rew, done
        self.pos = (i + 1) % self.capacity
        self.full = self.full or self.pos == 0

    def sample(self, n: int):
        idx = np.random.randint(0, self.capacity if self.full else self.pos, size=n)
        t = torch.from_numpy
        return (t(self.obs[idx]), t(self.next_obs[idx]), t(self.act[idx]), t(self.rew[idx]), t(self.done[idx]))


class Critic(nn.Module):
    def __init__(self, n_obs: int, n_act: int, hidden: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_obs + n_act, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, obs, act):
        return self.net(torch.cat([obs, act], dim=1))


class Squashed(nn.Module):
    """SAC's actor: a Gaussian squashed by tanh, log-std bounded by a tanh into [min, max]."""

    def __init__(self, n_obs, n_act, hidden, scale, bias, log_std_min, log_std_max):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(n_obs, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.mean = nn.Linear(hidden, n_act)
        self.log_std = nn.Linear(hidden, n_act)
        self.register_buffer("scale", torch.as_tensor(scale, dtype=torch.float32))
        self.register_buffer("bias", torch.as_tensor(bias, dtype=torch.float32))
        self.lo, self.hi = log_std_min, log_std_max

    def sample(self, obs):
        h = self.body(obs)
        mean = self.mean(h)
        log_std = self.lo + 0.5 * (self.hi - self.lo) * (torch.tanh(self.log_std(h)) + 1)
        std = log_std.exp()
        pre = mean + std * torch.randn_like(mean)
        squashed = torch.tanh(pre)
        logp = (-((pre - mean) ** 2) / (2 * std ** 2) - log_std - 0.5 * math.log(2 * math.pi))
        logp = logp - torch.log(self.scale * (1 - squashed ** 2) + 1e-6)
        return squashed * self.scale + self.bias, logp.sum(1, keepdim=True)


class Deterministic(nn.Module):
    """TD3's actor: tanh output scaled to the action bounds."""

    def __init__(self, n_obs, n_act, hidden, scale, bias):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_obs, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, n_act), nn.Tanh())
        self.register_buffer("scale", torch.as_tensor(scale, dtype=torch.float32))
        self.register_buffer("bias", torch.as_tensor(bias, dtype=torch.float32))

    def forward(self, obs):
        return self.net(obs) * self.scale + self.bias


@torch.no_grad()
def _soft_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    for t, s in zip(target.parameters(), source.parameters()):
        t.mul_(1 - tau).add_(s, alpha=tau)


def _target_copy(module: nn.Module) -> nn.Module:
    import copy
    target = copy.deepcopy(module)
    for p in target.parameters():
        p.requires_grad_(False)
    return target


def run_off_policy(algo: str, hp, seed: int, cap: int, tracker: Tracker, quiet: bool) -> int:
    import gymnasium as gym

    _seed_everything(seed)
    env = gym.wrappers.RecordEpisodeStatistics(gym.make("Pendulum-v1"))
    env.action_space.seed(seed)
    low, high = env.action_space.low.astype(np.float32), env.action_space.high.astype(np.float32)
    scale, bias = (high - low) / 2.0, (high + low) / 2.0
    n_obs, n_act = env.observation_space.shape[0], env.action_space.shape[0]

    q1, q2 = Critic(n_obs, n_act, hp.hidden), Critic(n_obs, n_act, hp.hidden)
    q1_t, q2_t = _target_copy(q1), _target_copy(q2)
    if algo == "sac":
        actor = Squashed(n_obs, n_act, hp.hidden, scale, bias, hp.log_std_min, hp.log_std_max)
        q_opt = torch.optim.Adam([*q1.parameters(), *q2.parameters()], lr=hp.q_lr)
        a_opt = torch.optim.Adam(actor.parameters(), lr=hp.policy_lr)
        target_entropy = -float(np.prod(env.action_space.shape))
        log_alpha = torch.zeros(1, requires_grad=True)
        alpha_opt = torch.optim.Adam([log_alpha], lr=hp.q_lr)
        alpha = log_alpha.exp().item() if hp.autotune else hp.alpha
    else:
        actor = Deterministic(n_obs, n_act, hp.hidden, scale, bias)
        actor_t = _target_copy(actor)
        q_opt = torch.optim.Adam([*q1.parameters(), *q2.parameters()], lr=hp.learning_rate)
        a_opt = torch.optim.Adam(actor.parameters(), lr=hp.learning_rate)
        scale_t = torch.as_tensor(scale)

    rb = Replay(min(hp.buffer_size, cap), n_obs, n_act)
    progress = Progress(algo, seed, quiet)
    obs, _ = env.reset(seed=seed)
    steps = 0
    for global_step in range(cap):
        if global_step < hp.learning_starts:
            action = env.action_space.sample()
        else:
            with torch.no_grad():
                o = torch.as_tensor(obs, dtype=torch.float32).unsqueeze(0)
                if algo == "sac":
                    action = actor.sample(o)[0][0].numpy()
                else:
                    a = actor(o)[0]
                    a = a + torch.normal(torch.zeros_like(scale_t), scale_t * hp.exploration_noise)
                    action = a.numpy().clip(low, high)
        next_obs, reward, terminated, truncated, info = env.step(action)
        steps += 1
        # the transition keeps the final observation; dones are terminations only
        rb.add(obs, next_obs, action, reward, float(terminated))
        if terminated or truncated:
            if tracker.add(steps, _episode_return(info)):
                break
            obs, _ = env.reset()
        else:
            obs = next_obs

        if global_step > hp.learning_starts:
            b_obs, b_next, b_act, b_rew, b_done = rb.sample(hp.batch_size)
            with torch.no_grad():
                if algo == "sac":
                    next_a, next_logp = actor.sample(b_next)
                    next_q = torch.min(q1_t(b_next, next_a), q2_t(b_next, next_a)) - alpha * next_logp
                else:
                    noise = (torch.randn_like(b_act) * hp.policy_noise).clamp(-hp.noise_clip, hp.noise_clip) * scale_t
                    next_a = (actor_t(b_next) + noise).clamp(float(low[0]), float(high[0]))
                    next_q = torch.min(q1_t(b_next, next_a), q2_t(b_next, next_a))
                y = b_rew + (1 - b_done) * hp.gamma * next_q.view(-1)
            q_loss = F.mse_loss(q1(b_obs, b_act).view(-1), y) + F.mse_loss(q2(b_obs, b_act).view(-1), y)
            q_opt.zero_grad()
            q_loss.backward()
            q_opt.step()

            if global_step % hp.policy_frequency == 0:
                if algo == "sac":
                    for _ in range(hp.policy_frequency):  # compensates for the delay
                        pi, logp = actor.sample(b_obs)
                        a_loss = (alpha * logp - torch.min(q1(b_obs, pi), q2(b_obs, pi))).mean()
                        a_opt.zero_grad()
                        a_loss.backward()
                        a_opt.step()
                        if hp.autotune:
                            with torch.no_grad():
                                _, logp = actor.sample(b_obs)
                            alpha_loss = (-log_alpha.exp() * (logp + target_entropy)).mean()
                            alpha_opt.zero_grad()
                            alpha_loss.backward()
                            alpha_opt.step()
                            alpha = log_alpha.exp().item()
                else:
                    a_loss = -q1(b_obs, actor(b_obs)).mean()
                    a_opt.zero_grad()
                    a_loss.backward()
                    a_opt.step()
                    _soft_update(actor_t, actor, hp.tau)
                    _soft_update(q1_t, q1, hp.tau)
                    _soft_update(q2_t, q2, hp.tau)
            if algo == "sac" and global_step % hp.target_network_frequency == 0:
                _soft_update(q1_t, q1, hp.tau)
                _soft_update(q2_t, q2, hp.tau)
        progress.maybe(steps, tracker)
    env.close()
    return steps


# -- PPO ----------------------------------------------------------------------------------------

def _ortho(layer: nn.Linear, std: float = math.sqrt(2)) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, 0.0)
    return layer


class PPOAgent(nn.Module):
    def __init__(self, n_obs: int, n_act: int, hidden: int):
        super().__init__()
        self.critic = nn.Sequential(_ortho(nn.Linear(n_obs, hidden)), nn.Tanh(), _ortho(nn.Linear(hidden, hidden)),
                                    nn.Tanh(), _ortho(nn.Linear(hidden, 1), 1.0))
        self.actor_mean = nn.Sequential(_ortho(nn.Linear(n_obs, hidden)), nn.Tanh(),
                                        _ortho(nn.Linear(hidden, hidden)), nn.Tanh(),
                                        _ortho(nn.Linear(hidden, n_act), 0.01))
        self.actor_logstd = nn.Parameter(torch.zeros(1, n_act))

    def value(self, obs):
        return self.critic(obs)

    def act(self, obs, action=None):
        mean = self.actor_mean(obs)
        dist = torch.distributions.Normal(mean, self.actor_logstd.expand_as(mean).exp())
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action).sum(1), dist.entropy().sum(1), self.critic(obs)


def make_ppo_env(gamma: float, obs_clip: float, reward_clip: float):
    import gymnasium as gym

    env = gym.make("Pendulum-v1")
    env = gym.wrappers.RecordEpisodeStatistics(env)  # raw returns: inside the reward wrappers
    env = gym.wrappers.ClipAction(env)
    env = gym.wrappers.NormalizeObservation(env)
    env = gym.wrappers.TransformObservation(env, lambda o: np.clip(o, -obs_clip, obs_clip), env.observation_space)
    env = gym.wrappers.NormalizeReward(env, gamma=gamma)
    env = gym.wrappers.TransformReward(env, lambda r: np.clip(r, -reward_clip, reward_clip))
    return env


def run_ppo(hp: PPO, seed: int, cap: int, tracker: Tracker, quiet: bool) -> int:
    assert hp.num_envs == 1, "one env, as in the published speed numbers"
    _seed_everything(seed)
    env = make_ppo_env(hp.gamma, hp.obs_clip, hp.reward_clip)
    n_obs, n_act = env.observation_space.shape[0], env.action_space.shape[0]
    agent = PPOAgent(n_obs, n_act, hp.hidden)
    opt = torch.optim.Adam(agent.parameters(), lr=hp.learning_rate, eps=hp.adam_eps)

    T, N = hp.num_steps, hp.num_envs
    batch = T * N
    minibatch = batch // hp.num_minibatches
    iterations = hp.total_timesteps // batch
    obs_b = torch.zeros(T, N, n_obs)
    act_b = torch.zeros(T, N, n_act)
    logp_b, rew_b, done_b, val_b = (torch.zeros(T, N) for _ in range(4))

    progress = Progress("ppo", seed, quiet)
    o, _ = env.reset(seed=seed)
    next_obs = torch.as_tensor(o, dtype=torch.float32).view(1, -1)
    next_done = torch.zeros(N)
    steps = 0
    for iteration in range(1, iterations + 1):
        if steps >= cap:
            break
        if hp.anneal_lr:
            opt.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / iterations) * hp.learning_rate
        for t in range(T):
            obs_b[t], done_b[t] = next_obs, next_done
            with torch.no_grad():
                action, logp, _, value = agent.act(next_obs)
            val_b[t], act_b[t], logp_b[t] = value.flatten(), action, logp
            o, reward, terminated, truncated, info = env.step(action[0].numpy())
            steps += 1
            rew_b[t] = float(reward)
            done = terminated or truncated
            if done:
                if tracker.add(steps, _episode_return(info)):
                    env.close()
                    return steps
                o, _ = env.reset()
            next_obs = torch.as_tensor(o, dtype=torch.float32).view(1, -1)
            next_done = torch.full((N,), float(done))
            if steps >= cap:
                break
        if steps >= cap:
            break

        with torch.no_grad():  # GAE; a done cuts the bootstrap (truncations included, as published)
            next_value = agent.value(next_obs).view(1, -1)
            adv = torch.zeros_like(rew_b)
            last = torch.zeros(N)
            for t in reversed(range(T)):
                nonterminal = 1.0 - (next_done if t == T - 1 else done_b[t + 1])
                next_v = next_value if t == T - 1 else val_b[t + 1]
                delta = rew_b[t] + hp.gamma * next_v * nonterminal - val_b[t]
                adv[t] = last = delta + hp.gamma * hp.gae_lambda * nonterminal * last
            ret = adv + val_b

        f_obs, f_act = obs_b.reshape(-1, n_obs), act_b.reshape(-1, n_act)
        f_logp, f_adv, f_ret, f_val = logp_b.reshape(-1), adv.reshape(-1), ret.reshape(-1), val_b.reshape(-1)
        inds = np.arange(batch)
        for _epoch in range(hp.update_epochs):
            np.random.shuffle(inds)
            for start in range(0, batch, minibatch):
                mb = torch.from_numpy(inds[start:start + minibatch])
                _, new_logp, entropy, new_v = agent.act(f_obs[mb], f_act[mb])
                logratio = new_logp - f_logp[mb]
                ratio = logratio.exp()
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - logratio).mean()
                mb_adv = f_adv[mb]
                if hp.norm_adv:
                    mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                pg_loss = torch.max(-mb_adv * ratio,
                                    -mb_adv * torch.clamp(ratio, 1 - hp.clip_coef, 1 + hp.clip_coef)).mean()
                new_v = new_v.view(-1)
                if hp.clip_vloss:
                    v_clipped = f_val[mb] + torch.clamp(new_v - f_val[mb], -hp.clip_coef, hp.clip_coef)
                    v_loss = 0.5 * torch.max((new_v - f_ret[mb]) ** 2, (v_clipped - f_ret[mb]) ** 2).mean()
                else:
                    v_loss = 0.5 * ((new_v - f_ret[mb]) ** 2).mean()
                loss = pg_loss - hp.ent_coef * entropy.mean() + hp.vf_coef * v_loss
                opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), hp.max_grad_norm)
                opt.step()
            if hp.target_kl is not None and approx_kl > hp.target_kl:
                break
        progress.maybe(steps, tracker)
    env.close()
    return steps


# -- driver -------------------------------------------------------------------------------------

def run_one(algo: str, seed: int, smoke: bool, threshold: float, window: int, cap: int | None = None,
            quiet: bool = False) -> dict:
    hp = HYPER[algo](**(SMOKE_HYPER[algo] if smoke else {}))
    cap = cap if cap is not None else (SMOKE_CAPS if smoke else CAPS)[algo]
    tracker = Tracker(threshold, window)
    t0 = time.perf_counter()
    if algo == "ppo":
        # the published PPO runs whole iterations: it cannot go past total_timesteps // num_steps of them
        cap = min(cap, hp.total_timesteps // (hp.num_steps * hp.num_envs) * hp.num_steps * hp.num_envs)
        steps = run_ppo(hp, seed, cap, tracker, quiet)
    else:
        steps = run_off_policy(algo, hp, seed, cap, tracker, quiet)
    wall = time.perf_counter() - t0
    reached = tracker.reached_at is not None
    env_steps = tracker.reached_at[0] if reached else None
    sps = PUBLISHED_STEPS_PER_S[algo]
    result = dict(
        algo=algo, seed=seed, smoke=smoke, threshold=threshold, window=window, cap=cap,
        reached=reached, env_steps_to_threshold=env_steps,
        episodes_to_threshold=tracker.reached_at[1] if reached else None,
        mean_at_threshold=round(tracker.reached_mean, 2) if reached else None,
        env_steps_run=steps, episodes_run=len(tracker.episodes),
        final_window_mean=None if tracker.mean() is None else round(tracker.mean(), 2),
        published_steps_per_s=sps,
        wall_s=round(wall, 1), cpu_env_steps_per_s=round(steps / wall, 1) if wall > 0 else None,
        hyperparameters=dataclasses.asdict(hp),
        episodes=tracker.episodes,
    )
    derive(result)
    if not quiet:
        what = (f"reached {threshold:g} at {env_steps} env steps ({result['episodes_to_threshold']} episodes), "
                f"est. published {result['est_published_seconds_to_threshold']} s"
                if reached else f"not reached by {steps} env steps (latest mean {result['final_window_mean']})")
        print(f"[{algo} seed {seed}] {what}; {wall:.0f} s here", flush=True)
    return result


def derive(r: dict) -> dict:
    """The estimated published times of a run (recomputed whenever the results are written).

    ``est_published_seconds_to_threshold``: all env steps at the published rate. For SAC and TD3
    that rate is the learning phase's: LeanRL starts its speed counter only after
    ``learning_starts`` (+3) steps, and the warm-up steps before (random actions, no updates) run
    faster at a rate not published. ``est_published_seconds_learning_phase`` counts only the
    steps after ``learning_starts`` (the warm-up free): the two bracket the published script's
    time. For PPO (no warm-up) they are equal."""
    sps = r["published_steps_per_s"]
    warm = r["hyperparameters"].get("learning_starts", 0)
    steps = r["env_steps_to_threshold"] if r["reached"] else None
    r["est_published_seconds_to_threshold"] = round(steps / sps, 1) if steps is not None else None
    r["est_published_seconds_learning_phase"] = round(max(steps - warm, 0) / sps, 1) if steps is not None else None
    rets = [ret for _, ret in r.get("episodes", [])]
    w = r["window"]
    r["best_window_mean"] = (round(max(sum(rets[i - w:i]) / w for i in range(w, len(rets) + 1)), 1)
                             if len(rets) >= w else None)
    return r


def _bound(r: dict, key: str) -> float:
    """What an unreached run says about the published time: more than its steps at the published rate."""
    warm = r["hyperparameters"].get("learning_starts", 0) if key == "est_published_seconds_learning_phase" else 0
    return max(r["env_steps_run"] - warm, 0) / r["published_steps_per_s"]


def _median(runs: list[dict], key: str) -> str:
    """Median of a run's field over seeds; an unreached run counts as more than any reached one
    (a median that falls on unreached runs reads "> " the least of their bounds)."""
    vals = sorted(r[key] if r["reached"] else math.inf for r in runs)
    if not vals:
        return "-"
    n = len(vals)
    mid = vals[n // 2] if n % 2 else (vals[n // 2 - 1] + vals[n // 2]) / 2
    if math.isinf(mid):
        if key == "env_steps_to_threshold":
            return "not reached (median)"
        return f"> {min(_bound(r, key) for r in runs if not r['reached']):.1f}"
    return f"{mid:,.0f}".replace(",", " ") if key == "env_steps_to_threshold" else f"{mid:.1f}"


def markdown(runs: list[dict]) -> str:
    runs = sorted(runs, key=lambda r: (ALGOS.index(r["algo"]) if r["algo"] in ALGOS else 99, r["seed"]))
    thr, win = runs[0]["threshold"], runs[0]["window"]
    lines = [
        f"# Published configurations on gymnasium Pendulum-v1: env steps to a return of {thr:g}",
        "",
        f"Mean raw return of the latest {win} finished episodes (RecordEpisodeStatistics, before PPO's "
        "reward normalization); one env; CleanRL/LeanRL default hyperparameters; eager torch on CPU "
        "(`benchmarks/published_reference.py`). Estimated published time-to-threshold = env steps / the "
        "published scripts' env steps/s on an H200 (PPO 1 800, SAC 520, TD3 650). For SAC and "
        "TD3 those rates are the learning phase's (LeanRL starts its speed counter after `learning_starts`: "
        "5 000 and 25 000 random-action steps without updates, which run faster at a rate not published), "
        "so the published time lies between *all steps* (every step at the published rate) and "
        "*learning phase* (the warm-up counted as free); for PPO the two are equal. A run that did not reach "
        "the threshold bounds the published time from below: more than its env steps at the published rate."
        + (" **Smoke run: not a measurement.**" if runs[0]["smoke"] else ""),
        "",
        "| algorithm | seed | env steps to threshold | episodes | est. published time (s), all steps "
        f"| learning phase only (s) | best mean of {win} | env steps run | wall here (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    fmt = lambda n: f"{n:,}".replace(",", " ")
    for r in runs:
        steps = fmt(r["env_steps_to_threshold"]) if r["reached"] else f"not reached by {fmt(r['cap'])}"
        est, learn = (f"{r[k]:.1f}" if r["reached"] else f"> {_bound(r, k):.1f}"
                      for k in ("est_published_seconds_to_threshold", "est_published_seconds_learning_phase"))
        eps = str(r["episodes_to_threshold"]) if r["reached"] else "-"
        best = "-" if r.get("best_window_mean") is None else f"{r['best_window_mean']:.0f}"
        lines.append(f"| {r['algo'].upper()} | {r['seed']} | {steps} | {eps} | {est} | {learn} | {best} "
                     f"| {fmt(r['env_steps_run'])} | {r['wall_s']:.0f} |")
    lines += ["", "| algorithm | seeds | median env steps | median est. published time (s), all steps "
              "| learning phase only (s) |", "|---|---|---|---|---|"]
    for algo in ALGOS:
        sel = [r for r in runs if r["algo"] == algo]
        if sel:
            lines.append(f"| {algo.upper()} | {len(sel)} | {_median(sel, 'env_steps_to_threshold')} "
                         f"| {_median(sel, 'est_published_seconds_to_threshold')} "
                         f"| {_median(sel, 'est_published_seconds_learning_phase')} |")
    return "\n".join(lines) + "\n"


def write(out: str, new_runs: list[dict]) -> tuple[str, str]:
    os.makedirs(out, exist_ok=True)
    jpath, mpath = os.path.join(out, "published_reference.json"), os.path.join(out, "published_reference.md")
    runs: list[dict] = []
    if os.path.exists(jpath):
        with open(jpath) as f:
            old = json.load(f).get("runs", [])
        key = lambda r: (r["smoke"], r["threshold"], r["window"])
        if new_runs and any(key(r) != key(new_runs[0]) for r in old):
            raise SystemExit(f"{jpath} holds runs with other settings (smoke, threshold, window): "
                             "choose another --out")
        done = {(r["algo"], r["seed"]) for r in new_runs}
        runs = [r for r in old if (r["algo"], r["seed"]) not in done]
    runs = [derive(r) for r in runs + new_runs]
    if not runs:
        raise SystemExit(f"no runs to write in {out}")
    doc = dict(
        description="Env steps the published CleanRL/LeanRL configurations need on gymnasium Pendulum-v1 "
                    "to reach the threshold (see benchmarks/published_reference.py)",
        published_steps_per_s=PUBLISHED_STEPS_PER_S, sources=SOURCES,
        torch=torch.__version__, python=sys.version.split()[0],
        gymnasium=__import__("gymnasium").__version__, numpy=np.__version__,
        runs=runs,
    )
    # one line per run's episode list: [[env steps at the episode's end, raw return], ...]
    text = json.dumps(dict(doc, runs=[dict(r, episodes=f"@episodes{i}@") for i, r in enumerate(runs)]), indent=1)
    for i, r in enumerate(runs):
        text = text.replace(f'"@episodes{i}@"', json.dumps(r["episodes"], separators=(",", ":")), 1)
    with open(jpath, "w") as f:
        f.write(text)
    with open(mpath, "w") as f:
        f.write(markdown(runs))
    return jpath, mpath


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algos", default="sac,td3,ppo", help="comma-separated: sac, td3, ppo")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", default="benchmarks/results/published-reference")
    p.add_argument("--smoke", action="store_true", help="tiny caps and warm-up: tests the code paths")
    p.add_argument("--threshold", type=float, default=-200.0)
    p.add_argument("--window", type=int, default=10, help="finished episodes averaged (default 10)")
    p.add_argument("--cap", type=int, default=None, help="env steps per run (default: PPO 1e6, SAC/TD3 6e4)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--rewrite", action="store_true",
                   help="run nothing: rewrite OUT's JSON estimates and markdown table from its runs")
    args = p.parse_args(argv)
    if args.rewrite:
        jpath, mpath = write(args.out, [])
        if not args.quiet:
            print(f"wrote {jpath} and {mpath}")
        return []
    algos = [a.strip().lower() for a in args.algos.split(",") if a.strip()]
    bad = [a for a in algos if a not in ALGOS]
    if bad:
        p.error(f"unknown algorithm(s) {bad}; choose from {', '.join(ALGOS)}")
    torch.set_num_threads(args.threads)
    runs = []
    for algo in algos:
        for seed in args.seeds:
            runs.append(run_one(algo, seed, args.smoke, args.threshold, args.window, args.cap, args.quiet))
            jpath, mpath = write(args.out, [runs[-1]])  # after every run: a long invocation keeps its progress
    if runs and not args.quiet:
        print(f"wrote {jpath} and {mpath}")
    return runs


if __name__ == "__main__":
    main()
