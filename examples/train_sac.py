"""SAC on the batched torch Pendulum, eagerly, as CUDA graphs, compiled, or both.

    python examples/train_sac.py --mode graph --out results/
    python examples/train_sac.py --mode eager --envs 8 --steps 80000 --seed 1
    python examples/train_sac.py --smoke --mode graph       # a few seconds on a CPU

``--mode``:

- ``eager``: plain PyTorch.
- ``graph``: ``graphmodule.CudaGraphModule`` around the three hot functions: the policy step
  (one call per batched env step), the critic update (twin Q losses, ``backward()``,
  ``Adam.step()``, and the target critics' soft update in place with ``lerp_``) and the
  actor update (actor loss through the critics' detached parameters, then the entropy
  temperature). The optimizers are Adam with ``capturable=True`` on CUDA.
- ``compile``: ``torch.compile`` on the same three functions.
- ``compile+graph``: ``torch.compile`` inside the wrapper (compiled during the warmup calls).

Without CUDA the graph modes still run: graphmodule warns once and calls the functions
eagerly (with its input checks), so they train exactly like ``eager``.

Everything stays on the device: the environment is ``examples.envs.Pendulum``, the replay
buffer is a TensorDict on the device written and sampled at device-side indices, actions are
sampled as ``loc + scale * torch.randn_like(loc)`` then squashed by tanh (capturable: fresh
noise at every replay). Each batched env step (``--envs`` transitions) is followed by one
critic update on a sampled batch, and every second step by two actor updates (LeanRL's
delayed policy update). The host reads the device only to report progress.

Output: a progress bar (tqdm if installed, else a printed line now and then) with env steps/s
and the mean return of the latest finished episodes; with ``--out DIR``,
``DIR/train_sac_<mode>.csv`` (wall_seconds, env_steps, mean_return) and ``DIR/train_sac.png``
(mean return against wall-clock seconds for every ``train_sac_*.csv`` in DIR; needs
matplotlib). Last, one summary line, with the return of a uniformly random policy on the
same environment for comparison (about -1200 on Pendulum). Wall-clock time counts
everything from the first step on: warmup, graph capture and compilation included.

Observed on CPU (2 cores, torch 2.13 CPU build, ``--mode eager``, default settings: 4 envs,
40 000 env steps = 10 000 batched steps, the first 250 of them with random actions, then
9 750 critic updates and 9 750 actor updates on batches of 256, hidden 128, seed 0): 81 s in all, about
500 env steps/s. The mean return of the finished training episodes was -1 193 during the
random-action phase (random policy: -1 263), dipped to -1 609 at 4 800 steps, then rose to
-901 at 8 800 steps, -232 at 12 800 (23 s) and -123 at 16 800, stayed between -100 and -240
after that, and ended at -144; the final policy's mean action scored -134. ``--mode graph``
without CUDA trains identically (eager fallback). GPU numbers are still to be measured.
"""

from __future__ import annotations

import argparse
import copy
import csv
import glob
import math
import os
import sys
import time
import warnings

if __package__ in (None, ""):  # run as a file: make ``examples.envs`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.nn.functional as F
from tensordict import TensorDict, from_module
from torch import nn

from examples.envs import Pendulum
from graphmodule import CudaGraphModule

MODES = ("eager", "graph", "compile", "compile+graph")
SCRIPT, ALGO = "train_sac", "SAC"

# --envs, --steps and the rest; --smoke swaps in tiny sizes (explicit flags still win)
DEFAULTS = dict(envs=4, steps=40_000, batch_size=256, hidden=128, learning_starts=250, log_every=100)
SMOKE = dict(envs=2, steps=2 * 440, batch_size=32, hidden=16, learning_starts=50, log_every=50)
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


class ReplayBuffer:
    """A circular buffer of transitions (a TensorDict) on the device, sampled uniformly.

    The cursor and size are Python ints and the indices are made on the device, so neither
    ``extend`` nor ``sample`` waits for the device."""

    def __init__(self, capacity: int, device: torch.device) -> None:
        self.capacity, self.device = capacity, device
        self.storage: TensorDict | None = None
        self.cursor = self.size = 0

    def extend(self, td: TensorDict) -> None:
        n = td.shape[0]
        if self.storage is None:
            self.storage = td[0].expand(self.capacity).clone().zero_()
        index = (torch.arange(n, device=self.device) + self.cursor) % self.capacity
        self.storage[index] = td
        self.cursor = (self.cursor + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int) -> TensorDict:
        return self.storage[torch.randint(self.size, (batch_size,), device=self.device)]


def wrap(fn, mode: str, **graph_options):
    """The one place where the modes differ."""
    if mode in ("compile", "compile+graph"):
        fn = torch.compile(fn)
    if mode in ("graph", "compile+graph"):
        fn = CudaGraphModule(fn, **graph_options)
    return fn


# -- evaluation and reporting ---------------------------------------------------------------------

def mean_episode_return(policy, device, seed: int, num_envs: int = 64) -> float:
    """The mean return of one episode of ``num_envs`` fresh Pendulums under ``policy(obs)``."""
    env = Pendulum(num_envs, device, seed=seed)
    td = env.reset()
    with torch.no_grad():
        for _ in range(env.max_steps):
            td["action"] = policy(td["observation"])
            td = env.step(td)
            td["observation"] = td["next", "observation"]
    return td["next", "episode_reward"].mean().item()


def random_policy_return(device, seed: int) -> float:
    gen = torch.Generator(device=device).manual_seed(seed)
    return mean_episode_return(
        lambda obs: (2 * torch.rand(obs.shape[0], Pendulum.act_dim, device=device, generator=gen) - 1)
        * Pendulum.max_torque, device, seed)


class Progress:
    """tqdm if it is installed, else a printed line every few seconds; rows for the CSV."""

    def __init__(self, total: int, desc: str) -> None:
        self.rows, self.start, self.last_print, self.steps = [], time.perf_counter(), 0.0, 0
        try:
            from tqdm import tqdm
        except ImportError:
            self.bar = None
            print(f"{desc}: {total} env steps (install tqdm for a progress bar)", flush=True)
        else:
            self.bar = tqdm(total=total, desc=desc, unit="step", unit_scale=True, dynamic_ncols=True)

    def update(self, env_steps: int, mean_return: float, new_episodes: bool) -> None:
        """A row for the CSV when episodes ended since the last call (``mean_return`` is
        theirs); the bar or the printed line in any case."""
        elapsed = time.perf_counter() - self.start
        if new_episodes:
            self.rows.append((elapsed, env_steps, mean_return))
        if self.bar is not None:
            self.bar.update(env_steps - self.steps)
            self.bar.set_postfix_str(f"return {mean_return:.1f}" if math.isfinite(mean_return) else "no episode yet")
        elif elapsed - self.last_print >= 5.0:
            self.last_print = elapsed
            shown = f"{mean_return:8.1f}" if math.isfinite(mean_return) else "(no episode yet)"
            print(f"{env_steps:>9} env steps  {env_steps / elapsed:8.0f} steps/s  mean return {shown}", flush=True)
        self.steps = env_steps

    def close(self) -> float:
        if self.bar is not None:
            self.bar.close()
        return time.perf_counter() - self.start


def write_outputs(out_dir: str, mode: str, rows, random_return: float, device: torch.device) -> None:
    """``out_dir/<script>_<mode>.csv``, then ``out_dir/<script>.png`` over every such CSV."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{SCRIPT}_{mode}.csv")
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["wall_seconds", "env_steps", "mean_return"])
        writer.writerows((f"{s:.3f}", n, f"{r:.3f}") for s, n, r in rows)
    print(f"wrote {path}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for csv_path in sorted(glob.glob(os.path.join(out_dir, f"{SCRIPT}_*.csv"))):
        with open(csv_path, newline="") as f:
            data = [(float(r["wall_seconds"]), float(r["mean_return"])) for r in csv.DictReader(f)]
        if data:
            label = os.path.basename(csv_path)[len(SCRIPT) + 1:-len(".csv")]
            ax.plot(*zip(*data), label=label)
    ax.axhline(random_return, color="gray", linestyle="--", label="random policy")
    ax.set(xlabel="wall-clock seconds", ylabel="mean episode return",
           title=f"{SCRIPT}: {ALGO} on Pendulum ({device.type})")
    ax.legend()
    fig.tight_layout()
    png = os.path.join(out_dir, f"{SCRIPT}.png")
    fig.savefig(png, dpi=100)
    plt.close(fig)
    print(f"wrote {png}")


# -- training ---------------------------------------------------------------------------------

def train(args) -> None:
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    env = Pendulum(args.envs, device, seed=args.seed)
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
    rb = ReplayBuffer(BUFFER_SIZE, device)

    def policy(obs):
        return actor_detach.explore(obs)

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

    backend = dict(backend=args.graph_backend)
    policy = wrap(policy, args.mode, **backend)
    update_critics = wrap(update_critics, args.mode, warmup=5, **backend)
    update_actor = wrap(update_actor, args.mode, warmup=5, **backend)

    random_return = random_policy_return(device, args.seed + 1)
    iterations = max(1, args.steps // args.envs)
    progress = Progress(iterations * args.envs, f"SAC {args.mode}")
    td = env.reset()
    mean_return, env_steps = math.nan, 0
    ended_sum = torch.zeros((), device=device)
    ended_count = torch.zeros((), device=device)
    for step in range(iterations):
        with torch.no_grad():
            if step < args.learning_starts:  # uniformly random actions first
                td["action"] = (2 * torch.rand(args.envs, Pendulum.act_dim, device=device) - 1) * Pendulum.max_torque
            else:
                td["action"] = policy(td["observation"])
            td, next_td = env.step_and_maybe_reset(td)
            rb.extend(TensorDict(
                observations=td["observation"], actions=td["action"], rewards=td["next", "reward"],
                next_observations=td["next", "observation"], dones=td["next", "terminated"],
                batch_size=[args.envs]))
            done = td["next", "done"].squeeze(-1).float()
            ended_sum += (td["next", "episode_reward"].squeeze(-1) * done).sum()
            ended_count += done.sum()
            td = next_td
        if step >= args.learning_starts:
            data = rb.sample(args.batch_size)
            update_critics(data)
            if step % POLICY_FREQUENCY == 0:
                for _ in range(POLICY_FREQUENCY):  # catch up on the delayed updates
                    update_actor(data)
        env_steps += args.envs
        if (step + 1) % args.log_every == 0 or step + 1 == iterations:
            count = ended_count.item()  # the one host synchronisation, once per log
            if count:
                mean_return = ended_sum.item() / count
                ended_sum.zero_()
                ended_count.zero_()
            progress.update(env_steps, mean_return, bool(count))
    seconds = progress.close()

    if "graph" in args.mode:
        print("graphmodule: " + "; ".join(
            f"{name}: {g.stats.warmup_calls} warmup, {g.stats.captures} capture, {g.stats.replays} replays, "
            f"{g.stats.eager_calls} eager"
            for name, g in (("policy", policy), ("update_critics", update_critics), ("update_actor", update_actor))))
    eval_return = mean_episode_return(actor_detach.mean_action, device, args.seed + 2)
    if args.out:
        write_outputs(args.out, args.mode, progress.rows, random_return, device)
    print(f"summary: mode={args.mode} env_steps={env_steps} seconds={seconds:.1f} "
          f"steps_per_s={env_steps / seconds:.0f} final_mean_return={mean_return:.1f} "
          f"eval_return={eval_return:.1f} random_policy_return={random_return:.1f} "
          f"(random policy: uniform torques, 64 episodes of the same Pendulum; eval: the mean action)")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=MODES, default="graph")
    parser.add_argument("--envs", type=int, help=f"parallel environments (default {DEFAULTS['envs']})")
    parser.add_argument("--steps", type=int, help=f"env steps in all (default {DEFAULTS['steps']})")
    parser.add_argument("--batch-size", type=int, help=f"sampled transitions per update (default {DEFAULTS['batch_size']})")
    parser.add_argument("--hidden", type=int, help=f"hidden units (default {DEFAULTS['hidden']})")
    parser.add_argument("--learning-starts", type=int,
                        help=f"batched env steps with random actions before the updates (default {DEFAULTS['learning_starts']})")
    parser.add_argument("--log-every", type=int, help="batched env steps between progress reports (each reads the device)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", metavar="DIR", help="write DIR/train_sac_<mode>.csv and DIR/train_sac.png")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes and one CPU thread: runs in a few seconds on a CPU "
                                                         "(checks that the script runs, not that it learns)")
    parser.add_argument("--graph-backend", default="auto", choices=("auto", "simulate"),
                        help="graphmodule's backend in the graph modes: 'simulate' runs its capture and "
                             "replay machinery on the CPU (slow; for testing without a GPU)")
    args = parser.parse_args(argv)
    for key, value in (SMOKE if args.smoke else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.smoke:
        torch.set_num_threads(1)  # tiny tensors: threads only add overhead (and thrash on a busy CPU)
    if "graph" in args.mode and args.graph_backend == "auto" and not torch.cuda.is_available():
        print(f"note: --mode {args.mode} without CUDA: graphmodule runs the functions eagerly (same training)")
    # graphmodule warns once per wrapper without CUDA; once is enough here
    warnings.filterwarnings("once", message="CudaGraphModule: CUDA is not available")
    train(args)


if __name__ == "__main__":
    main()
