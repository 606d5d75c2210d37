"""examples/envs.py: the batched torch Pendulum matches gymnasium's Pendulum-v1."""

import warnings
import math

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from examples.envs import Pendulum

try:  # the reference; not among the package's test extras
    import gymnasium as gym
except ImportError:  # pragma: no cover
    gym = None
needs_gym = pytest.mark.skipif(gym is None, reason="gymnasium is not installed (pip install gymnasium)")

N = 6


def gym_envs(seed):
    envs = [gym.make("Pendulum-v1") for _ in range(N)]
    for i, env in enumerate(envs):
        env.reset(seed=seed + i)
    return envs


def sync_state(env, envs):
    state = np.stack([e.unwrapped.state for e in envs])
    return env.set_state(torch.tensor(state[:, 0], dtype=torch.float32),
                         torch.tensor(state[:, 1], dtype=torch.float32))


def step_both(env, envs, actions):
    td = env.step(TensorDict(action=torch.as_tensor(actions), batch_size=[N]))
    results = [e.step(a) for e, a in zip(envs, actions)]
    obs = np.stack([r[0] for r in results])
    reward = np.array([r[1] for r in results], dtype=np.float32)[:, None]
    truncated = np.array([r[3] for r in results])[:, None]
    terminated = np.array([r[2] for r in results])[:, None]
    return td, obs, reward, terminated, truncated


@needs_gym
def test_one_step_matches_gymnasium_from_many_states():
    env, envs = Pendulum(N, "cpu", seed=0), gym_envs(0)
    rng = np.random.default_rng(1)
    for _ in range(50):
        for e in envs:  # states across the whole range, including speeds at the clip
            e.unwrapped.state = np.array([rng.uniform(-3 * math.pi, 3 * math.pi), rng.uniform(-8, 8)])
        sync_state(env, envs)
        actions = rng.uniform(-3, 3, size=(N, 1)).astype(np.float32)  # beyond max_torque too
        td, obs, reward, _, _ = step_both(env, envs, actions)
        torch.testing.assert_close(td["next", "observation"], torch.as_tensor(obs), rtol=1e-5, atol=2e-5)
        torch.testing.assert_close(td["next", "reward"], torch.as_tensor(reward), rtol=1e-5, atol=2e-5)


@needs_gym
def test_whole_episode_matches_gymnasium_and_truncates_at_200():
    env, envs = Pendulum(N, "cpu", seed=0), gym_envs(10)
    td0 = sync_state(env, envs)
    first = np.stack([e.unwrapped._get_obs() for e in envs])
    torch.testing.assert_close(td0["observation"], torch.as_tensor(first), rtol=1e-6, atol=1e-6)
    rng = np.random.default_rng(2)
    total = np.zeros((N, 1), dtype=np.float32)
    for t in range(200):
        actions = rng.uniform(-2.5, 2.5, size=(N, 1)).astype(np.float32)
        td, obs, reward, terminated, truncated = step_both(env, envs, actions)
        total += reward
        # float32 against gymnasium's float64 state: errors stay ~1e-5 over an episode
        torch.testing.assert_close(td["next", "observation"], torch.as_tensor(obs), rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(td["next", "reward"], torch.as_tensor(reward), rtol=1e-3, atol=1e-3)
        assert torch.equal(td["next", "terminated"], torch.as_tensor(terminated))
        assert torch.equal(td["next", "truncated"], torch.as_tensor(truncated)), t
        assert torch.equal(td["next", "done"], torch.as_tensor(terminated | truncated))
    assert td["next", "truncated"].all()
    torch.testing.assert_close(td["next", "episode_reward"], torch.as_tensor(total), rtol=1e-4, atol=1e-2)


def test_reset_distribution_and_layout():
    env = Pendulum(4096, "cpu", seed=3)
    td = env.reset()
    assert td.batch_size == torch.Size([4096]) and td["observation"].shape == (4096, 3)
    assert env.th.abs().max() <= math.pi and env.thdot.abs().max() <= 1.0
    assert env.th.min() < -3.0 and env.th.max() > 3.0  # the whole range is drawn
    again = Pendulum(4096, "cpu", seed=3).reset()
    assert torch.equal(td["observation"], again["observation"])  # the seed decides


def test_step_and_maybe_reset_restarts_finished_episodes_only():
    env = Pendulum(N, "cpu", seed=0, max_steps=5)
    td = env.reset()
    env.step_count[:2] = 4  # two envs finish at the first step
    rewards = []
    for t in range(2):
        td["action"] = torch.ones(N, 1)
        td, next_td = env.step_and_maybe_reset(td)
        rewards.append(td["next", "reward"])
    done = td["next", "done"].squeeze(-1)
    assert done.tolist() == [False] * N  # the first two finished at t=0 and restarted
    assert env.step_count.tolist() == [1, 1, 2, 2, 2, 2]
    torch.testing.assert_close(td["next", "episode_reward"][2:], (rewards[0] + rewards[1])[2:])
    torch.testing.assert_close(td["next", "episode_reward"][:2], rewards[1][:2])


def test_finished_episode_keeps_its_last_observation():
    env = Pendulum(N, "cpu", seed=0, max_steps=4)
    td = env.reset()
    for _ in range(4):
        td["action"] = torch.full((N, 1), 0.5)
        th, thdot = env.th.clone(), env.thdot.clone()
        td, next_td = env.step_and_maybe_reset(td)
        if not td["next", "done"].all():
            td = next_td
    # the final observation follows the dynamics from the last state; next_td starts anew
    newthdot = (thdot + (15 * th.sin() + 3 * 0.5) * 0.05).clamp(-8, 8)
    final = torch.stack([(th + newthdot * 0.05).cos(), (th + newthdot * 0.05).sin(), newthdot], -1)
    torch.testing.assert_close(td["next", "observation"], final)
    assert not torch.isclose(next_td["observation"], final).all(-1).any()
    torch.testing.assert_close(next_td["observation"], env.observation())
    assert env.step_count.tolist() == [0] * N and env.episode_reward.tolist() == [0.0] * N


@pytest.mark.cuda
def test_no_host_sync_on_cuda(cuda):
    env = Pendulum(64, cuda, seed=0, max_steps=3)
    td = env.reset()
    torch.cuda.synchronize()
    with warnings.catch_warnings():  # "a prototype feature" notice, not a finding
        warnings.filterwarnings("ignore", message="Synchronization debug mode is a prototype")
        torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(8):
            td["action"] = torch.zeros(64, 1, device=cuda)
            td, next_td = env.step_and_maybe_reset(td)
            td = next_td
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert td["observation"].device == cuda
