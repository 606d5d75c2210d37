"""The examples run, print what they claim, and agree with eager execution; the training
examples (``--smoke``) write their CSV, JSON summary and plot; their bookkeeping (threshold,
replay buffer) and the table of runs (``examples/results_table.py``)."""

import json
import os
import re
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(name, *args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", name), *args],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def diffs(text, label):
    return [float(v) for v in re.findall(re.escape(label) + r" = ([0-9.e+-]+)", text)]


def test_quickstart():
    out = run("quickstart.py", "--calls", "20")
    # two warmup calls and a third that captures: on a GPU the comparison is a replay's
    assert f"state: {'captured' if torch.cuda.is_available() else 'eager'};" in out
    assert max(diffs(out, "max |graphed - eager|")) < 1e-5
    assert "us/call" in out
    assert "args[0]: expected dtype torch.float32, got torch.float64" in out


def test_rl_policy():
    out = run("rl_policy.py", "--steps", "10")
    assert max(diffs(out, "max |loc graphed - eager|") + diffs(out, "max |loc - eager|")) < 1e-5
    assert "fresh noise at each replay: True" in out
    assert "keyword call returned 4 tensors" in out


# examples/train_step.py wraps its step with warmup=3: fewer steps than that never
# capture, one more ends on the capture, and more replay the captured step.
@pytest.mark.parametrize("steps", [2, 4, 12])
def test_train_step(steps):
    out = run("train_step.py", "--steps", str(steps))
    assert max(diffs(out, "max |loss graphed - eager|")) < 1e-4
    assert max(diffs(out, "max |critic weight diff|")) < 1e-4
    assert f"{steps} steps: eager " in out and "us/step" in out
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
    r"steps_per_s=(?P<steps_per_s>\d+) final_mean_return=(?P<final>\S+) eval_return=(?P<eval>\S+) "
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
            done[key] = run(script, "--smoke", "--mode", mode, "--out", str(out_dir), *extra), out_dir
        return done[key]

    return get


def summary(out):
    found = SUMMARY.findall(out)
    assert len(found) == 1, out
    return SUMMARY.search(out).groupdict()


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
        "script", "algo", "mode", "envs", "env_steps", "seconds", "steps_per_s", "final_return", "eval_return",
        "random_return", "threshold", "threshold_episodes", "threshold_seconds", "threshold_env_steps",
        "time_limited", "device", "torch", "graphs", "settings"}
    assert (result["script"], result["mode"], result["device"], result["torch"]) == (
        script.replace(".py", ""), mode, "cpu", torch.__version__)
    assert (result["envs"], result["env_steps"]) == (int(line["envs"]), int(line["env_steps"]))
    assert result["steps_per_s"] == pytest.approx(float(line["steps_per_s"]), abs=1)
    for key, name in (("final_return", "final"), ("eval_return", "eval"), ("random_return", "random")):
        assert result[key] == pytest.approx(float(line[name]), abs=0.06), key
    assert (result["threshold"], result["threshold_episodes"], result["threshold_seconds"],
            result["threshold_env_steps"], result["time_limited"]) == (-200.0, 10, None, None, False)
    assert result["settings"]["smoke"] is True and result["settings"]["envs"] == result["envs"]
    assert (result["graphs"] != {}) == (mode == "graph")


GRAPHED = {"train_ppo.py": ["rollout", "update"], "train_sac.py": ["explore_step", "train_step", "update_actor"]}


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


@pytest.mark.parametrize("script", TRAINING)
def test_training_plot(script, tmp_path):
    """The PNG plots every CSV of the script found in the folder (written in-process)."""
    pytest.importorskip("matplotlib")
    import importlib

    from examples.training import write_outputs

    module = importlib.import_module("examples." + script.replace(".py", ""))
    name = script.replace(".py", "")
    (tmp_path / f"{name}_eager.csv").write_text("wall_seconds,env_steps,mean_return\n1.0,100,-1200\n2.0,200,-900\n")
    write_outputs(str(tmp_path), "graph", [(0.5, 100, -1100.0), (1.0, 200, -800.0)], -1200.0,
                  torch.device("cpu"), script=module.SCRIPT, algo=module.ALGO)
    assert (tmp_path / f"{name}_graph.csv").read_text().startswith("wall_seconds,env_steps,mean_return\n")
    png = (tmp_path / f"{name}.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
