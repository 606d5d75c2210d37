"""benchmarks/results_table.py: the training examples' runs as one table, their targets, their plots."""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(*args, cwd=None):
    """``python benchmarks/results_table.py ARGS`` (from ``cwd``)."""
    return subprocess.run([sys.executable, os.path.join(HERE, "results_table.py"), *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd)


def fake_result(script, envs, mode, **changes):
    result = dict(script=script, algo=script[6:].upper(), mode=mode, envs=envs, env_steps=102_400, seconds=20.5,
                  steps_per_s=12_345.6, final_return=-150.4, eval_return=-140.0, random_return=-1262.8,
                  threshold=-200.0, threshold_episodes=10, threshold_seconds=3.25, threshold_env_steps=51_200,
                  time_limited=False, device="cuda (NVIDIA H100)", torch="2.11.0", graphs={}, settings={})
    result.update(changes)
    return result


FLOOR = dict(update_gpu_us=400.0, step_graph_gpu_us=420.5, floor_steps_per_s=2500.0, step_graph_steps_per_s=2378.1,
             overlap=True, repeats=10, calls=20, step_graph_one_stream_gpu_us=520.0, steady_vs_floor=0.92)


class TestMarkdownTable:
    def test_table(self):
        from results_table import markdown_table

        table = markdown_table([
            fake_result("train_ppo", 1, "graph", steady_steps_per_s=15_000.4),
            fake_result("train_ppo", 1, "eager", steps_per_s=950.0, threshold_seconds=None,
                        threshold_env_steps=None, final_return=-3.0, recent_return=-700.0, time_limited=True),
            fake_result("train_sac", 1, "graph", steps_per_s=2000.0, steady_steps_per_s=2300.0, floor=FLOOR),
            {"script": "train_sac", "envs": 64, "mode": "compile", "error": "failed: exit 124 (timeout after 165 s)"},
        ])
        assert table.splitlines() == [
            "threshold -200; random policy -1 263; device cuda (NVIDIA H100); torch 2.11.0 "
            "(the threshold: the mean return of the latest 10+ finished episodes)",
            "",
            "| script | envs | mode | env steps/s | steady env steps/s | GPU floor env steps/s (steady / floor) "
            "| s to threshold | env steps to threshold | final return (10+ episodes) | note |",
            "|---|---:|---|---:|---:|---:|---:|---:|---:|---|",
            "| train_ppo | 1 | graph | 12 346 | 15 000 | — | 3.2 | 51 200 | -150 |  |",
            "| train_ppo | 1 | eager | 950 | — | — | not reached | — | -700 | stopped at 20 s |",
            "| train_sac | 1 | graph | 2 000 | 2 300 | 2 500 (0.92x) | 3.2 | 51 200 | -150 | update 400 µs GPU; "
            "step graph 420 µs (2 378 steps/s) |",
            "| train_sac | 64 | compile | — | — | — | — | — | — | failed: exit 124 (timeout after 165 s) |",
        ]


class TestGoals:
    """``results_table.py --goals``: the one-env graph runs against their targets."""

    def test_met_and_not_met(self):
        from results_table import goals

        lines = goals([fake_result("train_ppo", 1, "graph", steady_steps_per_s=6_000.0),
                       fake_result("train_ppo", 256, "graph", steady_steps_per_s=1.0),  # many envs: not a goal
                       fake_result("train_sac", 1, "graph", steady_steps_per_s=2_300.0, floor=FLOOR)])
        assert lines[0] == ("PPO, 1 env, graph: steady 6 000 env steps/s (whole run, warmup and capture included: "
                            "12 346) = 3.33x the published script's ~1 800; goal >= 3x (5 400): met")
        assert lines[1].startswith("SAC, 1 env, graph: steady 2 300 env steps/s; floor 2 500 (one update per env "
                                   "step: 400.0 µs of GPU time); steady / floor = 0.92; goal >= 0.9 (within 10%): met.")
        assert lines[1].endswith("420.5 µs per env step (2 378 env steps/s; on one stream 520.0 µs)")
        lines = goals([fake_result("train_ppo", 1, "graph", steady_steps_per_s=5_000.0),
                       fake_result("train_sac", 1, "graph", steady_steps_per_s=2_000.0, floor=FLOOR)])
        assert lines[0].endswith("goal >= 3x (5 400): NOT met") and "steady / floor = 0.80;" in lines[1]
        assert "NOT met" in lines[1]

    def test_missing(self):
        from results_table import goals

        assert goals([fake_result("train_sac", 1, "graph", steady_steps_per_s=2_000.0, floor=None),
                      {"script": "train_ppo", "envs": 1, "mode": "graph", "error": "failed: exit 1"}]) == [
            "PPO, 1 env, graph: not measured (failed: exit 1)",
            "SAC, 1 env, graph: not measured (no floor: measured on CUDA only)"]
        assert goals([]) == ["PPO, 1 env, graph: not measured (no run)", "SAC, 1 env, graph: not measured (no run)"]


class TestLoad:
    def test_sorted_by_script_envs_and_mode(self, tmp_path):
        from results_table import load

        for script, envs, mode in [("train_sac", 1, "graph"), ("train_ppo", 256, "eager"),
                                   ("train_ppo", 1, "compile+graph"), ("train_ppo", 1, "eager")]:
            folder = tmp_path / f"envs{envs}"
            folder.mkdir(exist_ok=True)
            (folder / f"{script}_{mode}_summary.json").write_text(json.dumps(fake_result(script, envs, mode)))
        (tmp_path / "train_ppo_graph.csv").write_text("not a summary")
        results = load(str(tmp_path))
        assert [(r["script"], r["envs"], r["mode"]) for r in results] == [
            ("train_ppo", 1, "eager"), ("train_ppo", 1, "compile+graph"), ("train_ppo", 256, "eager"),
            ("train_sac", 1, "graph")]
        assert results[0]["path"] == str(tmp_path / "envs1" / "train_ppo_eager_summary.json")


class TestPlot:
    def test_a_panel_per_envs(self, tmp_path):
        pytest.importorskip("matplotlib")
        from results_table import load, plot

        for envs in (1, 256):
            folder = tmp_path / f"envs{envs}"
            folder.mkdir()
            for mode in ("eager", "graph"):
                (folder / f"train_ppo_{mode}_summary.json").write_text(json.dumps(fake_result("train_ppo", envs, mode)))
                (folder / f"train_ppo_{mode}.csv").write_text(
                    "wall_seconds,env_steps,mean_return\n1.0,100,-1200\n2.0,200,-300\n")
        (tmp_path / "envs1" / "train_sac_graph_summary.json").write_text(
            json.dumps({"script": "train_sac", "envs": 1, "mode": "graph", "error": "skipped: deadline"}))
        assert plot(load(str(tmp_path)), str(tmp_path)) == [str(tmp_path / "train_ppo.png")]
        png = (tmp_path / "train_ppo.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_results_table_command(tmp_path):
    (tmp_path / "train_ppo_graph_summary.json").write_text(json.dumps(fake_result("train_ppo", 1, "graph")))
    proc = _run(str(tmp_path), "--goals")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "| train_ppo | 1 | graph | 12 346 | — | — | 3.2 | 51 200 | -150 |  |" in out
    assert "- PPO, 1 env, graph: not measured (no steady speed)" in out


def test_results_table_without_arguments(tmp_path):
    """With no folder it reads results/ (the examples' usual --out) and, finding nothing there,
    says how to make runs instead of a usage error."""
    proc = _run(cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("No training runs below results/ yet. Make some first, e.g.\n"
                                  "    python examples/train_ppo.py --mode graph --out results/\n")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "train_ppo_graph_summary.json").write_text(json.dumps(fake_result("train_ppo", 1, "graph")))
    proc = _run(cwd=tmp_path)
    assert "| train_ppo | 1 | graph | 12 346 | — | — | 3.2 | 51 200 | -150 |  |" in proc.stdout
