"""TorchRL's losses, target updaters and collector, wrapped in graphmodule's CudaGraphModule.

graphmodule is a drop-in for ``tensordict.nn.CudaGraphModule``, whose first users are TorchRL's
published scripts: they wrap a whole update step (the loss's forward, backward, the optimizer's
step, the target network updater's step) and the collector's policy (``cudagraph_policy=``).
Each test runs the plain step and the wrapped one on deep copies of the same modules, from the
same seeds, and compares what a user can observe: the losses of every step, then the
parameters, the target parameters (buffers of the loss module) and the optimizers' state.

Skipped where torchrl is absent (CI installs it: see ``.ci/run``).
"""

from __future__ import annotations

import copy
import warnings
from typing import Callable, NamedTuple

import pytest
import torch
from torch import nn

with warnings.catch_warnings():
    # torchrl's import-time notices about tensordict and its own deprecations: not ours
    warnings.simplefilter("ignore")
    pytest.importorskip("torchrl")
    import tensordict.nn
    import torchrl.collectors
    from tensordict import TensorDict
    from tensordict.nn import InteractionType, TensorDictModule
    from tensordict.nn.distributions import NormalParamExtractor
    from torchrl.data import Bounded, OneHot
    from torchrl.modules import MLP, ProbabilisticActor, QValueActor, TanhModule, TanhNormal, ValueOperator
    from torchrl.objectives import ClipPPOLoss, DDPGLoss, DQNLoss, HardUpdate, SACLoss, SoftUpdate, TD3Loss

from graphmodule import CudaGraphModule, UnsupportedError

# the scripts' plain Adam is made capturable (fused where simulated) with a warning, tested in test_optim
pytestmark = pytest.mark.filterwarnings(r"ignore:CudaGraphModule\(\w+\) made the optimizer\(s\) it steps:UserWarning")

OBS, ACT, N_ACTIONS, BATCH, STEPS, WARMUP = 3, 1, 4, 8, 6, 2


@pytest.fixture(autouse=True)
def _capturing_as_on_a_gpu(request, monkeypatch):
    """TorchRL's TanhNormal checks its bounds on the host (``if (high > low).all()``, a sync)
    unless ``torch.cuda.is_current_stream_capturing()``, which it asks only where CUDA is
    available: on a CPU the simulated capture would meet a sync that a GPU's capture never
    runs. Under "simulate" both runs (plain and wrapped) take the branch a capture takes on a GPU."""
    if "graph_backend" in request.fixturenames and request.getfixturevalue("graph_backend") == "simulate":
        from torchrl.modules.distributions import continuous

        monkeypatch.setattr(continuous, "safe_is_current_stream_capturing", lambda: True)
TOL = dict(rtol=1e-4, atol=1e-5)


class Algo(NamedTuple):
    """One TorchRL loss as a script builds it, and what a step of it needs."""

    loss: nn.Module
    make_updater: Callable[[nn.Module], object]
    loss_keys: tuple[str, ...]
    batch: Callable[[int], TensorDict]


def _bounded():
    return Bounded(-2.0, 2.0, shape=(ACT,))


def _q_net():  # (the critic of SAC, TD3 and DDPG: Q(observation, action))
    return ValueOperator(MLP(num_cells=[16, 16], out_features=1), in_keys=["action", "observation"])


def _tanh_normal_actor():
    spec = _bounded()
    net = nn.Sequential(MLP(num_cells=[16, 16], out_features=2 * ACT), NormalParamExtractor())
    return ProbabilisticActor(
        TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"]),
        spec=spec,
        in_keys=["loc", "scale"],
        distribution_class=TanhNormal,
        distribution_kwargs={"low": spec.space.low, "high": spec.space.high, "tanh_loc": False},
        default_interaction_type=InteractionType.RANDOM,
        return_log_prob=True,
    )


def _deterministic_actor():
    return tensordict.nn.TensorDictSequential(
        TensorDictModule(MLP(num_cells=[16, 16], out_features=ACT), in_keys=["observation"], out_keys=["param"]),
        TanhModule(in_keys=["param"], out_keys=["action"], spec=_bounded()),
    )


def _transitions(i: int, action: Callable[[torch.Generator], torch.Tensor]) -> TensorDict:
    """A replay-buffer sample: drawn on the CPU from seed ``i``, on the default device."""
    gen = torch.Generator().manual_seed(1000 + i)
    done = torch.rand(BATCH, 1, generator=gen, device="cpu") < 0.2
    td = TensorDict(
        {
            "observation": torch.randn(BATCH, OBS, generator=gen, device="cpu"),
            "action": action(gen),
            ("next", "observation"): torch.randn(BATCH, OBS, generator=gen, device="cpu"),
            ("next", "reward"): torch.randn(BATCH, 1, generator=gen, device="cpu"),
            ("next", "done"): done,
            ("next", "terminated"): done.clone(),
        },
        [BATCH],
    )
    return td.to(torch.get_default_device())


def _continuous(i):
    return _transitions(i, lambda gen: torch.rand(BATCH, ACT, generator=gen, device="cpu") * 4 - 2)


def _initialized(*nets):
    """Run each net once on a batch so that lazy layers (torchrl's MLP) get their shapes."""
    td = _continuous(0)
    with torch.no_grad():
        for net in nets:
            net(td)


def sac():
    actor, qvalue = _tanh_normal_actor(), _q_net()
    _initialized(actor, qvalue)
    loss = SACLoss(actor, qvalue, num_qvalue_nets=2, loss_function="l2", delay_qvalue=True)
    loss.make_value_estimator(gamma=0.99)
    return Algo(loss, lambda l: SoftUpdate(l, eps=0.995), ("loss_actor", "loss_qvalue", "loss_alpha"), _continuous)


def td3():
    actor, qvalue = _deterministic_actor(), _q_net()
    _initialized(actor, qvalue)
    loss = TD3Loss(actor, qvalue, action_spec=_bounded(), num_qvalue_nets=2, loss_function="l2")
    loss.make_value_estimator(gamma=0.99)
    return Algo(loss, lambda l: SoftUpdate(l, eps=0.995), ("loss_actor", "loss_qvalue"), _continuous)


def ddpg():
    actor, value = _deterministic_actor(), _q_net()
    _initialized(actor, value)
    loss = DDPGLoss(actor, value, loss_function="l2", delay_actor=True, delay_value=True)
    loss.make_value_estimator(gamma=0.99)
    return Algo(loss, lambda l: SoftUpdate(l, eps=0.995), ("loss_actor", "loss_value"), _continuous)


def dqn():
    spec = OneHot(N_ACTIONS)
    qnet = QValueActor(MLP(num_cells=[16, 16], out_features=N_ACTIONS), in_keys=["observation"], spec=spec)
    _initialized(qnet)
    loss = DQNLoss(qnet, loss_function="l2", delay_value=True, action_space=spec)
    loss.make_value_estimator(gamma=0.99)

    def batch(i):
        return _transitions(i, lambda gen: nn.functional.one_hot(torch.randint(N_ACTIONS, (BATCH,), generator=gen, device="cpu"), N_ACTIONS))

    return Algo(loss, lambda l: HardUpdate(l, value_network_update_interval=3), ("loss",), batch)


def ppo():
    actor = _tanh_normal_actor()
    value = ValueOperator(MLP(num_cells=[16, 16], out_features=1), in_keys=["observation"])
    _initialized(actor, value)
    behaviour = copy.deepcopy(actor)  # the policy that collected the data: its log-probs

    def batch(i):
        td = _continuous(i)
        gen = torch.Generator().manual_seed(2000 + i)
        td["advantage"] = torch.randn(BATCH, 1, generator=gen, device="cpu").to(td.device)
        td["value_target"] = torch.randn(BATCH, 1, generator=gen, device="cpu").to(td.device)
        with torch.no_grad():
            behaviour(td)  # (draws an action and writes its log-prob: seeded by the caller)
        return td

    loss = ClipPPOLoss(actor, value, clip_epsilon=0.2, entropy_coeff=0.01)
    return Algo(loss, lambda l: None, ("loss_objective", "loss_critic", "loss_entropy"), batch)


ALGOS = {"sac": sac, "td3": td3, "ddpg": ddpg, "dqn": dqn, "ppo": ppo}


def _adam(capturable: bool):
    def make(params):
        return torch.optim.Adam(params, lr=1e-2, capturable=capturable)

    return make


def _update(algo: Algo, loss: nn.Module, make_opt):
    """The update step of the published scripts: loss, backward, step, zero_grad, target step."""
    opt, updater, keys = make_opt(loss.parameters()), algo.make_updater(loss), algo.loss_keys

    def update(batch):
        out = loss(batch)
        sum(out[key] for key in keys).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if updater is not None:
            updater.step()
        return out.detach()

    return update, opt


def _state(loss: nn.Module, opt) -> dict:
    """What a step leaves behind: parameters, buffers (target parameters included), optimizer state."""
    return {
        "module": TensorDict.from_module(loss).to_dict(),
        "grads": {name: p.grad for name, p in loss.named_parameters()},
        "optimizer": opt.state_dict()["state"],
    }


def _run(update, algo: Algo, seed=1) -> tuple[list[dict], list[dict]]:
    """The results of ``STEPS`` calls, and the batches as the calls left them (a loss may write
    into its input)."""
    torch.manual_seed(seed)  # (SAC and TD3 draw noise inside the step, PPO's batches an action)
    results, batches = [], []
    for i in range(STEPS):
        batch = algo.batch(i)
        results.append(update(batch).to_dict())
        batches.append(batch.to_dict())
    return results, batches


def _skip_without_cuda_capturable(graph_backend, capturable):
    if capturable and graph_backend != "cuda":
        pytest.skip("torch's Adam(capturable=True) steps only CUDA tensors")


@pytest.mark.parametrize("capturable", [False, True], ids=["adam", "adam_capturable"])
@pytest.mark.parametrize("name", sorted(ALGOS))
def test_update_step_matches_the_plain_step(graph_backend, name, capturable):
    _skip_without_cuda_capturable(graph_backend, capturable)
    torch.manual_seed(0)
    algo = ALGOS[name]()
    plain_loss = copy.deepcopy(algo.loss)
    plain, plain_opt = _update(algo, plain_loss, _adam(capturable))
    step, opt = _update(algo, algo.loss, _adam(capturable))
    wrapped = CudaGraphModule(step, in_keys=[], out_keys=[], warmup=WARMUP, backend=graph_backend)

    want, want_batches = _run(plain, algo)
    if name == "dqn":
        # HardUpdate counts its calls in a Python int and copies the weights every few calls:
        # Python a replay would skip, refused at capture (its step outside the wrapper is served,
        # see test_dqn_with_the_hard_update_outside_the_step)
        with pytest.raises(UnsupportedError) as info:
            _run(wrapped, algo)
        assert "the function changes Python state, which a replay (GPU work only) would not: closure variable " \
               "'updater' of _update.<locals>.update.counter was rebound (2 → 3)." in str(info.value)
        return
    got, got_batches = _run(wrapped, algo)

    for i in range(STEPS):
        torch.testing.assert_close(got[i], want[i], **TOL, msg=lambda m: f"step {i}, result: {m}")
        torch.testing.assert_close(got_batches[i], want_batches[i], **TOL, msg=lambda m: f"step {i}, batch: {m}")
    torch.testing.assert_close(_state(algo.loss, opt), _state(plain_loss, plain_opt), **TOL)
    assert wrapped.stats.replays >= STEPS - WARMUP, wrapped.stats



def test_dqn_with_the_hard_update_outside_the_step(graph_backend):
    # HardUpdate counts its calls in a Python int: a step that calls it inside is the test
    # above; here it steps after each call, outside the wrapped function
    torch.manual_seed(0)
    algo = dqn()
    plain_loss = copy.deepcopy(algo.loss)
    runs = []
    for loss, wrap in ((plain_loss, False), (algo.loss, True)):
        step, opt = _update(algo._replace(make_updater=lambda l: None), loss, _adam(False))
        updater = HardUpdate(loss, value_network_update_interval=3)
        call = CudaGraphModule(step, in_keys=[], out_keys=[], warmup=WARMUP, backend=graph_backend) if wrap else step

        def update(batch, call=call, updater=updater):
            out = call(batch)
            updater.step()
            return out

        runs.append((_run(update, algo), _state(loss, opt)))
    (want, want_batches), want_state = runs[0]
    (got, got_batches), got_state = runs[1]
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(got_batches, want_batches, **TOL)
    torch.testing.assert_close(got_state, want_state, **TOL)


@pytest.mark.parametrize("capturable", [False, True], ids=["adam", "adam_capturable"])
def test_td3_update_with_the_alternating_actor_flag(graph_backend, capturable):
    """TD3's published step: the critic at every call, the actor and the targets every
    ``policy_update_delay`` (2) calls, chosen by a Python bool argument."""
    _skip_without_cuda_capturable(graph_backend, capturable)
    torch.manual_seed(0)
    algo = td3()
    plain_loss = copy.deepcopy(algo.loss)
    runs = []
    for loss, wrap in ((plain_loss, False), (algo.loss, True)):
        actor_opt = _adam(capturable)(loss.actor_network_params.flatten_keys().values())
        critic_opt = _adam(capturable)(loss.qvalue_network_params.flatten_keys().values())
        updater = SoftUpdate(loss, eps=0.995)

        def update(batch, update_actor, loss=loss, actor_opt=actor_opt, critic_opt=critic_opt, updater=updater):
            q_loss, *_ = loss.value_loss(batch)
            q_loss.backward()
            critic_opt.step()
            critic_opt.zero_grad(set_to_none=True)
            if update_actor:
                actor_loss, *_ = loss.actor_loss(batch)
                actor_loss.backward()
                actor_opt.step()
                actor_opt.zero_grad(set_to_none=True)
                updater.step()
            else:
                actor_loss = q_loss.new_zeros(())
            return q_loss.detach(), actor_loss.detach()

        call = CudaGraphModule(update, in_keys=[], out_keys=[], warmup=WARMUP, backend=graph_backend) if wrap else update
        torch.manual_seed(1)
        results = [call(algo.batch(i), (i + 1) % 2 == 0) for i in range(2 * STEPS)]
        state = {"module": TensorDict.from_module(loss).to_dict(), "actor": actor_opt.state_dict()["state"],
                 "critic": critic_opt.state_dict()["state"]}
        runs.append((results, state))
    (want, want_state), (got, got_state) = runs
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(got_state, want_state, **TOL)


@pytest.fixture
def bound_to_ours(graph_backend, monkeypatch):
    """``tensordict.nn.CudaGraphModule`` bound to graphmodule's (on the test's backend), there and
    in the torchrl modules that imported the name: the wrappers made are listed."""
    made = []

    class Ours(CudaGraphModule):
        def __init__(self, module, *args, backend=graph_backend, **kwargs):
            super().__init__(module, *args, backend=backend, **kwargs)
            made.append(self)

    monkeypatch.setattr(tensordict.nn, "CudaGraphModule", Ours)
    for name in TORCHRL_IMPORTERS:
        module = __import__(name, fromlist=["CudaGraphModule"])
        monkeypatch.setattr(module, "CudaGraphModule", Ours)
    return made


# the torchrl modules that did `from tensordict.nn import CudaGraphModule` (torchrl 0.14)
TORCHRL_IMPORTERS = ["torchrl.collectors._single", "torchrl.collectors._multi_base"]


def test_collector_policy_matches_the_plain_collector(bound_to_ours):
    pytest.importorskip("gymnasium")
    from torchrl.envs import GymEnv

    # (torchrl 0.14 renamed SyncDataCollector to Collector)
    Collector = getattr(torchrl.collectors, "Collector", None) or torchrl.collectors.SyncDataCollector
    torch.manual_seed(0)
    policy = _deterministic_actor()
    _initialized(policy)
    device = torch.get_default_device()
    rollouts = []
    for cudagraph in (False, True):
        with torch.device("cpu"):
            env = GymEnv("Pendulum-v1", device="cpu")
        env.set_seed(0)  # (before the collector, which resets the env when built)
        collector = Collector(
            env, copy.deepcopy(policy), frames_per_batch=16, total_frames=64, device=device,
            env_device="cpu", cudagraph_policy=cudagraph, auto_register_policy_transforms=False,
        )
        rollouts.append([batch.to_dict() for batch in collector])
        collector.shutdown()
    plain, wrapped = rollouts
    assert len(bound_to_ours) == 1, bound_to_ours
    assert bound_to_ours[0].stats.replays > 0, bound_to_ours[0].stats
    torch.testing.assert_close([r["action"] for r in wrapped], [r["action"] for r in plain], **TOL)
    torch.testing.assert_close(wrapped, plain, **TOL)


def test_the_launcher_binds_ours_where_scripts_and_collectors_import_it(tmp_path):
    """scripts/torchrl_launch.py (the published scripts' GPU run): a script run through it gets
    graphmodule's wrapper from ``tensordict.nn`` and torchrl's collector modules, and its run is
    a line of the results file."""
    import json
    import os
    import subprocess
    import sys

    script = tmp_path / "script.py"
    script.write_text(
        "import sys, graphmodule, torchrl.collectors._single as single\n"
        "from tensordict.nn import CudaGraphModule\n"
        "from torchrl.collectors import SyncDataCollector\n"  # (a name of torchrl before 0.14)
        "assert issubclass(CudaGraphModule, graphmodule.CudaGraphModule), CudaGraphModule\n"
        "assert single.CudaGraphModule is CudaGraphModule\n"
        "assert sys.argv[1:] == ['collector.total_frames=1_000', 'compile.cudagraphs=True'], sys.argv\n"
        "CudaGraphModule(lambda x: x + 1, backend='simulate')(__import__('torch').zeros(2))\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    results = tmp_path / "results.jsonl"
    proc = subprocess.run(
        [sys.executable, os.path.join(root, "scripts", "torchrl_launch.py"), str(results), str(script),
         "collector.total_frames=1_000", "compile.cudagraphs=True"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = [json.loads(line) for line in results.read_text().splitlines()]
    assert (row["error"], row["cudagraphs"], row["frames"], row["wrapper"]) == (None, "True", 1000, "graphmodule")
    assert [(g["warmup_calls"], g["eager_calls"]) for g in row["graphs"]] == [(1, 0)]
