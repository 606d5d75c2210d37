"""What the training examples ``train_ppo.py`` and ``train_sac.py`` share: their common flags,
the modes (``compiled``, ``graphed``, ``wrap``), the replay buffer, ``Report``, which counts
env steps and finished episodes' returns, shows progress, notes when the return first reaches
``--threshold`` (``Threshold``), measures the steady env steps/s (after warmup and capture),
stops at ``--max-seconds``, evaluates the final policy and writes the CSV, the plot, the JSON
summary and the summary line, and ``gpu_seconds_per_call`` (CUDA events around graph replays)."""

from __future__ import annotations

import argparse
import collections
import csv
import glob
import json
import math
import os
import time
import warnings

import torch
from tensordict import TensorDict

from examples.common.envs import Pendulum
from graphmodule import CudaGraphModule

__all__ = ["MODES", "Progress", "ReplayBuffer", "Report", "Threshold", "compiled", "gpu_seconds_per_call", "graphed",
           "mean_episode_return", "parse_flags", "random_policy_return", "run_training", "wrap", "write_outputs",
           "write_summary"]

MODES = ("eager", "graph", "compile", "compile+graph")


# -- replay buffer -------------------------------------------------------------------------------

class ReplayBuffer:
    """A circular buffer of transitions on the device, sampled uniformly.

    ``ReplayBuffer(capacity, example)`` allocates room for ``capacity`` transitions shaped like
    the rows of ``example`` (a TensorDict with one batch dimension). The cursor and the size
    are device tensors updated in place, so ``extend`` and ``sample`` are tensor operations
    only: neither waits for the device, and a CUDA graph can step an env, write the
    transitions, sample a batch and update on it in one replay (``examples/train_sac.py``).
    ``sample`` needs at least one transition written (it draws indices modulo the size).
    """

    def __init__(self, capacity: int, example: TensorDict) -> None:
        self.capacity, self.device = capacity, example.device
        self.storage = example[0].expand(capacity).clone().zero_()
        self.keys = list(self.storage.keys(include_nested=True, leaves_only=True))
        self.cursor = torch.zeros((), dtype=torch.int64, device=self.device)
        self.size = torch.zeros((), dtype=torch.int64, device=self.device)

    def extend(self, td: TensorDict) -> None:
        n = td.shape[0]
        index = (torch.arange(n, device=self.device) + self.cursor) % self.capacity
        for key in self.keys:
            self.storage.get(key).index_copy_(0, index, td.get(key))
        # in place, never rebound: a graph that writes the buffer reads these at every replay
        self.cursor.add_(n).remainder_(self.capacity)
        self.size.add_(n).clamp_(max=self.capacity)

    def sample(self, batch_size: int) -> TensorDict:
        # modulo a device-side size: torch.randint's bound would be a host int (bias < 1e-13)
        index = torch.randint(2 ** 62, (batch_size,), device=self.device) % self.size
        return TensorDict({key: self.storage.get(key).index_select(0, index) for key in self.keys},
                          batch_size=[batch_size], device=self.device)


# -- command line -------------------------------------------------------------------------------

def parse_flags(argv, description: str, script: str, defaults: dict, smoke: dict, flags: dict):
    """The flags of both scripts, with the script's own (``flags``: flag -> help of an
    integer flag, or -> ``add_argument``'s keywords) after ``--envs`` and ``--steps``. A flag
    left out takes its value from ``smoke`` with ``--smoke``, else from ``defaults``."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=MODES, default="graph")
    parser.add_argument("--envs", type=int, help=f"parallel environments (default {defaults['envs']})")
    parser.add_argument("--steps", type=int, help=f"env steps in all (default {defaults['steps']})")
    for flag, spec in flags.items():  # help text: an integer flag; a dict: add_argument's keywords
        parser.add_argument(flag, **({"type": int, "help": spec} if isinstance(spec, str) else spec))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threshold", type=float, default=-200.0,
                        help="the return whose first crossing is timed: the mean of the latest "
                             f"{Threshold.EPISODES} or more finished episodes (default -200)")
    parser.add_argument("--max-seconds", type=float, metavar="S",
                        help="stop after S wall-clock seconds (checked at each progress report)")
    parser.add_argument("--out", metavar="DIR", help=f"write DIR/{script}_<mode>.csv, DIR/{script}_<mode>_summary.json "
                                                     f"and DIR/{script}.png")
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
    # graphmodule's no-CUDA warning says what the note above said, and it would come while the
    # progress bar is drawn (the wrappers are made then), breaking its line
    warnings.filterwarnings("ignore", message="CudaGraphModule: CUDA is not available")
    train(args)


def compiled(fn, mode: str):
    """``torch.compile(fn)`` in the compile modes, else ``fn``."""
    return torch.compile(fn) if mode in ("compile", "compile+graph") else fn


def graphed(fn, mode: str, **graph_options):
    """``CudaGraphModule(fn)`` in the graph modes, else ``fn``: the same function either way,
    so a graph mode computes what eager does."""
    return CudaGraphModule(fn, **graph_options) if mode in ("graph", "compile+graph") else fn


def wrap(fn, mode: str, **graph_options):
    """``fn`` compiled, then graphed, as ``mode`` says."""
    return graphed(compiled(fn, mode), mode, **graph_options)


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

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def update(self, elapsed: float, env_steps: int, mean_return: float, new_episodes: bool) -> None:
        """A row for the CSV when episodes ended since the last call (``mean_return`` is
        theirs); the bar or the printed line in any case."""
        if new_episodes:
            self.rows.append((elapsed, env_steps, mean_return))
        if self.bar is not None:
            # the postfix first, without a redraw of its own: update() redraws at most every mininterval
            self.bar.set_postfix_str(f"return {mean_return:.1f}" if math.isfinite(mean_return) else "no episode yet",
                                     refresh=False)
            self.bar.update(env_steps - self.steps)
        elif elapsed - self.last_print >= 5.0:
            self.last_print = elapsed
            shown = f"{mean_return:8.1f}" if math.isfinite(mean_return) else "(no episode yet)"
            print(f"{env_steps:>9} env steps  {env_steps / elapsed:8.0f} steps/s  mean return {shown}", flush=True)
        self.steps = env_steps

    def close(self) -> float:
        if self.bar is not None:
            self.bar.close()
        return self.elapsed()


class Threshold:
    """When the mean return first reaches ``value``: the wall-clock seconds and env steps of
    the first report at which the episodes of the latest reports, at least ``episodes`` of
    them, have a mean return of ``value`` or more.

    Each report brings the sum and the number of the episodes that ended since the previous
    one (:meth:`add`). The window keeps the newest reports that hold ``episodes`` episodes
    (one report can hold more: all of them count), so one lucky episode of one env does not
    count as reaching it, and a report of 256 episodes stands on its own.

    >>> t = Threshold(-200.0, episodes=2)
    >>> t.add(1.0, 200, -150.0, 1)   # one episode: not enough
    >>> t.add(2.0, 400, -300.0, 1)   # mean of the two: -225
    >>> t.add(3.0, 600, -100.0, 1)   # mean of the last two: -200
    >>> t.seconds, t.env_steps
    (3.0, 600)
    """

    EPISODES = 10

    def __init__(self, value: float, episodes: int = EPISODES) -> None:
        self.value, self.episodes = value, episodes
        self.window: collections.deque = collections.deque()  # (sum, count) per report, newest last
        self.seconds: float | None = None
        self.env_steps: int | None = None

    def add(self, seconds: float, env_steps: int, total: float, count: int) -> None:
        """A report: ``count`` episodes ended since the last one, their returns summing to ``total``."""
        if not count:
            return
        self.window.append((total, count))
        while len(self.window) > 1 and sum(c for _, c in self.window) - self.window[0][1] >= self.episodes:
            self.window.popleft()
        n = sum(c for _, c in self.window)
        if self.seconds is None and n >= self.episodes and sum(t for t, _ in self.window) / n >= self.value:
            self.seconds, self.env_steps = seconds, env_steps

    @property
    def mean(self) -> float | None:
        """The mean return of the episodes in the window (the latest ``episodes`` or more)."""
        n = sum(c for _, c in self.window)
        return sum(t for t, _ in self.window) / n if n else None


class Report:
    """What a training script reports, and the only places where it reads the device.

    ``Report(args, iterations, steps_per_iteration, script, algo)`` measures the return of a
    random policy, then starts the clock and the progress bar. Iterating over it gives the
    training loop's iteration numbers; after every ``log_every``-th iteration (default
    ``args.log_every``) and the last, it reads the returns of the episodes that ended since
    (``add_episodes``, summed on the device: one host synchronisation per report, none between
    reports), updates the bar and the threshold, and ends the loop early once
    ``args.max_seconds`` have passed. :meth:`finish` prints the rest once the loop is done.

    Two rates: ``steps_per_s`` over the whole run (warmup, capture and compilation included),
    and ``steady_steps_per_s``, from the first report after ``burn_in`` iterations (once the
    graphs are captured and the functions compiled) to the last one. Both count the env steps
    actually simulated, and both end at a report, where the host has waited for the device.
    """

    def __init__(self, args, iterations: int, steps_per_iteration: int, script: str, algo: str, *,
                 log_every: int | None = None, burn_in: int = 0) -> None:
        self.args, self.script, self.algo = args, script, algo
        self.device = torch.device(args.device)
        self.iterations, self.steps_per_iteration, self.env_steps = iterations, steps_per_iteration, 0
        self.log_every = max(1, args.log_every if log_every is None else log_every)
        self.burn_in = burn_in
        self.random_return = random_policy_return(self.device, args.seed + 1)
        self.ended_sum = torch.zeros((), device=self.device)
        self.ended_count = torch.zeros((), device=self.device)
        self.mean_return = math.nan  # of the latest finished episodes
        self.threshold = Threshold(args.threshold)
        self.time_limited = False  # stopped by --max-seconds
        # seconds and env steps at the first report after burn_in, and at the latest report
        # (plain numbers: graphmodule watches the containers reachable from a graphed function)
        self.steady_seconds0: float | None = None
        self.steady_steps0 = 0
        self.report_seconds, self.report_steps = 0.0, 0
        self.progress = Progress(iterations * steps_per_iteration, f"{algo} {args.mode}")

    def add_episodes(self, done: torch.Tensor, episode_reward: torch.Tensor) -> None:
        """Count the episodes that end where ``done`` is true, of return ``episode_reward``
        (same shape), on the device and in place: this can run inside a CUDA graph."""
        done = done.float()
        self.ended_sum += (episode_reward * done).sum()
        self.ended_count += done.sum()

    def __iter__(self):
        for iteration in range(self.iterations):
            yield iteration
            self.env_steps += self.steps_per_iteration
            if (iteration + 1) % self.log_every == 0 or iteration + 1 == self.iterations:
                count = int(self.ended_count.item())  # the one host synchronisation, once per report
                total = self.ended_sum.item() if count else 0.0
                if count:
                    self.mean_return = total / count
                    self.ended_sum.zero_()
                    self.ended_count.zero_()
                elapsed = self.progress.elapsed()
                self.report_seconds, self.report_steps = elapsed, self.env_steps
                if self.steady_seconds0 is None and iteration + 1 >= self.burn_in:
                    self.steady_seconds0, self.steady_steps0 = elapsed, self.env_steps
                self.progress.update(elapsed, self.env_steps, self.mean_return, bool(count))
                self.threshold.add(elapsed, self.env_steps, total, count)
                if self.args.max_seconds is not None and elapsed >= self.args.max_seconds:
                    self.time_limited = True
                    return

    def steady(self) -> tuple[float | None, float | None]:
        """``(env steps/s, seconds)`` from the first report after ``burn_in`` iterations to the
        last report; ``(None, None)`` without two such reports."""
        if self.steady_seconds0 is None or self.report_seconds <= self.steady_seconds0:
            return None, None
        seconds = self.report_seconds - self.steady_seconds0
        return (self.report_steps - self.steady_steps0) / seconds, seconds

    def finish(self, wrapped: dict, eval_policy, measure=None) -> None:
        """After the loop: close the progress bar; in the graph modes, print the graphmodule
        counters of ``wrapped`` (name -> wrapper); call ``measure()`` if given (after the clock
        stopped: a dict for the summary's ``"floor"``, or None); evaluate ``eval_policy``; with
        ``--out``, write the CSV, the plot and the JSON summary; last, print the summary line."""
        args, env_steps = self.args, self.env_steps
        seconds = self.progress.close()
        steady, steady_seconds = self.steady()
        graphs = {}
        if "graph" in args.mode:
            graphs = {name: dict(warmup=g.stats.warmup_calls, captures=g.stats.captures, replays=g.stats.replays,
                                 eager=g.stats.eager_calls) for name, g in wrapped.items()}
            print("graphmodule: " + "; ".join(
                f"{name}: {s['warmup']} warmup, {s['captures']} capture, {s['replays']} replays, {s['eager']} eager"
                for name, s in graphs.items()))
        if self.time_limited:
            print(f"stopped after --max-seconds {args.max_seconds:g}: {env_steps} of "
                  f"{self.iterations * self.steps_per_iteration} env steps")
        floor = measure() if measure is not None else None
        if floor is not None and steady is not None:
            floor["steady_vs_floor"] = round(steady / floor["floor_steps_per_s"], 3)
        if floor is not None:
            print("floor: " + " ".join(f"{key}={value}" for key, value in floor.items()))
        eval_return = mean_episode_return(eval_policy, self.device, args.seed + 2)
        reached = self.threshold.seconds is not None
        result = dict(
            script=self.script, algo=self.algo, mode=args.mode, envs=args.envs, env_steps=env_steps,
            seconds=round(seconds, 3), steps_per_s=round(env_steps / seconds, 1),
            steady_steps_per_s=None if steady is None else round(steady, 1),
            steady_seconds=None if steady_seconds is None else round(steady_seconds, 3),
            final_return=_finite(self.mean_return), eval_return=_finite(eval_return),
            recent_return=None if self.threshold.mean is None else _finite(self.threshold.mean),
            random_return=_finite(self.random_return), threshold=args.threshold,
            threshold_episodes=self.threshold.episodes,
            threshold_seconds=round(self.threshold.seconds, 3) if reached else None,
            threshold_env_steps=self.threshold.env_steps, time_limited=self.time_limited,
            device=_device_name(self.device), torch=torch.__version__, graphs=graphs, floor=floor,
            settings={key: value for key, value in sorted(vars(args).items()) if key not in ("out", "mode")})
        if args.out:
            write_outputs(args.out, args.mode, self.progress.rows, self.random_return, self.device,
                          script=self.script, algo=self.algo)
            write_summary(args.out, result)
        when = (f"threshold_seconds={self.threshold.seconds:.1f} threshold_env_steps={self.threshold.env_steps}"
                if reached else "threshold_seconds=not_reached threshold_env_steps=not_reached")
        print(f"summary: mode={args.mode} envs={args.envs} env_steps={env_steps} seconds={seconds:.1f} "
              f"steps_per_s={env_steps / seconds:.0f} "
              f"steady_steps_per_s={'none' if steady is None else f'{steady:.0f}'} "
              f"final_mean_return={self.mean_return:.1f} "
              f"eval_return={eval_return:.1f} random_policy_return={self.random_return:.1f} "
              f"threshold={args.threshold:g} {when} "
              f"(random policy: uniform torques, 64 episodes of the same Pendulum; eval: the mean action; "
              f"threshold: first time the latest {self.threshold.episodes}+ finished episodes average it; "
              f"steady: env steps/s after the first {self.burn_in} iterations)")


def gpu_seconds_per_call(fn, calls: int, *, warm: int = 3) -> float:
    """The GPU time of one call of ``fn`` (a graphed function: each call one replay): ``warm``
    calls (graphmodule's warmup and capture), then ``calls`` calls between two CUDA events.
    Measures GPU time where each call queues more GPU work than its host time (replays of a
    graph that repeats its work several times); else the host's time shows. CUDA only."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000 / calls


def _finite(x: float) -> float | None:
    return round(x, 3) if math.isfinite(x) else None  # JSON has no NaN


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device.type} ({torch.cuda.get_device_name(device)})"
    return device.type


def write_summary(out_dir: str, result: dict) -> str:
    """``out_dir/<script>_<mode>_summary.json``: ``result``, what :meth:`Report.finish` measured."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{result['script']}_{result['mode']}_summary.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(f"wrote {path}")
    return path


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
