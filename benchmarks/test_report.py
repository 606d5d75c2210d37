"""RESULTS.md is what the raw files give, and the entry point writes files the report reads."""

import json
import os
import subprocess
import sys

import pytest
import torch
from report import RESULTS_MD, program_rows, programs_table, render
from side_by_side import per_call

HERE = os.path.dirname(os.path.abspath(__file__))


def test_results_md_is_generated_from_the_raw_files():
    with open(RESULTS_MD) as f:
        assert f.read() == render(charts=False), "run: python benchmarks/report.py"


def test_program_rows_and_their_summary(tmp_path):
    path = tmp_path / "programs.md"
    path.write_text(
        "| program | block (iterations) | blocks td / gm | steps/s td | steps/s gm | gm/td (whole) | gm/td, block | "
        "host td / gm | per call |\n|---|---|---|---|---|---|---|---|---|\n"
        "| td3 | 20 | 50 / 50 | 2,415.8 | 2,444.0 | 1.012x | 1.010x | 82.9 / 75.9 | 99.2 / 74.2 |\n"
        "| td3 | 20 | 50 / 50 | 1,962.0 | 1,991.8 | 1.015x | 1.020x | 103.9 / 95.7 | 127.3 / 94.7 |\n"
        "| td3 | 20 | 50 / 50 | 1,962.0 | 1,991.8 | 0.990x | 1.004x | 100.0 / 99.0 | 127.3 / 94.7 |\n"
        "| sac | 20 | 0 / 0 | — | — | —x | —x | — / — | 144.9 / — |\n")
    runs = program_rows(str(path))
    assert [r["block"] for r in runs["td3"]] == [1.010, 1.020, 1.004]
    assert programs_table(runs).splitlines()[2:] == [
        "| TD3 | 3 | 1.010x (1.004–1.020) | 1.012x (0.990–1.015) | 100.0 / 95.7 |",
        "| SAC | 1 | — | — | — / — |",
    ]


def test_side_by_side_results_from_pytest_benchmark_and_their_report(tmp_path):
    """``side_by_side.per_call`` turns pytest-benchmark's JSON into µs per call with the floor each
    workload is compared with; ``report.render`` makes a measurement folder's table of it."""
    us = {("policy_b1", "floor"): 15.0, ("policy_b1", "graphmodule"): 30.0, ("policy_td_b1", "graphmodule"): 45.0,
          ("many_leaves_td_64", "graphmodule"): 60.0, ("many_leaves_td_64", "floor"): 20.0}
    raw = {"benchmarks": [{"extra_info": {"workload": w, "variant": v, "calls": 200}, "stats": {"median": t * 200e-6}}
                          for (w, v), t in us.items()]}
    (tmp_path / "raw.json").write_text(json.dumps(raw))
    results = per_call(str(tmp_path / "raw.json"))
    assert results["policy_b1"]["us_per_call"]["graphmodule"] == pytest.approx(30.0)
    # a TensorDict workload against its plain twin's floor; the nested-leaves ones against none
    assert results["policy_td_b1"]["floor_us"] == pytest.approx(15.0) and results["many_leaves_td_64"]["floor_us"] is None
    measurement = tmp_path / "results" / "today-gpu"
    measurement.mkdir(parents=True)
    (measurement / "environment.json").write_text(json.dumps(
        {"date": "today", "gpu": "a GPU", "torch": "2.x", "tensordict": "0.x", "python": "3.x"}))
    (measurement / "side_by_side.json").write_text(json.dumps(results))
    text = render(str(tmp_path / "results"), charts=False)
    assert "### a GPU, measured today (torch 2.x, tensordict 0.x, Python 3.x)" in text
    assert "| MLP policy, batch 1 | — | 15.0 | — | — | 30.0 (2.00x) | — | — | — |" in text
    assert "| same, TensorDict in/out | — | — | — | — | 45.0 (3.00x) | — | — | — |" in text
    assert "| TensorDict module, 64 leaves | — | 20.0 | — | — | 60.0 | — | — | — |" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what the entry point says without CUDA")
def test_entry_point_without_cuda_says_what_it_needs(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(HERE, "run.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "No CUDA GPU here: the floor, tensordict's wrapper and torch.compile's CUDA graphs need one." in proc.stdout
    assert json.loads((tmp_path / "environment.json").read_text())["gpu"] == "no CUDA (CPU)"


def test_capture_cost_runs_each_kind_of_capture_and_writes_what_the_report_reads(tmp_path):
    """``capture.py --smoke`` (simulated): every workload makes each kind of capture it times
    (it asserts the counters moved), and the report renders its file."""
    from report import capture_table

    proc = subprocess.run([sys.executable, os.path.join(HERE, "capture.py"), "--smoke", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "capture.json").read_text())
    assert set(result["times"]) == {"policy", "sac", "ppo"}
    assert all(set(t) == {"first", "recapture", "output_set", "signature"} for t in result["times"].values())
    assert {(r["workload"], r["k"], r["shared"]) for r in result["memory"]} == {
        (w, k, s) for w in ("policy", "sac", "ppo") for k in (1, 2) for s in (True, False)}
    rows = [line for line in capture_table(result).splitlines() if line.startswith("| ") and "workload" not in line]
    assert len(rows) == 3 + 3 * 2  # a time row per workload; a memory row per workload and graph count
