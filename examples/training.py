"""What the training examples ``train_ppo.py`` and ``train_sac.py`` share: their common flags,
the modes (``wrap``), and ``Report``, which counts env steps and finished episodes' returns,
shows progress, evaluates the final policy and writes the CSV, the plot and the summary line."""

from __future__ import annotations

import argparse
import csv
import glob
import math
import os
import time
import warnings

import torch
from tensordict import TensorDict

from examples.envs import Pendulum
from graphmodule import CudaGraphModule

__all__ = ["MODES", "Progress", "ReplayBuffer", "Report", "mean_episode_return", "parse_flags", "random_policy_return",
           "run_training", "wrap", "write_outputs"]

MODES = ("eager", "graph", "compile", "compile+graph")


# -- replay buffer -------------------------------------------------------------------------------

class ReplayBuffer:
    """A circular buffer of transitions (a TensorDict) on the device, sampled uniformly.

    ``extend`` writes at device-side indices and ``sample`` draws them with
    ``torch.randint``: the cursor and size are Python ints, so neither waits for the device.
    """

    def __init__(self, capacity: int, device: torch.device) -> None:
        self.capacity, self.device = capacity, torch.device(device)
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
        index = torch.randint(self.size, (batch_size,), device=self.device)
        return self.storage[index]


# -- command line -------------------------------------------------------------------------------

def parse_flags(argv, description: str, script: str, defaults: dict, smoke: dict, flags: dict):
    """The flags of both scripts, with the script's own (``flags``: integer flag -> help)
    after ``--envs`` and ``--steps``. A flag left out takes its value from ``smoke`` with
    ``--smoke``, else from ``defaults``."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=MODES, default="graph")
    parser.add_argument("--envs", type=int, help=f"parallel environments (default {defaults['envs']})")
    parser.add_argument("--steps", type=int, help=f"env steps in all (default {defaults['steps']})")
    for flag, text in flags.items():
        parser.add_argument(flag, type=int, help=text)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", metavar="DIR", help=f"write DIR/{script}_<mode>.csv and DIR/{script}.png")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes and one CPU thread: runs in a few seconds on a CPU "
                                                         "(checks that the script runs, not that it learns)")
    parser.add_argument("--graph-backend", default="auto", choices=("auto", "simulate"),
                        help="graphmodule's backend in the graph modes: 'simulate' runs its capture and "
                             "replay machinery on the CPU (slow; for testing without a GPU)")
    args = parser.parse_args(argv)
    for key, value in (smoke if args.smoke else defaults).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def run_training(args, train) -> None:
    """Set up the process for ``args`` (threads, the note and the warning filter for the graph
    modes without CUDA), then ``train(args)``."""
    if args.smoke:
        torch.set_num_threads(1)  # tiny tensors: threads only add overhead (and thrash on a busy CPU)
    if "graph" in args.mode and args.graph_backend == "auto" and not torch.cuda.is_available():
        print(f"note: --mode {args.mode} without CUDA: graphmodule runs the functions eagerly (same training)")
    # graphmodule warns once per wrapper without CUDA; once is enough here
    warnings.filterwarnings("once", message="CudaGraphModule: CUDA is not available")
    train(args)


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


class Report:
    """What a training script reports, and the only places where it reads the device.

    ``Report(args, iterations, steps_per_iteration, script, algo)`` measures the return of a
    random policy, then starts the clock and the progress bar. Iterating over it gives the
    training loop's iteration numbers; after every ``args.log_every``-th iteration and the
    last, it reads the returns of the episodes that ended since (``add_episodes``, summed on
    the device) and updates the bar. :meth:`finish` prints the rest once the loop is done."""

    def __init__(self, args, iterations: int, steps_per_iteration: int, script: str, algo: str) -> None:
        self.args, self.script, self.algo = args, script, algo
        self.device = torch.device(args.device)
        self.iterations, self.steps_per_iteration, self.env_steps = iterations, steps_per_iteration, 0
        self.random_return = random_policy_return(self.device, args.seed + 1)
        self.ended_sum = torch.zeros((), device=self.device)
        self.ended_count = torch.zeros((), device=self.device)
        self.mean_return = math.nan  # of the latest finished episodes
        self.progress = Progress(iterations * steps_per_iteration, f"{algo} {args.mode}")

    def add_episodes(self, td) -> None:
        """Count the episodes that end at the step just written into ``td`` (on the device)."""
        done = td["next", "done"].squeeze(-1).float()
        self.ended_sum += (td["next", "episode_reward"].squeeze(-1) * done).sum()
        self.ended_count += done.sum()

    def __iter__(self):
        for iteration in range(self.iterations):
            yield iteration
            self.env_steps += self.steps_per_iteration
            if (iteration + 1) % self.args.log_every == 0 or iteration + 1 == self.iterations:
                count = self.ended_count.item()  # the one host synchronisation, once per log
                if count:
                    self.mean_return = self.ended_sum.item() / count
                    self.ended_sum.zero_()
                    self.ended_count.zero_()
                self.progress.update(self.env_steps, self.mean_return, bool(count))

    def finish(self, wrapped: dict, eval_policy) -> None:
        """After the loop: close the progress bar; in the graph modes, print the graphmodule
        counters of ``wrapped`` (name -> wrapper); evaluate ``eval_policy``; with ``--out``,
        write the CSV and the plot; last, print the summary line."""
        args, env_steps = self.args, self.env_steps
        seconds = self.progress.close()
        if "graph" in args.mode:
            print("graphmodule: " + "; ".join(
                f"{name}: {g.stats.warmup_calls} warmup, {g.stats.captures} capture, {g.stats.replays} replays, "
                f"{g.stats.eager_calls} eager" for name, g in wrapped.items()))
        eval_return = mean_episode_return(eval_policy, self.device, args.seed + 2)
        if args.out:
            write_outputs(args.out, args.mode, self.progress.rows, self.random_return, self.device,
                          script=self.script, algo=self.algo)
        print(f"summary: mode={args.mode} env_steps={env_steps} seconds={seconds:.1f} "
              f"steps_per_s={env_steps / seconds:.0f} final_mean_return={self.mean_return:.1f} "
              f"eval_return={eval_return:.1f} random_policy_return={self.random_return:.1f} "
              f"(random policy: uniform torques, 64 episodes of the same Pendulum; eval: the mean action)")


def write_outputs(out_dir: str, mode: str, rows, random_return: float, device: torch.device, *,
                  script: str, algo: str) -> None:
    """``out_dir/<script>_<mode>.csv``, then ``out_dir/<script>.png`` over every such CSV
    (titled with ``algo``, the algorithm's name)."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{script}_{mode}.csv")
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
    for csv_path in sorted(glob.glob(os.path.join(out_dir, f"{script}_*.csv"))):
        with open(csv_path, newline="") as f:
            data = [(float(r["wall_seconds"]), float(r["mean_return"])) for r in csv.DictReader(f)]
        if data:
            label = os.path.basename(csv_path)[len(script) + 1:-len(".csv")]
            ax.plot(*zip(*data), label=label)
    ax.axhline(random_return, color="gray", linestyle="--", label="random policy")
    ax.set(xlabel="wall-clock seconds", ylabel="mean episode return",
           title=f"{script}: {algo} on Pendulum ({device.type})")
    ax.legend()
    fig.tight_layout()
    png = os.path.join(out_dir, f"{script}.png")
    fig.savefig(png, dpi=100)
    plt.close(fig)
    print(f"wrote {png}")
