"""examples/common/envs.py: the batched torch Pendulum and CartPole match gymnasium's Pendulum-v1 and CartPole-v1."""

import warnings
import math

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from examples.common.envs import CartPole, Pendulum

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



@pytest.mark.parametrize("make", [lambda: Pendulum(N, "cpu", seed=0, max_steps=2),
                                  lambda: CartPole(N, "cpu", seed=0, max_steps=2)], ids=["pendulum", "cartpole"])
def test_state_is_updated_in_place(make):
    """A CUDA graph that steps the env replays into the tensors it captured: stepping and
    resetting write into the env's state tensors, never bind new ones (a rebound attribute
    would leave every replay reading the capture's tensors)."""
    env = make()
    td = env.reset()
    names = [name for name in ("th", "thdot", "state", "step_count", "episode_reward") if hasattr(env, name)]
    before = {name: (getattr(env, name), getattr(env, name).data_ptr()) for name in names}
    action = torch.zeros(N, 1) if isinstance(env, Pendulum) else torch.ones(N, dtype=torch.int64)
    for _ in range(3):  # a reset at the second step
        td["action"] = action
        td, next_td = env.step_and_maybe_reset(td)
        td = next_td
    for name in names:
        assert getattr(env, name) is before[name][0] and getattr(env, name).data_ptr() == before[name][1], name
    assert env.step_count.tolist() == [1] * N


def test_episode_reward_is_a_copy():
    """The ``("next", "episode_reward")`` of an ended episode survives its env's reset."""
    env = Pendulum(N, "cpu", seed=0, max_steps=1)
    td = env.reset()
    td["action"] = torch.zeros(N, 1)
    td, _ = env.step_and_maybe_reset(td)
    assert td["next", "done"].all() and env.episode_reward.eq(0).all()
    torch.testing.assert_close(td["next", "episode_reward"], td["next", "reward"])


@pytest.mark.parametrize("cls", [Pendulum, CartPole])
def test_seed_none_draws_from_torchs_default_generator(cls):
    """``seed=None``: the reset states come from torch's default generator, the one a CUDA
    graph captures, so ``torch.manual_seed`` decides them."""
    torch.manual_seed(5)
    first = cls(N, "cpu", seed=None).reset()["observation"]
    torch.manual_seed(5)
    again = cls(N, "cpu", seed=None).reset()["observation"]
    assert torch.equal(first, again) and not torch.equal(first, cls(N, "cpu", seed=None).reset()["observation"])


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


# -- CartPole ----------------------------------------------------------------------------------

def gym_cartpoles(seed, **kwargs):
    envs = [gym.make("CartPole-v1", **kwargs) for _ in range(N)]
    for i, env in enumerate(envs):
        env.reset(seed=seed + i)
    return envs


def sync_cartpole(env, envs):
    state = np.stack([e.unwrapped.state for e in envs])
    return env.set_state(torch.tensor(state, dtype=env.dtype))


def step_cartpoles(env, envs, actions):
    """Step ours with the actions as an int64 tensor [N] and every gymnasium env with its int."""
    td = env.step(TensorDict(action=torch.as_tensor(actions, dtype=torch.int64), batch_size=[N]))
    results = [e.step(int(a)) for e, a in zip(envs, actions)]
    obs = np.stack([r[0] for r in results])
    reward = np.array([r[1] for r in results], dtype=np.float32)[:, None]
    terminated = np.array([r[2] for r in results])[:, None]
    truncated = np.array([r[3] for r in results])[:, None]
    return td, obs, reward, terminated, truncated


def balance(obs):
    """A hand-made controller that keeps the pole up for the whole 500 steps."""
    x, x_dot, theta, theta_dot = obs.T
    return (10 * theta + theta_dot + 0.1 * x + 0.5 * x_dot > 0).astype(np.int64)


@needs_gym
def test_cartpole_one_step_matches_gymnasium_from_many_states():
    """Synced to gymnasium's state before every step, from states all over (and past) the
    termination region: observations, rewards and terminated flags agree."""
    env, envs = CartPole(N, "cpu", seed=0), gym_cartpoles(0)
    rng = np.random.default_rng(1)
    high = np.array([3.0, 3.0, 0.3, 3.0])  # beyond both thresholds (2.4, 0.2095 rad)
    for _ in range(100):
        for e in envs:
            e.unwrapped.state = rng.uniform(-high, high)
            e.unwrapped.steps_beyond_terminated = None
        sync_cartpole(env, envs)
        actions = rng.integers(0, 2, size=N)
        td, obs, reward, terminated, _ = step_cartpoles(env, envs, actions)
        torch.testing.assert_close(td["next", "observation"], torch.as_tensor(obs), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(td["next", "reward"], torch.as_tensor(reward))
        # float32 state: a state within ~1e-6 of a threshold could flip; none of these is
        close = np.abs(np.abs(obs[:, [0, 2]]) - [2.4, 12 * 2 * math.pi / 360]).min() < 1e-5
        if not close:
            assert torch.equal(td["next", "terminated"], torch.as_tensor(terminated))


@needs_gym
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cartpole_episodes_match_gymnasium(dtype):
    """Whole episodes from gymnasium's reset states with random actions, synced only at the
    resets: the same trajectory, the same step of termination, returns equal to lengths."""
    env = CartPole(N, "cpu", seed=0, dtype=dtype)
    rng = np.random.default_rng(2)
    lengths = []
    for episode in range(5):
        envs = gym_cartpoles(100 + N * episode)
        td0 = sync_cartpole(env, envs)
        first = np.stack([np.asarray(e.unwrapped.state, dtype=np.float32) for e in envs])
        torch.testing.assert_close(td0["observation"], torch.as_tensor(first))
        alive = np.ones(N, dtype=bool)
        length = np.zeros(N, dtype=np.int64)
        while alive.any():
            actions = rng.integers(0, 2, size=N)
            td = env.step(TensorDict(action=torch.as_tensor(actions).unsqueeze(-1), batch_size=[N]))  # [N, 1]
            for i in np.flatnonzero(alive):
                obs, reward, terminated, truncated, _ = envs[i].step(int(actions[i]))
                length[i] += 1
                tol = 1e-12 if dtype == torch.float64 else 1e-4
                np.testing.assert_allclose(td["next", "observation"][i].numpy(), obs, rtol=tol, atol=tol)
                assert td["next", "reward"][i].item() == reward == 1.0
                assert td["next", "terminated"][i].item() == terminated, (episode, i, length[i])
                assert td["next", "truncated"][i].item() == truncated
                assert td["next", "done"][i].item() == (terminated or truncated)
                assert td["next", "episode_reward"][i].item() == length[i]
                alive[i] = not (terminated or truncated)
        lengths += length.tolist()
    assert 8 <= min(lengths) and max(lengths) < 100  # random actions drop the pole quickly


@needs_gym
def test_cartpole_truncates_at_500_like_gymnasium():
    # float64: under a bang-bang controller a float32 state drifts by ~1e-3 in 500 steps
    env, envs = CartPole(N, "cpu", seed=0, dtype=torch.float64), gym_cartpoles(7)
    td = sync_cartpole(env, envs)
    obs = td["observation"].numpy()
    for t in range(500):
        td, obs, reward, terminated, truncated = step_cartpoles(env, envs, balance(obs))
        torch.testing.assert_close(td["next", "observation"], torch.as_tensor(obs), rtol=1e-6, atol=1e-6)
        assert not terminated.any()
        assert torch.equal(td["next", "truncated"], torch.as_tensor(truncated)), t
        assert torch.equal(td["next", "done"], torch.as_tensor(truncated))
    assert td["next", "truncated"].all() and not td["next", "terminated"].any()
    assert td["next", "episode_reward"].eq(500).all()


def test_cartpole_reset_distribution_and_layout():
    env = CartPole(4096, "cpu", seed=3)
    td = env.reset()
    assert td.batch_size == torch.Size([4096]) and td["observation"].shape == (4096, 4)
    assert td["observation"].dtype == torch.float32
    assert env.state.abs().max() <= 0.05 and env.state.min() < -0.049 and env.state.max() > 0.049
    again = CartPole(4096, "cpu", seed=3).reset()
    assert torch.equal(td["observation"], again["observation"])  # the seed decides
    td["action"] = torch.zeros(4096, dtype=torch.int64)
    td = env.step(td)
    for key in ("reward", "done", "terminated", "truncated", "episode_reward"):
        assert td["next", key].shape == (4096, 1), key
    assert td["next", "done"].dtype == torch.bool and td["next", "reward"].eq(1).all()


def test_cartpole_step_and_maybe_reset_restarts_finished_episodes_only():
    env = CartPole(N, "cpu", seed=0, max_steps=5)
    td = env.reset()
    env.step_count[:2] = 4  # two envs are truncated at the first step
    for t in range(2):
        td["action"] = torch.ones(N, 1, dtype=torch.int64)
        td, next_td = env.step_and_maybe_reset(td)
        if t == 0:
            assert td["next", "done"].squeeze(-1).tolist() == [True, True] + [False] * (N - 2)
            assert td["next", "truncated"].squeeze(-1).tolist() == [True, True] + [False] * (N - 2)
            # the final observation follows the dynamics; the restarted envs start afresh
            assert not torch.equal(next_td["observation"][:2], td["next", "observation"][:2])
            assert next_td["observation"][:2].abs().max() <= 0.05
            torch.testing.assert_close(next_td["observation"][2:], td["next", "observation"][2:])
        td = next_td
    assert env.step_count.tolist() == [1, 1, 2, 2, 2, 2]
    assert env.episode_reward.tolist() == [1, 1, 2, 2, 2, 2]
    torch.testing.assert_close(next_td["observation"], env.observation())


def test_cartpole_terminates_and_restarts():
    """Pushing right all the time drops the pole; those envs restart, with fresh states."""
    env = CartPole(N, "cpu", seed=4)
    td = env.reset()
    ended = torch.zeros(N, dtype=torch.bool)
    for _ in range(40):
        td["action"] = torch.ones(N, dtype=torch.int64)
        td, next_td = env.step_and_maybe_reset(td)
        ended |= td["next", "terminated"].squeeze(-1)
        assert not td["next", "truncated"].any()
        td = next_td
    assert ended.all()
    assert (env.step_count < 40).all() and env.episode_reward.equal(env.step_count.float())


@pytest.mark.cuda
def test_cartpole_no_host_sync_on_cuda(cuda):
    env = CartPole(64, cuda, seed=0, max_steps=3)
    td = env.reset()
    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Synchronization debug mode is a prototype")
        torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(8):
            td["action"] = torch.ones(64, dtype=torch.int64, device=cuda)
            td, next_td = env.step_and_maybe_reset(td)
            td = next_td
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert td["observation"].device == cuda
