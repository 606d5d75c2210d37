"""The examples run, print what they claim, and agree with eager execution; the training
examples (``--smoke``) write their CSV, JSON summary and plot; their bookkeeping (threshold,
replay buffer)."""

import json
import os
import re
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(name, *args, stderr=False):
    """``python examples/NAME ARGS``: its output (and its error stream with ``stderr=True``)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", name), *args],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return (proc.stdout, proc.stderr) if stderr else proc.stdout


RUNNABLE = sorted(f for f in os.listdir(os.path.join(ROOT, "examples")) if f.endswith(".py") and f != "__init__.py")
# In one process (torch imported once): each example run as ``python examples/NAME --help`` runs
# it, from a folder that is not the repository, with graphmodule importable and ``examples`` not
_HELP = """
import contextlib, io, json, runpy, sys
results = {}
for path in sys.argv[1:]:
    sys.argv, out = [path, "--help"], io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(path, run_name="__main__")
        code = 0
    except SystemExit as exit:
        code = exit.code or 0
    except Exception as err:
        code = f"{type(err).__name__}: {err}"
    results[path] = [code, out.getvalue()]
print(json.dumps(results))
"""


def _path_without_the_repository(site: str) -> str:
    """``site`` then this environment's PYTHONPATH less the repository: where the packages
    come from a folder on PYTHONPATH (as scripts/wheels.sh installs them), they stay importable."""
    here = os.path.realpath(ROOT)
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and os.path.realpath(p) != here]
    return os.pathsep.join([site, *kept])


@pytest.fixture(scope="module")
def helps(tmp_path_factory):
    folder = tmp_path_factory.mktemp("elsewhere")
    (folder / "site").mkdir()
    (folder / "site" / "graphmodule").symlink_to(os.path.join(ROOT, "graphmodule"))
    paths = [os.path.join(ROOT, "examples", name) for name in RUNNABLE]
    env = dict(os.environ, PYTHONPATH=_path_without_the_repository(str(folder / "site")))
    proc = subprocess.run([sys.executable, "-c", _HELP, *paths], capture_output=True, text=True, timeout=300,
                          cwd=folder, env=env)
    assert proc.returncode == 0, proc.stderr
    return {os.path.basename(path): result for path, result in json.loads(proc.stdout.splitlines()[-1]).items()}


@pytest.mark.parametrize("name", RUNNABLE)
def test_help_works_from_anywhere(name, helps):
    """``python examples/NAME --help`` from another folder, the repository not on the path (as
    after ``pip install graphmodule``): a usage text, exit status 0."""
    code, out = helps[name]
    assert code == 0, code
    assert out.startswith("usage: ") and name in out


def no_speedup_on_cpu(out):
    """Without CUDA nothing is captured: the examples say so instead of printing a speed-up."""
    assert "no CUDA: ran eagerly, no speed-up measured" in out
    assert not re.search(r"\(\d+\.\dx\)", out), out


def diffs(text, label):
    return [float(v) for v in re.findall(re.escape(label) + r" = ([0-9.e+-]+)", text)]


def test_quickstart():
    out = run("quickstart.py", "--calls", "20")
    # two warmup calls and a third that captures: on a GPU the comparison is a replay's
    assert f"state: {'captured' if torch.cuda.is_available() else 'eager'};" in out
    assert max(diffs(out, "max |graphed - eager|")) < 1e-5
    if torch.cuda.is_available():
        assert "us/call" in out
    else:
        no_speedup_on_cpu(out)
    assert "args[0]: expected dtype torch.float32, got torch.float64" in out


def test_rl_policy():
    out = run("rl_policy.py", "--steps", "10")
    assert max(diffs(out, "max |loc graphed - eager|") + diffs(out, "max |loc - eager|")) < 1e-5
    assert "fresh noise at each replay: True" in out
    assert "keyword call returned 4 tensors" in out
    if not torch.cuda.is_available():
        no_speedup_on_cpu(out)


# examples/train_step.py wraps its step with warmup=3: fewer steps than that never
# capture, one more ends on the capture, and more replay the captured step.
@pytest.mark.parametrize("steps", [2, 4, 12])
def test_train_step(steps):
    out = run("train_step.py", "--steps", str(steps))
    assert max(diffs(out, "max |loss graphed - eager|")) < 1e-4
    assert max(diffs(out, "max |critic weight diff|")) < 1e-4
    if torch.cuda.is_available() and steps > 3:
        assert f"{steps} steps: eager " in out and "us/step" in out
    elif torch.cuda.is_available():
        assert f"{steps} steps: all of them warmup calls, nothing captured: no speed-up measured" in out
    else:
        no_speedup_on_cpu(out)
    warmup = min(steps, 3)
    if torch.cuda.is_available():
        captures, replays = int(steps > 3), max(steps - 3, 0)  # the capture call replays once
    else:
        captures, replays = 0, 0  # eager fallback: the calls after warmup run eagerly
    assert f"stats: {warmup} warmup, {captures} capture, {replays} replays" in out


# -- training examples: examples/train_ppo.py and examples/train_sac.py ------------------------

TRAINING = ("train_ppo.py", "train_sac.py")
SUMMARY = re.compile(
    r"^summary: mode=(?P<mode>\S+) envs=(?P<envs>\d+) env_steps=(?P<env_steps>\d+) seconds=(?P<seconds>[0-9.]+) "
    r"steps_per_s=(?P<steps_per_s>\d+) steady_steps_per_s=(?P<steady>\d+|none) final_mean_return=(?P<final>\S+) "
    r"eval_return=(?P<eval>\S+) "
    r"random_policy_return=(?P<random>\S+) threshold=(?P<threshold>\S+) threshold_seconds=(?P<threshold_seconds>\S+) "
    r"threshold_env_steps=(?P<threshold_env_steps>\S+) \(random policy: ", re.M)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """``--smoke`` runs, each made once per module: (stdout, its --out folder)."""
    done = {}

    def get(script, mode, *extra):
        key = (script, mode, *extra)
        if key not in done:
            out_dir = tmp_path_factory.mktemp(script.replace(".py", "") + "_" + mode)
            out, err = run(script, "--smoke", "--mode", mode, "--out", str(out_dir), *extra, stderr=True)
            # nothing but the progress bar on the error stream: a warning would break its line
            assert "Warning" not in err, err
            done[key] = out, out_dir
        return done[key]

    return get


def summary(out):
    found = SUMMARY.findall(out)
    assert len(found) == 1, out
    return SUMMARY.search(out).groupdict()


# PPO: a whole iteration (rollout, GAE, every epoch's minibatch updates) is one graph; SAC:
# POLICY_FREQUENCY random-action steps, and POLICY_FREQUENCY training steps (env step, buffer
# write, sampling, critic and actor updates)
GRAPHED = {"train_ppo.py": ["iteration"], "train_sac.py": ["explore_steps", "train_steps"]}


def summary_json(out_dir, script, mode):
    with open(out_dir / f"{script.replace('.py', '')}_{mode}_summary.json") as f:
        return json.load(f)


def csv_rows(out_dir, script, mode):
    with open(out_dir / f"{script.replace('.py', '')}_{mode}.csv") as f:
        lines = f.read().splitlines()
    assert lines[0] == "wall_seconds,env_steps,mean_return"
    return [[float(v) for v in row.split(",")] for row in lines[1:]]


@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("script", TRAINING)
def test_training_smoke(script, mode, smoke_run):
    out, out_dir = smoke_run(script, mode)
    line = summary(out)
    assert line["mode"] == mode and int(line["env_steps"]) > 0 and int(line["steps_per_s"]) > 0
    for key in ("final", "eval", "random"):  # Pendulum returns: negative, finite
        assert -3300 < float(line[key]) < 0, (key, out)
    assert -1500 < float(line["random"]) < -1000  # a random policy's return, about -1200
    # a smoke run does not learn: the default threshold (-200) is not reached
    assert (line["threshold"], line["threshold_seconds"], line["threshold_env_steps"]) == (
        "-200", "not_reached", "not_reached")
    if mode == "graph" and not torch.cuda.is_available():
        assert "graphmodule runs the functions eagerly" in out
    elif mode == "graph":  # real CUDA graphs: each wrapped function captured once, never run eagerly after
        stats = re.findall(r"(\w+): (\d+) warmup, (\d+) capture, (\d+) replays, (\d+) eager", out)
        assert [name for name, *_ in stats] == GRAPHED[script], out
        assert all((int(c), int(e)) == (1, 0) and int(r) > 10 for _, _, c, r, e in stats), out
    rows = csv_rows(out_dir, script, mode)
    assert len(rows) >= 2 and all(len(row) == 3 for row in rows), rows
    assert [r[0] for r in rows] == sorted(r[0] for r in rows) and rows[-1][1] <= int(line["env_steps"])
    assert rows[-1][2] == pytest.approx(float(line["final"]), abs=0.06)


@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("script", TRAINING)
def test_training_summary_json(script, mode, smoke_run):
    """``DIR/<script>_<mode>_summary.json`` holds what the summary line says, and more."""
    out, out_dir = smoke_run(script, mode)
    line, result = summary(out), summary_json(out_dir, script, mode)
    assert set(result) == {
        "script", "algo", "mode", "envs", "env_steps", "seconds", "steps_per_s", "steady_steps_per_s", "steady_seconds",
        "final_return", "eval_return", "recent_return", "random_return", "threshold", "threshold_episodes",
        "threshold_seconds", "threshold_env_steps", "time_limited", "device", "torch", "graphs", "floor", "settings"}
    assert (result["script"], result["mode"], result["torch"]) == (script.replace(".py", ""), mode, torch.__version__)
    assert result["device"] == ("cpu" if not torch.cuda.is_available() else f"cuda ({torch.cuda.get_device_name()})")
    assert (result["envs"], result["env_steps"]) == (int(line["envs"]), int(line["env_steps"]))
    assert result["steps_per_s"] == pytest.approx(float(line["steps_per_s"]), abs=1)
    # steady: from the report after the burn-in to the last report, within the run
    assert result["steady_steps_per_s"] == pytest.approx(float(line["steady"]), abs=1) and result["steady_steps_per_s"] > 0
    assert 0 < result["steady_seconds"] < result["seconds"]
    floor = result["floor"]  # SAC on CUDA: the GPU time of its update and step graph
    if script == "train_sac.py" and torch.cuda.is_available():
        assert floor["update_gpu_us"] > 0 and floor["step_graph_gpu_us"] > 0, floor
        assert floor["floor_steps_per_s"] == pytest.approx(result["envs"] / floor["update_gpu_us"] * 1e6, rel=1e-3,
                                                           abs=0.06)
        assert floor["steady_vs_floor"] == pytest.approx(result["steady_steps_per_s"] / floor["floor_steps_per_s"],
                                                         abs=2e-3)
    else:
        assert floor is None
    for key, name in (("final_return", "final"), ("eval_return", "eval"), ("random_return", "random")):
        assert result[key] == pytest.approx(float(line[name]), abs=0.06), key
    assert -3300 < result["recent_return"] < 0  # the latest 10+ episodes' mean: all of a smoke run's (4 or 12)
    assert (result["threshold"], result["threshold_episodes"], result["threshold_seconds"],
            result["threshold_env_steps"], result["time_limited"]) == (-200.0, 10, None, None, False)
    assert result["settings"]["smoke"] is True and result["settings"]["envs"] == result["envs"]
    assert (result["graphs"] != {}) == (mode == "graph")


@pytest.mark.parametrize("script", TRAINING)
def test_training_simulated_graphs_match_eager(script, smoke_run):
    """graphmodule's capture and replay machinery run on the CPU (``backend="simulate"``):
    every wrapped function (PPO: the whole rollout, and the update; SAC: a random-action step,
    a policy step with the buffer write and the critic update, and the actor update) is
    captured once and replayed, and the training is eager's."""
    out, out_dir = smoke_run(script, "graph", "--graph-backend", "simulate")
    stats = re.findall(r"(\w+): (\d+) warmup, (\d+) capture, (\d+) replays, (\d+) eager", out)
    assert [name for name, *_ in stats] == GRAPHED[script], out
    for name, warmup, captures, replays, eager in stats:
        assert (int(captures), int(eager)) == (1, 0) and int(replays) > 10, (name, out)
    eager_out, eager_dir = smoke_run(script, "eager")
    graphed, eager = summary(out), summary(eager_out)
    for key in ("env_steps", "random", "threshold", "threshold_seconds", "threshold_env_steps"):
        assert graphed[key] == eager[key], key
    # the same operations on the same values (a static buffer's alignment may pick another
    # CPU matmul kernel: last bits, not a different training)
    for key in ("final", "eval"):
        assert float(graphed[key]) == pytest.approx(float(eager[key]), rel=1e-3, abs=0.2), key
    graphed_rows, eager_rows = csv_rows(out_dir, script, "graph"), csv_rows(eager_dir, script, "eager")
    assert [r[1] for r in graphed_rows] == [r[1] for r in eager_rows]
    assert [r[2] for r in graphed_rows] == pytest.approx([r[2] for r in eager_rows], rel=1e-3, abs=0.2)


def test_training_threshold_reached(smoke_run):
    """PPO's smoke run: 4 envs end an episode every 200 steps; the report at 640 steps per env
    is the first with 10 or more episodes (12), and their mean is above -5000."""
    out, out_dir = smoke_run("train_ppo.py", "eager", "--threshold", "-5000")
    line, result = summary(out), summary_json(out_dir, "train_ppo.py", "eager")
    assert (line["threshold"], line["threshold_env_steps"]) == ("-5000", "2560")
    assert float(line["threshold_seconds"]) <= float(line["seconds"])
    assert (result["threshold"], result["threshold_env_steps"]) == (-5000.0, 2560)
    assert result["threshold_seconds"] == pytest.approx(float(line["threshold_seconds"]), abs=0.06)


@pytest.mark.parametrize(("script", "first_report"), [("train_ppo.py", 2 * 4 * 32), ("train_sac.py", 50 * 2)])
def test_training_max_seconds(script, first_report, smoke_run):
    """``--max-seconds 0`` ends the run at its first progress report (log_every iterations)."""
    out, out_dir = smoke_run(script, "eager", "--max-seconds", "0")
    assert re.search(rf"^stopped after --max-seconds 0: {first_report} of \d+ env steps$", out, re.M), out
    assert int(summary(out)["env_steps"]) == first_report
    result = summary_json(out_dir, script, "eager")
    assert (result["env_steps"], result["time_limited"]) == (first_report, True)


RANDOM_OPS = {"rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "randperm", "normal", "uniform",
              "random", "bernoulli", "multinomial", "exponential", "poisson"}


@pytest.mark.parametrize(("script", "argv"), [("train_ppo", ["--steps", "256"]), ("train_sac", ["--steps", "120"])])
def test_graphed_functions_draw_from_the_default_generator(script, argv, monkeypatch):
    """Every random number the graphed functions draw (PPO: the rollout's noise, the env
    resets, the minibatch shuffles; SAC: random actions, resets, sampled batches, policy
    noise) comes from torch's default generator: the one a CUDA graph registers by itself and
    advances at every replay, so that each replay draws fresh numbers. A ``torch.Generator``
    of their own would be replayed with the capture's numbers (or fail the capture)."""
    import importlib

    from torch.utils._python_dispatch import TorchDispatchMode

    class RandomOps(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = func.overloadpacket.__name__.rstrip("_")
            if name in RANDOM_OPS:
                self.calls.append((name, kwargs.get("generator")))
            return func(*args, **kwargs)

    module = importlib.import_module(f"examples.{script}")
    draws = {}

    def graphed(fn, mode, **options):  # what the graph modes would capture, run eagerly under the mode
        def traced():
            with RandomOps() as ops:
                result = fn()
            draws.setdefault(fn.__name__, []).extend(ops.calls)
            return result
        return traced

    monkeypatch.setattr(module, "graphed", graphed)
    threads = torch.get_num_threads()
    try:
        module.main(["--smoke", "--mode", "eager", *argv])
    finally:
        torch.set_num_threads(threads)  # --smoke sets one thread
    assert sorted(draws) == sorted(GRAPHED[script + ".py"])
    for name, calls in draws.items():
        assert calls, name  # each one draws random numbers...
        assert all(generator is None for _, generator in calls), (name, calls)  # ...from the default generator
    if script == "train_ppo":  # the noise, a reset state per step, a shuffle per epoch
        assert {"randn", "rand"} <= {op for op, _ in draws["iteration"]}


@pytest.mark.cuda
@pytest.mark.parametrize("frames", [1024, 51_200])  # PPO's one env (an in-kernel sort) and 256 envs (CUB's radix sort)
def test_shuffle_in_a_cuda_graph_is_fresh_at_every_replay(frames, cuda):
    """PPO's minibatch shuffle inside the iteration graph: ``argsort`` of ``torch.rand`` on the
    device captures, and each replay draws a new permutation (torch's default generator,
    registered with the graph, advances its offset at each replay)."""
    from graphmodule import CudaGraphModule

    shuffle = CudaGraphModule(lambda: torch.rand(frames, device=cuda).argsort(), warmup=1, outputs="clone")
    orders = [shuffle() for _ in range(5)]  # a warmup call, the capture, three replays
    assert shuffle.stats.captures == 1 and shuffle.stats.replays >= 3
    expected = torch.arange(frames, device=cuda)
    for order in orders:
        assert torch.equal(order.sort().values, expected)  # a permutation
    assert len({tuple(order[:16].tolist()) for order in orders}) == len(orders)  # a new one each time


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_sac_overlap_trains_alike(mode, smoke_run):
    """``--overlap 0`` (one stream) and ``--overlap 1`` (the env step on a side stream beside
    the updates, on CUDA) train alike: the branches share no tensor that the other writes."""
    one_stream, _ = smoke_run("train_sac.py", mode, "--overlap", "0")
    overlapped, _ = smoke_run("train_sac.py", mode)
    a, b = summary(one_stream), summary(overlapped)
    assert a["env_steps"] == b["env_steps"]
    for key in ("final", "eval"):
        assert float(a[key]) == pytest.approx(float(b[key]), rel=1e-3, abs=0.2), key


def test_sac_floor_measurement_on_cpu():
    """The floor's bookkeeping (``train_sac.floor_times``) with a host timer standing in for the
    CUDA events: fresh agents (the trained one untouched), the per-env-step division, the keys."""
    import time
    import warnings

    from examples import train_sac
    from examples.common.training import parse_flags

    args = parse_flags(["--smoke", "--mode", "graph", "--graph-backend", "simulate", "--device", "cpu"], "", "train_sac",
                       train_sac.DEFAULTS, train_sac.SMOKE, train_sac.FLAGS)
    timed = []

    def seconds_per_call(fn, calls):
        fn(), fn(), fn()  # warmup and capture
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        timed.append(fn.stats.replays)
        return (time.perf_counter() - start) / calls

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        floor = train_sac.floor_times(args, torch.device("cpu"), seconds_per_call)
    assert set(floor) == {"update_gpu_us", "step_graph_gpu_us", "floor_steps_per_s", "step_graph_steps_per_s",
                          "overlap", "repeats", "calls", "step_graph_one_stream_gpu_us"}
    # each rounded to 0.1: on a slow CPU the floor is a few env steps/s
    assert floor["floor_steps_per_s"] == pytest.approx(args.envs / floor["update_gpu_us"] * 1e6, rel=1e-3, abs=0.06)
    assert floor["step_graph_steps_per_s"] == pytest.approx(args.envs / floor["step_graph_gpu_us"] * 1e6, rel=1e-3,
                                                            abs=0.06)
    assert (floor["repeats"], floor["calls"], floor["overlap"]) == (train_sac.FLOOR_REPEATS, args.floor_calls, True)
    assert timed == [args.floor_calls + 1] * 3  # three graphs: updates, steps, steps on one stream; all replayed
    assert train_sac.measure_floor(args, torch.device("cpu")) is None  # CUDA only


@pytest.mark.parametrize("script", TRAINING)
def test_training_plot(script, tmp_path):
    """The PNG plots every CSV of the script found in the folder (written in-process)."""
    pytest.importorskip("matplotlib")
    import importlib

    from examples.common.training import write_outputs

    module = importlib.import_module("examples." + script.replace(".py", ""))
    name = script.replace(".py", "")
    (tmp_path / f"{name}_eager.csv").write_text("wall_seconds,env_steps,mean_return\n1.0,100,-1200\n2.0,200,-900\n")
    write_outputs(str(tmp_path), "graph", [(0.5, 100, -1100.0), (1.0, 200, -800.0)], -1200.0,
                  torch.device("cpu"), script=module.SCRIPT, algo=module.ALGO)
    assert (tmp_path / f"{name}_graph.csv").read_text().startswith("wall_seconds,env_steps,mean_return\n")
    png = (tmp_path / f"{name}.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


# -- the training examples' bookkeeping: examples/common/training.py -----------------------------------

class TestThreshold:
    def test_not_reached_before_enough_episodes(self):
        from examples.common.training import Threshold

        t = Threshold(-200.0, episodes=10)
        t.add(1.0, 200, -100.0 * 9, 9)  # nine good episodes: not yet ten
        assert (t.seconds, t.env_steps) == (None, None)
        t.add(2.0, 400, -100.0, 1)
        assert (t.seconds, t.env_steps) == (2.0, 400)

    def test_mean_over_the_window_decides(self):
        from examples.common.training import Threshold

        t = Threshold(-200.0, episodes=2)
        t.add(1.0, 100, -500.0, 1)
        t.add(2.0, 200, -100.0, 1)  # mean of the last two: -300
        assert t.seconds is None
        t.add(3.0, 300, -100.0, 1)  # the first one left the window: -100
        assert (t.seconds, t.env_steps) == (3.0, 300)

    def test_first_crossing_is_kept(self):
        from examples.common.training import Threshold

        t = Threshold(-200.0, episodes=1)
        t.add(1.0, 100, -150.0, 1)
        t.add(2.0, 200, -900.0, 1)
        t.add(3.0, 300, -100.0, 1)
        assert (t.seconds, t.env_steps) == (1.0, 100)

    def test_a_large_report_stands_alone(self):
        """256 episodes in one report: the older reports leave the window."""
        from examples.common.training import Threshold

        t = Threshold(-200.0, episodes=10)
        t.add(1.0, 51_200, -1000.0 * 256, 256)
        t.add(2.0, 102_400, -190.0 * 256, 256)
        assert (t.seconds, t.env_steps) == (2.0, 102_400)

    def test_mean_of_the_window(self):
        from examples.common.training import Threshold

        t = Threshold(-200.0, episodes=2)
        assert t.mean is None
        t.add(1.0, 100, -900.0, 1)
        t.add(2.0, 200, -300.0, 1)
        t.add(3.0, 300, -3.0, 1)  # one lucky episode does not make the final return
        assert t.mean == pytest.approx(-151.5)

    def test_reports_without_episodes_change_nothing(self):
        from examples.common.training import Threshold

        t = Threshold(-200.0, episodes=1)
        t.add(1.0, 100, 0.0, 0)  # no episode ended: a sum of 0 is no return of 0
        assert (t.seconds, list(t.window)) == (None, [])


class TestReplayBuffer:
    def transitions(self, start, n=3):
        from tensordict import TensorDict

        return TensorDict(obs=torch.arange(start, start + n, dtype=torch.float32).unsqueeze(-1),
                          done=torch.zeros(n, 1, dtype=torch.bool), batch_size=[n])

    def test_extend_wraps_around_in_place(self):
        from examples.common.training import ReplayBuffer

        rb = ReplayBuffer(5, self.transitions(0))
        storage, cursor, size = rb.storage.get("obs"), rb.cursor, rb.size
        rb.extend(self.transitions(1))
        rb.extend(self.transitions(4))  # 4, 5 at the end, 6 over the first row
        assert rb.storage.get("obs").squeeze(-1).tolist() == [6, 2, 3, 4, 5]
        assert (rb.cursor.item(), rb.size.item()) == (1, 5)
        # the same tensors, written in place: a CUDA graph that writes the buffer sees them
        assert rb.storage.get("obs") is storage and rb.cursor is cursor and rb.size is size

    def test_sample_draws_written_rows_only(self):
        from examples.common.training import ReplayBuffer

        torch.manual_seed(0)
        rb = ReplayBuffer(100, self.transitions(0))
        rb.extend(self.transitions(1))
        batch = rb.sample(64)
        assert batch.batch_size == torch.Size([64]) and set(batch.keys()) == {"obs", "done"}
        assert set(batch["obs"].squeeze(-1).tolist()) == {1.0, 2.0, 3.0}
        assert batch["done"].dtype == torch.bool


class TestAddEpisodes:
    def test_counts_finished_episodes_in_place(self):
        from examples.common.training import Report

        report = Report.__new__(Report)  # the counters only: no random-policy evaluation
        report.ended_sum, report.ended_count = torch.zeros(()), torch.zeros(())
        ended_sum = report.ended_sum
        done = torch.tensor([[True, False], [False, True]])
        report.add_episodes(done, torch.tensor([[-100.0, -7.0], [-3.0, -300.0]]))
        assert (report.ended_sum.item(), report.ended_count.item()) == (-400.0, 2.0)
        assert report.ended_sum is ended_sum
