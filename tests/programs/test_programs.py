"""Real programs run eagerly and through the wrappers, with only the wrapper changed.

CPU: ``graphmodule.CudaGraphModule(..., backend="simulate")`` against no wrapper, same seed:
the metrics of every iteration must agree (the eager oracle). The simulated backend runs the
whole capture/replay machinery (static buffers, input checks, effects, outputs), each replay
re-running the function on the buffers, so any difference is the wrapper's doing.

CUDA (marked ``cuda``): eager, ``tensordict.nn.CudaGraphModule`` and ours, same seed, same
losses and returns (tensordict's run and its eager reference in a child process: see
``run_on_cuda``); and a longer run through ours learns.
"""

from __future__ import annotations

import math

import pytest
import torch

from . import ppo, sac, td3, train_step
from .common import make_wrap
from .isolated import run_programs

# Short runs (a few seconds in all on one CPU thread) that still warm up, capture and replay
# every wrapped function, and end a few episodes (short episodes) to exercise the resets.
SHORT = {
    "ppo_closure": (ppo.run_ppo, dict(steps=4, variant="closure", num_envs=4, rollout=8, minibatch=16,
                                      epochs=2, hidden=32, max_episode_steps=10, burnin=1)),
    "ppo_tdmodule": (ppo.run_ppo, dict(steps=4, variant="tdmodule", num_envs=4, rollout=8, minibatch=16,
                                       epochs=2, hidden=32, max_episode_steps=10, burnin=1)),
    "sac": (sac.run_sac, dict(steps=40, num_envs=4, learning_starts=8, batch_size=16, hidden=32,
                              max_episode_steps=16, burnin=4)),
    "td3": (td3.run_td3, dict(steps=40, num_envs=4, learning_starts=8, batch_size=16, hidden=32,
                              max_episode_steps=16, burnin=4)),
    "train_step": (train_step.run_train_step, dict(steps=12, batch_size=32, hidden=32)),
}
# (the compiled train step has its own file, test_programs_compiled.py: compilation is slow)


def assert_same_metrics(got: dict, ref: dict, rtol: float, atol: float) -> None:
    assert got["metrics"].keys() == ref["metrics"].keys()
    for key, values in ref["metrics"].items():
        assert len(got["metrics"][key]) == len(values), key
        torch.testing.assert_close(
            torch.tensor(got["metrics"][key]), torch.tensor(values), rtol=rtol, atol=atol, equal_nan=True,
            msg=lambda m, key=key: f"metric {key!r} differs from the eager run:\n{m}")


def check_reference(name: str, ref: dict) -> None:
    """The eager run is a meaningful oracle: finite losses, and episodes that ended."""
    for key, values in ref["metrics"].items():
        assert values, key
        if key != "episode_return":
            assert all(math.isfinite(v) for v in values), key
    if "episode_return" in ref["metrics"]:
        assert any(math.isfinite(v) for v in ref["metrics"]["episode_return"]), name
    assert ref["timing"]["steps"] > 0 and ref["timing"]["steps_per_s"] > 0


@pytest.mark.parametrize("name", list(SHORT))
def test_simulated_graphs_match_eager(name):
    run, config = SHORT[name]
    ref = run(make_wrap("eager"), device="cpu", seed=0, **config)
    check_reference(name, ref)
    wrap = make_wrap("graphmodule", backend="simulate")
    got = run(wrap, device="cpu", seed=0, **config)
    # the same operations on the same values: equal up to the last bits (a static buffer's
    # alignment may pick another CPU matmul kernel)
    assert_same_metrics(got, ref, rtol=1e-5, atol=1e-6)
    assert wrap.built, "the program wrapped nothing"
    for graphed in wrap.built:  # every wrapped function was captured and then replayed
        assert graphed.stats.captures == 1 and graphed.stats.replays > 0, graphed.explain()


@pytest.mark.parametrize("name", list(SHORT))
def test_eager_runs_are_deterministic(name):
    """The oracle comparison means something only if a program repeats itself exactly."""
    run, config = SHORT[name]
    first = run(make_wrap("eager"), device="cpu", seed=0, **config)
    again = run(make_wrap("eager"), device="cpu", seed=0, **config)
    assert_same_metrics(again, first, rtol=0, atol=0)
    key = "reward" if "reward" in first["metrics"] else "loss"
    other = run(make_wrap("eager"), device="cpu", seed=1, **config)
    assert other["metrics"][key] != first["metrics"][key]  # and the seed matters


# -- CUDA ------------------------------------------------------------------------------------
# Short runs on the GPU: sizes near the published defaults, a few iterations.
CUDA_SHORT = {
    "ppo_closure": (ppo.run_ppo, dict(steps=3, variant="closure", max_episode_steps=100, burnin=1)),
    "ppo_tdmodule": (ppo.run_ppo, dict(steps=3, variant="tdmodule", max_episode_steps=100, burnin=1)),
    "sac": (sac.run_sac, dict(steps=120, learning_starts=50, max_episode_steps=50)),
    "td3": (td3.run_td3, dict(steps=120, learning_starts=50, max_episode_steps=50)),
    "train_step": (train_step.run_train_step, dict(steps=50)),
}

# tensordict 0.15.3 refuses TorchRL's PPO update shape: with in_keys=[] a tensor passed
# next to the TensorDict (num_network_updates=...) raises at capture ("All tensors must be
# passed in the tensordict"), and so would the tuple it returns.
TD_REFUSES = {"ppo_closure": "tensordict's CudaGraphModule takes no tensor beside the TensorDict (in_keys=[])"}


def cuda_cases():
    for name in CUDA_SHORT:
        for wrapper in ("tensordict", "graphmodule"):
            marks = [pytest.mark.cuda]
            if wrapper == "tensordict" and name in TD_REFUSES:
                marks.append(pytest.mark.xfail(raises=(ValueError, RuntimeError), strict=False,
                                               reason=TD_REFUSES[name]))
            yield pytest.param(name, wrapper, marks=marks, id=f"{name}-{wrapper}")


def run_on_cuda(run, config, wrapper, device):
    """The eager run and the run through ``wrapper``, same seed, and the wrappers built.

    tensordict's run is made with its eager reference in a child process (``isolated``): a
    capture that tensordict's wrapper fails leaves its process's CUDA state broken (the
    generator at once, an abort when its half-built graph is destroyed), which would fail
    the tests that follow in this one. Its wrappers come back as ``{"repr", "graph"}``.
    """
    if wrapper == "tensordict":
        ref, got = run_programs(run, config, ["eager", wrapper], device=device)
        return ref, got, got["built"]
    ref = run(make_wrap("eager"), device=device, seed=0, **config)
    wrap = make_wrap(wrapper, backend="cuda")
    got = run(wrap, device=device, seed=0, **config)
    return ref, got, wrap.built


def check_cuda_run(name, wrapper, ref, got, built):
    check_reference(name, ref)
    # graph replays draw the same random numbers as eager calls (philox offsets); only
    # kernel choices inside a graph may differ in the last bits
    assert_same_metrics(got, ref, rtol=1e-3, atol=1e-4)
    assert built, "the program wrapped nothing"
    for graphed in built:  # every wrapped function was captured (and, for ours, replayed)
        if wrapper == "graphmodule":
            assert graphed.stats.captures == 1 and graphed.stats.replays > 0, graphed.explain()
        else:
            assert graphed["graph"], graphed["repr"]


@pytest.mark.parametrize("name,wrapper", list(cuda_cases()))
def test_cuda_wrappers_match_eager(name, wrapper, cuda):
    run, config = CUDA_SHORT[name]
    check_cuda_run(name, wrapper, *run_on_cuda(run, config, wrapper, cuda))


# Longer runs through graphmodule: the agent gets better. Pendulum: a random policy scores
# about -1200 per 200-step episode, a good one -150 to -300. Eager CPU runs of these configs
# (seeds 0 and 1) end near -250 (SAC, PPO); the thresholds leave room for other random draws.
def finite(values):
    return [v for v in values if math.isfinite(v)]


def late_return(metrics, episodes=5):
    returns = finite(metrics["episode_return"])
    return sum(returns[-episodes:]) / len(returns[-episodes:])


def early_return(metrics, episodes=5):
    returns = finite(metrics["episode_return"])
    return sum(returns[:episodes]) / len(returns[:episodes])


LEARNS = {
    "sac": (sac.run_sac, dict(steps=4000, num_envs=2), lambda m: late_return(m) > -600),
    # TD3 is slower on Pendulum: about -1400 -> -550 on the CPU run; asked to gain 400
    "td3": (td3.run_td3, dict(steps=6000, num_envs=4), lambda m: late_return(m) > early_return(m) + 400),
    "ppo_closure": (ppo.run_ppo, dict(steps=60, variant="closure", epochs=10), lambda m: late_return(m) > -600),
    "ppo_tdmodule": (ppo.run_ppo, dict(steps=60, variant="tdmodule", epochs=10), lambda m: late_return(m) > -600),
    "train_step": (train_step.run_train_step, dict(steps=300),
                   lambda m: sum(m["loss"][-20:]) / 20 < 0.1 * sum(m["loss"][:5]) / 5),
}


@pytest.mark.cuda
@pytest.mark.parametrize("name", list(LEARNS))
def test_cuda_graphmodule_learns(name, cuda):
    run, config, learned = LEARNS[name]
    result = run(make_wrap("graphmodule", backend="cuda"), device=cuda, seed=0, **config)
    metrics = result["metrics"]
    assert learned(metrics), {k: v[:3] + ["..."] + v[-3:] for k, v in metrics.items()}
