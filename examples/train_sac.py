"""SAC on a batched torch Pendulum: env steps and updates as CUDA graphs.

    python examples/train_sac.py --mode graph --out results/      # then: benchmarks/results_table.py results/
    python examples/train_sac.py --mode eager --envs 64 --steps 640000 --max-seconds 60
    python examples/train_sac.py --smoke --mode graph              # a few seconds on a CPU

``--mode graph`` wraps two functions in ``graphmodule.CudaGraphModule``: ``explore_steps``
(random actions while the replay buffer fills) and ``train_steps`` (two env steps, each a batch
from the device-side replay buffer, critic and actor updates with ``capturable=True`` Adam, and
the env step on a side stream beside them). ``eager`` runs the same functions unwrapped,
``compile`` uses ``torch.compile``, ``compile+graph`` compiles inside the graphs. Without CUDA
the graph modes run eagerly (same training). On CUDA the run also measures its floor: the GPU
time of one update per env step. ``--out DIR`` writes a CSV, a JSON summary and a plot.
How it is built, and results on a GPU: docs/rl-guide.md.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import math
import os
import sys
from types import SimpleNamespace

if __package__ in (None, ""):  # run as a file: make ``examples`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.nn.functional as F
from tensordict import TensorDict, from_module
from torch import nn

from examples.common.envs import Pendulum
from examples.common.training import ReplayBuffer, Report, compiled, gpu_seconds_per_call, graphed, parse_flags, run_training
from graphmodule import CudaGraphModule

SCRIPT, ALGO = "train_sac", "SAC"

# --envs, --steps and the rest; --smoke swaps in tiny sizes (explicit flags still win)
DEFAULTS = dict(envs=4, steps=40_000, batch_size=256, hidden=128, learning_starts=250, log_every=100, overlap=1,
                floor_calls=20)
SMOKE = dict(envs=2, steps=2 * 440, batch_size=32, hidden=16, learning_starts=50, log_every=50, overlap=1, floor_calls=5)
# this script's own flags (integers; --help lists them between --steps and --seed)
FLAGS = {
    "--batch-size": f"sampled transitions per update (default {DEFAULTS['batch_size']})",
    "--hidden": f"hidden units (default {DEFAULTS['hidden']})",
    "--learning-starts":
        f"batched env steps with random actions before the updates (default {DEFAULTS['learning_starts']})",
    "--log-every": "batched env steps between progress reports (each reads the device)",
    "--overlap": dict(type=int, choices=(0, 1), help="1 (default): on CUDA, each env step runs on a side stream "
                      "beside the updates (parallel branches of the graph); 0: one stream. Same training either way"),
    "--floor-calls": "timed calls of each floor graph after training (CUDA, eager and graph modes; 0: none; "
                     f"default {DEFAULTS['floor_calls']})",
}
FLOOR_REPEATS = 10  # updates (env steps) per graph in the floor measurement
GAMMA, TAU, POLICY_FREQUENCY = 0.99, 0.005, 2
Q_LR, POLICY_LR = 1e-3, 3e-4
BUFFER_SIZE = 100_000
LOG_2PI = math.log(2 * math.pi)


# -- the agent ----------------------------------------------------------------------------------

def mlp(n_in: int, hidden: int, n_out: int, device) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, hidden, device=device), nn.ReLU(),
                         nn.Linear(hidden, hidden, device=device), nn.ReLU(),
                         nn.Linear(hidden, n_out, device=device))


class Actor(nn.Module):
    """A tanh-squashed Gaussian policy with a state-dependent scale."""

    def __init__(self, hidden: int, device) -> None:
        super().__init__()
        self.trunk = mlp(Pendulum.obs_dim, hidden, 2 * Pendulum.act_dim, device)

    def get_action(self, obs: torch.Tensor):
        """``(action, log_prob [N, 1], mean action)``. ``loc + scale * randn_like(loc)``
        rather than a distribution's ``sample()``: ``torch.normal`` checks ``scale >= 0`` on
        the host, which a CUDA graph cannot capture."""
        loc, log_std = self.trunk(obs).chunk(2, -1)
        log_std = -5 + 3.5 * (log_std.tanh() + 1)  # in [-5, 2]
        x = loc + log_std.exp() * torch.randn_like(loc)
        y = x.tanh()
        log_prob = -0.5 * (x - loc).div(log_std.exp()).pow(2) - log_std - 0.5 * LOG_2PI
        log_prob = log_prob - torch.log(Pendulum.max_torque * (1 - y.pow(2)) + 1e-6)
        return Pendulum.max_torque * y, log_prob.sum(-1, keepdim=True), Pendulum.max_torque * loc.tanh()

    def explore(self, obs: torch.Tensor) -> torch.Tensor:
        return self.get_action(obs)[0]

    def mean_action(self, obs: torch.Tensor) -> torch.Tensor:
        return self.get_action(obs)[2]


class QNet(nn.Module):
    def __init__(self, hidden: int, device) -> None:
        super().__init__()
        self.net = mlp(Pendulum.obs_dim + Pendulum.act_dim, hidden, 1, device)

    def forward(self, obs, action):
        return self.net(torch.cat([obs, action], -1))


def frozen(module: nn.Module, *args):
    """Call ``module`` with its parameters detached: gradients reach the inputs only."""
    params = {name: p.detach() for name, p in module.named_parameters()}
    return torch.func.functional_call(module, params, args)


# -- training ---------------------------------------------------------------------------------

class SideStream:
    """Work queued inside ``with side.branch():`` runs on a side CUDA stream, concurrently with
    what the caller's stream queues after it, until ``side.join()``; inside a graph capture the
    two become parallel branches of the graph. Disabled or without CUDA: everything runs in
    order on the one stream, which computes the same thing (the branch must share no tensor
    that the other work writes)."""

    def __init__(self, device: torch.device, enabled: bool) -> None:
        self.stream = torch.cuda.Stream(device) if enabled and device.type == "cuda" else None

    @contextlib.contextmanager
    def branch(self):
        if self.stream is None:
            yield
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))  # fork
        with torch.cuda.stream(self.stream):
            yield

    def join(self) -> None:
        if self.stream is not None:
            torch.cuda.current_stream(self.stream.device).wait_stream(self.stream)


def make_sac(args, device: torch.device, add_episodes) -> SimpleNamespace:
    """One SAC agent with its env, replay buffer and optimizers, and the functions that train
    it (not wrapped in graphs): ``explore_steps`` and ``train_steps`` (``POLICY_FREQUENCY``
    batched env steps each), ``update_once`` (one env step's share of the updates, for the
    floor), ``env`` and ``policy`` (the actor's copy that acts, for the evaluation).
    ``add_episodes(done, episode_reward)`` counts the finished episodes on the device."""
    # seed=None: the reset states come from torch's default generator, the one generator a
    # CUDA graph registers by itself; the step graphs replay the env's resets too
    env = Pendulum(args.envs, device, seed=None)
    cuda, compiling = device.type == "cuda", args.mode in ("compile", "compile+graph")
    # CUDA: capturable (step counts on the device) and, uncompiled, fused (one update kernel);
    # a CPU: fused (its step counts stay tensors, which a simulated graph needs)
    adam = dict(capturable=cuda, fused=True if not (cuda and compiling) else None)
    actor = Actor(args.hidden, device)
    # The policy that acts: a copy of the actor with its own storage, detached (no autograd
    # history), refreshed after each actor update (``sync_policy``). Its own storage lets the
    # env step run on a side stream while the actor update writes the actor.
    policy = copy.deepcopy(actor).requires_grad_(False)
    actor_params, policy_params = list(actor.parameters()), list(policy.parameters())
    qnets = nn.ModuleList([QNet(args.hidden, device), QNet(args.hidden, device)])
    qnets_target = copy.deepcopy(qnets).requires_grad_(False)
    q_params, q_target_params = from_module(qnets).data, from_module(qnets_target).data
    q_optimizer = torch.optim.Adam(qnets.parameters(), lr=Q_LR, **adam)
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=POLICY_LR, **adam)
    # the entropy temperature: learned, and read by both updates as a tensor updated in place
    target_entropy = -float(Pendulum.act_dim)
    log_alpha = torch.zeros(1, device=device, requires_grad=True)
    alpha = log_alpha.detach().exp()
    alpha_optimizer = torch.optim.Adam([log_alpha], lr=Q_LR, **adam)
    n, obs_dim, act_dim = args.envs, Pendulum.obs_dim, Pendulum.act_dim
    rb = ReplayBuffer(BUFFER_SIZE, TensorDict(
        observations=torch.zeros(n, obs_dim), actions=torch.zeros(n, act_dim), rewards=torch.zeros(n, 1),
        next_observations=torch.zeros(n, obs_dim), dones=torch.zeros(n, 1, dtype=torch.bool),
        batch_size=[n], device=device))
    side = SideStream(device, bool(args.overlap))

    def transition(obs, action):
        """Step every env with ``action``; write the transitions into the buffer (at device-side
        indices) and count the finished episodes."""
        td, _ = env.step_and_maybe_reset(TensorDict(observation=obs, action=action, batch_size=[n]))
        rb.extend(TensorDict(
            observations=obs, actions=action, rewards=td["next", "reward"],
            next_observations=td["next", "observation"], dones=td["next", "terminated"], batch_size=[n]))
        add_episodes(td["next", "done"], td["next", "episode_reward"])

    def collect_random():  # uniformly random actions, before the updates start
        transition(env.observation(), (2 * torch.rand(n, act_dim, device=device) - 1) * Pendulum.max_torque)

    def collect():
        obs = env.observation()
        transition(obs, policy.explore(obs))

    def update_critics(data):
        obs, actions, next_obs = data["observations"], data["actions"], data["next_observations"]
        with torch.no_grad():
            next_actions, next_log_pi, _ = actor.get_action(next_obs)
            next_q = torch.min(*(q(next_obs, next_actions) for q in qnets_target))
            target = data["rewards"] + (~data["dones"]).float() * GAMMA * (next_q - alpha * next_log_pi)
        q_loss = sum(F.mse_loss(q(obs, actions), target) for q in qnets)
        q_optimizer.zero_grad()
        q_loss.backward()
        q_optimizer.step()
        q_target_params.lerp_(q_params, TAU)  # soft update, in place: x += tau * (y - x)
        return q_loss.detach()

    def update_actor(data):
        obs = data["observations"]
        actor_optimizer.zero_grad()
        pi, log_pi, _ = actor.get_action(obs)
        min_q = torch.min(*(frozen(q, obs, pi) for q in qnets))
        actor_loss = (alpha * log_pi - min_q).mean()
        actor_loss.backward()
        actor_optimizer.step()
        alpha_optimizer.zero_grad()
        alpha_loss = (-log_alpha.exp() * (log_pi.detach() + target_entropy)).mean()
        alpha_loss.backward()
        alpha_optimizer.step()
        with torch.no_grad():
            alpha.copy_(log_alpha.exp())
        return actor_loss.detach()

    @torch.no_grad()
    def sync_policy():
        torch._foreach_copy_(policy_params, actor_params)  # one kernel

    collect_random, collect = compiled(collect_random, args.mode), compiled(collect, args.mode)
    update_critics, update_actor = compiled(update_critics, args.mode), compiled(update_actor, args.mode)

    @torch.no_grad()
    def explore_steps():
        """``POLICY_FREQUENCY`` batched env steps with random actions: one CUDA graph in the graph modes."""
        for _ in range(POLICY_FREQUENCY):
            collect_random()

    def train_steps():
        """``POLICY_FREQUENCY`` batched env steps, each: a batch sampled from the buffer, then
        two branches: the critic update (after the first step, the ``POLICY_FREQUENCY``
        delayed actor updates too, CleanRL's catch-up) and, on a side stream with ``--overlap
        1`` on CUDA, the env step under the policy with its buffer write. One CUDA graph in the
        graph modes. The branches share nothing: the batch was drawn before the write (it does
        not hold this step's transition), and the env step acts with ``policy``, the actor's
        copy refreshed after the actor updates, once both branches are done. Every tensor it
        reads or writes between calls (env, buffer and its cursor, networks, optimizer state)
        is updated in place, so each replay continues where the last one stopped."""
        for i in range(POLICY_FREQUENCY):
            with torch.no_grad():
                data = rb.sample(args.batch_size)
            with side.branch():
                collect()
            update_critics(data)
            if i == 0:
                for _ in range(POLICY_FREQUENCY):
                    update_actor(data)
            side.join()
            if i == 0:
                sync_policy()

    def update_once():
        """One env step's share of the updates (a batch, a critic update, an actor update):
        what runs on the GPU per env step when nothing else does (the floor)."""
        with torch.no_grad():
            data = rb.sample(args.batch_size)
        update_critics(data)
        update_actor(data)

    return SimpleNamespace(env=env, policy=policy, explore_steps=explore_steps, train_steps=train_steps,
                           update_once=update_once)


def measure_floor(args, device: torch.device) -> dict | None:
    """The GPU time of the updates alone and of the training step graph, on fresh agents of the
    same sizes (the trained one is left as it is), each as a CUDA graph of ``FLOOR_REPEATS``
    repetitions replayed ``--floor-calls`` times between CUDA events (graph replays queue
    faster than the GPU runs them: the events time the GPU). ``update_gpu_us``: one env step's
    share of the updates (a sampled batch, a critic and an actor update); ``floor_steps_per_s``
    = envs / that: the env steps/s if the GPU ran nothing but one update per env step.
    ``step_graph_gpu_us`` and ``step_graph_steps_per_s``: the same for the graph that training
    replays (env step, buffer write, updates), per env step; with ``--overlap 1``,
    ``step_graph_one_stream_gpu_us`` is that graph on one stream. CUDA, eager and graph modes
    only (compiling fresh agents would take minutes); else None."""
    if device.type != "cuda" or args.floor_calls <= 0 or args.mode not in ("eager", "graph"):
        return None
    return floor_times(args, device, gpu_seconds_per_call)


def floor_times(args, device: torch.device, seconds_per_call) -> dict:
    """:func:`measure_floor`'s measurement, with ``seconds_per_call(fn, calls)`` timing the
    calls of a graphed function (``gpu_seconds_per_call`` on CUDA)."""

    def gpu_us_per_env_step(overlap: bool, work: str) -> float:
        counters = SimpleNamespace(ended_sum=torch.zeros((), device=device),
                                   ended_count=torch.zeros((), device=device))
        bench = make_sac(SimpleNamespace(**{**vars(args), "overlap": int(overlap)}), device,
                         functools.partial(Report.add_episodes, counters))
        bench.env.reset()
        for _ in range(max(1, -(-args.batch_size // (args.envs * POLICY_FREQUENCY)))):  # a batch's worth
            bench.explore_steps()
        one, env_steps = (bench.update_once, 1) if work == "updates" else (bench.train_steps, POLICY_FREQUENCY)

        def repeated():
            for _ in range(FLOOR_REPEATS):
                one()

        seconds = seconds_per_call(CudaGraphModule(repeated, backend=args.graph_backend), args.floor_calls)
        return seconds / (FLOOR_REPEATS * env_steps) * 1e6

    update_us = gpu_us_per_env_step(bool(args.overlap), "updates")
    step_us = gpu_us_per_env_step(bool(args.overlap), "steps")
    floor = dict(update_gpu_us=round(update_us, 1), step_graph_gpu_us=round(step_us, 1),
                 floor_steps_per_s=round(args.envs / update_us * 1e6, 1),
                 step_graph_steps_per_s=round(args.envs / step_us * 1e6, 1),
                 overlap=bool(args.overlap), repeats=FLOOR_REPEATS, calls=args.floor_calls)
    if args.overlap:  # what the side stream buys: the same step graph on one stream
        floor["step_graph_one_stream_gpu_us"] = round(gpu_us_per_env_step(False, "steps"), 1)
    return floor


def train(args) -> None:
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    steps_per_call = args.envs * POLICY_FREQUENCY
    iterations = max(1, args.steps // steps_per_call)
    learning_iterations = -(-args.learning_starts // POLICY_FREQUENCY)  # explore_steps calls
    compiling = args.mode in ("compile", "compile+graph")
    warmup = 3 if compiling else 2  # compiled: recompiled once the optimizers have state
    # steady speed: from the first report after both graphs are captured
    report = Report(args, iterations, steps_per_call, SCRIPT, ALGO, log_every=args.log_every // POLICY_FREQUENCY,
                    burn_in=learning_iterations + warmup + 2)
    sac = make_sac(args, device, report.add_episodes)
    backend = dict(backend=args.graph_backend)
    explore_steps = graphed(sac.explore_steps, args.mode, **backend)
    train_steps = graphed(sac.train_steps, args.mode, warmup=warmup, **backend)

    sac.env.reset()
    for iteration in report:  # counts the env steps; reports progress every --log-every batched env steps
        if iteration < learning_iterations:
            explore_steps()
        else:
            train_steps()
    report.finish(dict(explore_steps=explore_steps, train_steps=train_steps), sac.policy.mean_action,
                  measure=lambda: measure_floor(args, device))


def main(argv=None) -> None:
    run_training(parse_flags(argv, __doc__, SCRIPT, DEFAULTS, SMOKE, FLAGS), train)


if __name__ == "__main__":
    main()
