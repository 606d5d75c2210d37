"""The soak script runs (simulated backend without CUDA): it cannot rot between GPU runs."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_soak_smoke(tmp_path):
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "soak.py"), "--out", str(tmp_path),
         "--calls", "300", "--check-every", "100"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((tmp_path / "soak.json").read_text())["results"]
    assert [r["workload"] for r in results] == ["policy", "td_policy", "train_step"]
    assert all(r["replays"] == 300 and r["checks"] == 3 and r["check_failures"] == 0 for r in results)
