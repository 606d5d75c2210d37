"""benchmarks/published_reference.py (the env steps the published CleanRL/LeanRL configurations
need to reach -200 on Pendulum-v1): its ``--smoke`` path on the CPU, the threshold bookkeeping,
and the JSON/markdown it writes."""

import importlib.util
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load():
    name = "published_reference"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "benchmarks", name + ".py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # dataclasses look their module up
        spec.loader.exec_module(mod)
    return sys.modules[name]


@pytest.fixture(scope="module")
def ref():
    pytest.importorskip("gymnasium")
    return _load()


def test_tracker_needs_a_full_window():
    t = _load().Tracker(-200.0, window=3)
    assert not t.add(200, -100.0) and not t.add(400, -150.0)  # a window of 3 is not full yet
    assert not t.add(600, -400.0)  # mean -216.7
    assert t.add(800, -50.0)  # mean of the latest three: -200
    assert t.reached_at == (800, 4) and t.reached_mean == pytest.approx(-200.0)
    assert t.add(1000, -2000.0) and t.reached_at == (800, 4)  # the first crossing is kept


def test_smoke_runs_and_writes(ref, tmp_path):
    out = str(tmp_path / "ref")
    runs = ref.main(["--smoke", "--algos", "sac,td3,ppo", "--seeds", "0", "--out", out, "--quiet"])
    assert [r["algo"] for r in runs] == ["sac", "td3", "ppo"]
    for r in runs:
        # ten 200-step episodes cannot fit in the smoke caps: never reached
        assert not r["reached"] and r["env_steps_run"] == r["cap"] == ref.SMOKE_CAPS[r["algo"]]
        assert r["episodes_run"] == r["cap"] // 200 and all(ret < 0 for _, ret in r["episodes"])
        assert r["est_published_seconds_to_threshold"] is None
    with open(os.path.join(out, "published_reference.json")) as f:
        doc = json.load(f)
    assert len(doc["runs"]) == 3 and doc["published_steps_per_s"] == {"ppo": 1800.0, "sac": 520.0, "td3": 650.0}
    with open(os.path.join(out, "published_reference.md")) as f:
        md = f.read()
    assert "| SAC | 0 | not reached by 300 |" in md and "| PPO | 1 | not reached (median) | > 0.3 | > 0.3 |" in md
    assert "Smoke run" in md

    # a later invocation adds its runs to the folder's; other settings are refused
    ref.main(["--smoke", "--algos", "ppo", "--seeds", "1", "--out", out, "--quiet"])
    with open(os.path.join(out, "published_reference.json")) as f:
        assert sorted((r["algo"], r["seed"]) for r in json.load(f)["runs"]) == [
            ("ppo", 0), ("ppo", 1), ("sac", 0), ("td3", 0)]
    with pytest.raises(SystemExit):
        ref.main(["--smoke", "--algos", "ppo", "--seeds", "1", "--out", out, "--quiet", "--window", "1"])


@pytest.mark.parametrize("algo", ["ppo", "td3"])
def test_reached_counts_env_steps(ref, algo):
    # any return passes: reached at the end of the first episode, 200 env steps
    r = ref.run_one(algo, 0, smoke=True, threshold=-1e9, window=1, quiet=True)
    assert r["reached"] and r["env_steps_to_threshold"] == r["env_steps_run"] == 200
    assert r["episodes_to_threshold"] == 1
    sps = ref.PUBLISHED_STEPS_PER_S[algo]
    assert r["est_published_seconds_to_threshold"] == round(200 / sps, 1)
    # the learning phase's estimate leaves out the random warm-up (SAC/TD3's learning_starts)
    warm = r["hyperparameters"].get("learning_starts", 0)
    assert r["est_published_seconds_learning_phase"] == round((200 - warm) / sps, 1)


def test_median_and_rewrite(ref, tmp_path):
    runs = []
    for seed, steps in enumerate([9400, None, 10600]):
        r = dict(algo="sac", seed=seed, smoke=False, threshold=-200.0, window=10, cap=60000,
                 reached=steps is not None, env_steps_to_threshold=steps, episodes_to_threshold=None,
                 env_steps_run=steps or 60000, wall_s=1.0, published_steps_per_s=520.0,
                 hyperparameters=dict(learning_starts=5000), episodes=[])
        runs.append(ref.derive(r))
    # the unreached seed counts as slower than both reached ones
    assert ref._median(runs, "env_steps_to_threshold") == "10 600"
    assert ref._median(runs, "est_published_seconds_to_threshold") == "20.4"
    assert ref._median(runs, "est_published_seconds_learning_phase") == f"{5600 / 520:.1f}"
    assert ref._median(runs[1:], "env_steps_to_threshold") == "not reached (median)"
    # ... and then bounds the published time from below: its 60 000 steps at 520/s (minus the warm-up)
    assert ref._median(runs[1:], "est_published_seconds_to_threshold") == "> 115.4"
    assert ref._median(runs[1:], "est_published_seconds_learning_phase") == f"> {55000 / 520:.1f}"
    out = str(tmp_path / "r")
    os.makedirs(out)
    with open(os.path.join(out, "published_reference.json"), "w") as f:
        json.dump(dict(runs=runs), f)
    ref.main(["--rewrite", "--out", out, "--quiet"])
    with open(os.path.join(out, "published_reference.md")) as f:
        assert "| SAC | 3 | 10 600 | 20.4 | 10.8 |" in f.read()


def test_ppo_env_reports_raw_returns(ref):
    # the threshold is on RecordEpisodeStatistics' raw return, not the normalized, clipped reward
    import numpy as np

    env = ref.make_ppo_env(0.99, 10.0, 10.0)
    env.reset(seed=0)
    raw = 0.0
    for _ in range(200):
        _, r, term, trunc, info = env.step(np.array([5.0], np.float32))  # clipped to 2 by ClipAction
        raw += r
    assert trunc and not term
    assert info["episode"]["r"] < -500 and abs(raw) < 0.2 * abs(info["episode"]["r"])
