"""RESULTS.md is what the raw files give, and the entry point writes files the report reads."""

import json
import os
import subprocess
import sys

from report import RESULTS_MD, program_rows, programs_table, render

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


def test_entry_point_writes_what_the_report_reads(tmp_path):
    """``run.py --smoke`` (one workload, the CPU's short mode) and ``report.py`` on its folder."""
    measurement = tmp_path / "results" / "today-cpu"
    proc = subprocess.run([sys.executable, os.path.join(HERE, "run.py"), "--smoke", "--only", "side-by-side",
                           "-k", "tiny_fn", "--out", str(measurement)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "| `x*2+1`, 16 floats | " in proc.stdout
    results = json.loads((measurement / "side_by_side.json").read_text())
    assert set(results["tiny_fn"]["us_per_call"]) >= {"eager", "graphmodule", "graphmodule_static"}
    text = render(str(tmp_path / "results"), charts=False)
    assert "### no CUDA (CPU), measured " in text and "| `x*2+1`, 16 floats | " in text
