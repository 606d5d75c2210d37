"""SAC on the batched torch Pendulum, eagerly, as CUDA graphs, compiled, or both.

    python examples/train_sac.py --mode graph --out results/
    python examples/train_sac.py --mode eager --envs 64 --steps 640000 --max-seconds 60
    python examples/train_sac.py --smoke --mode graph       # a few seconds on a CPU

``--mode``:

- ``eager``: plain PyTorch.
- ``graph``: ``graphmodule.CudaGraphModule`` around three functions, each one CUDA graph.
  ``train_step``, one call per batched env step: the policy's action (sampling included), the
  env step and auto-reset, the transitions written into the replay buffer at device-side
  indices, the finished episodes counted, a batch sampled, and the critic update on it (twin Q
  losses, ``backward()``, ``Adam.step()``, the target critics' soft update in place with
  ``lerp_``). ``update_actor``, twice every second step on the same batch: the actor loss
  through the critics' detached parameters, then the entropy temperature. ``explore_step``,
  for the first ``--learning-starts`` steps: random actions, env step and buffer write. The
  optimizers are Adam with ``capturable=True`` on CUDA. Outside the graphs: the loop and the
  progress report.
- ``compile``: ``torch.compile`` on the collection (policy, env step, buffer write), the random
  collection and both updates.
- ``compile+graph``: the same compiled functions inside the graphs (compiled during the
  warmup calls).

``eager`` runs the very functions the graph modes wrap. Without CUDA the graph modes still
run: graphmodule warns once and calls the functions eagerly (with its input checks), so they
train exactly like ``eager``; ``--graph-backend simulate`` runs graphmodule's capture and replay
machinery on the CPU instead, with the same result.

A step can be one graph because everything it touches stays on the device and in place:
``examples.envs.Pendulum`` is tensor operations only (its state is updated in place and its
reset states come from torch's default generator, which a graph replays afresh); the replay
buffer (``examples.training.ReplayBuffer``) keeps its cursor and size in device tensors,
writes with ``index_copy_`` and samples with ``torch.randint`` modulo the size; actions are
sampled as ``loc + scale * torch.randn_like(loc)`` then squashed by tanh (fresh noise at every
replay); the episode counters are device tensors added to in place. The host reads the device
only to report progress (every ``--log-every`` steps).

Output: a progress bar (tqdm if installed, else a printed line now and then) with env steps/s
and the mean return of the latest finished episodes. With ``--out DIR``:
``DIR/train_sac_<mode>.csv`` (wall_seconds, env_steps, mean_return),
``DIR/train_sac_<mode>_summary.json`` (what the summary line says, with the device, the torch
version, the graphs' counters and the settings) and ``DIR/train_sac.png`` (mean return against
wall-clock seconds for every ``train_sac_*.csv`` in DIR; needs matplotlib). Last, one summary
line: steps/s, the final return, the return of a uniformly random policy on the same
environment (about -1260), and when the return first reached ``--threshold`` (default -200:
the mean of the latest 10 or more finished episodes), in seconds and env steps.
Wall-clock time counts everything from the first step on: warmup, graph capture and
compilation included. ``--max-seconds S`` ends the run early (at the first report after S).

Observed on CPU (2 cores, shared with other work, torch 2.13 CPU build, ``--mode eager``, default
settings: 4 envs, 40 000 env steps = 10 000 batched steps, the first 250 of them with random
actions, then 9 750 critic updates and 9 750 actor updates on batches of 256, hidden 128, seed
0): 117 s in all, about 340 env steps/s. The mean return of the finished training episodes was
about -1 200 during the random-action phase (random policy: -1 263), dipped to -1 641 at 4 000
steps, then rose to -1 014 at 8 800 steps and -193 at 11 200; the threshold (-200 over the
latest 10+ episodes) was reached at 14 400 steps (33 s). After that the reports (4 episodes
each) ranged from -93 to -262 (the last one); the final policy's mean action scored -134.
GPU numbers: see benchmarks/RESULTS.md (``scripts/gpu_examples.sh`` runs every mode with one env
and with many).
"""
from __future__ import annotations

import copy
import math
import os
import sys

if __package__ in (None, ""):  # run as a file: make ``examples`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.nn.functional as F
from tensordict import TensorDict, from_module
from torch import nn

from examples.envs import Pendulum
from examples.training import ReplayBuffer, Report, compiled, graphed, parse_flags, run_training

SCRIPT, ALGO = "train_sac", "SAC"

# --envs, --steps and the rest; --smoke swaps in tiny sizes (explicit flags still win)
DEFAULTS = dict(envs=4, steps=40_000, batch_size=256, hidden=128, learning_starts=250, log_every=100)
SMOKE = dict(envs=2, steps=2 * 440, batch_size=32, hidden=16, learning_starts=50, log_every=50)
# this script's own flags (integers; --help lists them between --steps and --seed)
FLAGS = {
    "--batch-size": f"sampled transitions per update (default {DEFAULTS['batch_size']})",
    "--hidden": f"hidden units (default {DEFAULTS['hidden']})",
    "--learning-starts":
        f"batched env steps with random actions before the updates (default {DEFAULTS['learning_starts']})",
    "--log-every": "batched env steps between progress reports (each reads the device)",
}
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

def train(args) -> None:
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    # seed=None: the reset states come from torch's default generator (seeded above), the one
    # generator a CUDA graph captures; the step graphs replay the env's resets too
    env = Pendulum(args.envs, device, seed=None)
    capturable = device.type == "cuda"  # Adam steps inside a CUDA graph only with this
    actor = Actor(args.hidden, device)
    # The rollout's copy of the actor: the same storage, detached (no autograd history)
    actor_detach = Actor(args.hidden, device)
    from_module(actor).data.to_module(actor_detach)
    actor_detach.requires_grad_(False)
    qnets = nn.ModuleList([QNet(args.hidden, device), QNet(args.hidden, device)])
    qnets_target = copy.deepcopy(qnets).requires_grad_(False)
    q_params, q_target_params = from_module(qnets).data, from_module(qnets_target).data
    q_optimizer = torch.optim.Adam(qnets.parameters(), lr=Q_LR, capturable=capturable)
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=POLICY_LR, capturable=capturable)
    # the entropy temperature: learned, and read by both updates as a tensor updated in place
    target_entropy = -float(Pendulum.act_dim)
    log_alpha = torch.zeros(1, device=device, requires_grad=True)
    alpha = log_alpha.detach().exp()
    alpha_optimizer = torch.optim.Adam([log_alpha], lr=Q_LR, capturable=capturable)
    n, obs_dim, act_dim = args.envs, Pendulum.obs_dim, Pendulum.act_dim
    rb = ReplayBuffer(BUFFER_SIZE, TensorDict(
        observations=torch.zeros(n, obs_dim), actions=torch.zeros(n, act_dim), rewards=torch.zeros(n, 1),
        next_observations=torch.zeros(n, obs_dim), dones=torch.zeros(n, 1, dtype=torch.bool),
        batch_size=[n], device=device))
    iterations = max(1, args.steps // n)
    report = Report(args, iterations, n, SCRIPT, ALGO)

    def transition(obs, action):
        """Step every env with ``action``; write the transitions into the buffer (at device-side
        indices) and count the finished episodes."""
        td, _ = env.step_and_maybe_reset(TensorDict(observation=obs, action=action, batch_size=[n]))
        rb.extend(TensorDict(
            observations=obs, actions=action, rewards=td["next", "reward"],
            next_observations=td["next", "observation"], dones=td["next", "terminated"], batch_size=[n]))
        report.add_episodes(td["next", "done"], td["next", "episode_reward"])

    def collect_random():  # uniformly random actions, before the updates start
        transition(env.observation(), (2 * torch.rand(n, act_dim, device=device) - 1) * Pendulum.max_torque)

    def collect():
        obs = env.observation()
        transition(obs, actor_detach.explore(obs))

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

    collect_random, collect = compiled(collect_random, args.mode), compiled(collect, args.mode)
    update_critics, update_actor = compiled(update_critics, args.mode), compiled(update_actor, args.mode)

    def explore_step():
        """One batched env step with random actions: one CUDA graph in the graph modes."""
        with torch.no_grad():
            collect_random()

    def train_step():
        """One batched env step under the policy, the buffer write, a sampled batch and the
        critic update on it: one CUDA graph in the graph modes. Every tensor it reads or writes
        between calls (env, buffer and its cursor, networks, optimizer state) is updated in
        place, so each replay continues where the last one stopped. Returns the batch, which
        the actor updates use."""
        with torch.no_grad():
            collect()
            data = rb.sample(args.batch_size)
        update_critics(data)
        return data

    backend = dict(backend=args.graph_backend)
    explore_step = graphed(explore_step, args.mode, **backend)
    train_step = graphed(train_step, args.mode, warmup=5, **backend)
    update_actor = graphed(update_actor, args.mode, warmup=5, **backend)

    env.reset()
    for step in report:  # counts the env steps; reports progress every --log-every steps
        if step < args.learning_starts:
            explore_step()
            continue
        data = train_step()
        if step % POLICY_FREQUENCY == 0:
            for _ in range(POLICY_FREQUENCY):  # catch up on the delayed updates
                update_actor(data)
    report.finish(dict(explore_step=explore_step, train_step=train_step, update_actor=update_actor),
                  actor_detach.mean_action)


def main(argv=None) -> None:
    run_training(parse_flags(argv, __doc__, SCRIPT, DEFAULTS, SMOKE, FLAGS), train)


if __name__ == "__main__":
    main()
