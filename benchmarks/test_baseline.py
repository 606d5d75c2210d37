"""The baseline columns: graphmodule at another revision, timed beside the working tree's in one run."""

import os
import shutil
import subprocess
import sys

import pytest
from side_by_side import markdown

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(ROOT, "benchmarks")


def _env(baseline):
    # the benchmarks and the repository first, then whatever path the packages were installed on
    path = [HERE, ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, GRAPHMODULE_BASELINE=str(baseline), PYTHONPATH=os.pathsep.join(path))


def _in_git() -> bool:
    return shutil.which("git") is not None and subprocess.run(
        ["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, check=False).returncode == 0


@pytest.mark.skipif(not _in_git(), reason="needs the repository's git history")
def test_a_baseline_is_its_own_package_and_serves_the_default_call(tmp_path):
    made = subprocess.run(["bash", os.path.join(ROOT, "scripts", "baseline.sh"), "HEAD", str(tmp_path)],
                          capture_output=True, text=True, check=False)
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "graphmodule_base" / "__init__.py").exists()
    # a fresh interpreter: workloads reads GRAPHMODULE_BASELINE at import
    code = (
        "import warnings, torch, workloads\n"
        "warnings.simplefilter('ignore')\n"
        "assert workloads.VARIANTS[-2:] == ('baseline', 'baseline_dropped'), workloads.VARIANTS\n"
        "case = workloads.WORKLOADS['tiny_fn'](torch.device('cuda' if torch.cuda.is_available() else 'cpu'))\n"
        "for name in ('baseline', 'graphmodule'):\n"
        "    call = workloads.variant(name, case)\n"
        "    outs = [call() for _ in range(5)]\n"
        "    want = case.fn(*case.args)\n"
        "    assert all(torch.equal(o, want) for o in outs), name\n"
        "g = workloads.variant('baseline', case).__closure__\n"
        "mods = {type(c.cell_contents).__module__ for c in g if hasattr(c.cell_contents, 'stats')}\n"
        "assert mods == {'graphmodule_base._module'}, mods\n"
    )
    env = _env(tmp_path)
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=HERE, check=False)
    assert ran.returncode == 0, ran.stderr[-3000:]


def test_a_missing_baseline_says_how_to_make_one(tmp_path):
    code = "import torch, workloads\nworkloads.variant('baseline', workloads.WORKLOADS['tiny_fn'](torch.device('cpu')))\n"
    env = _env(tmp_path)
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=HERE, check=False)
    assert ran.returncode != 0 and "bash scripts/baseline.sh REV DIR" in ran.stderr


def test_the_table_shows_the_baseline_columns_where_measured():
    row = {"floor": 10.0, "graphmodule": 12.0, "baseline": 11.0, "baseline_dropped": 10.5}
    table = markdown({"tiny_fn": {"us_per_call": row, "floor_us": 10.0}})
    head, _, line = table.splitlines()
    assert head.endswith("| baseline revision, held | baseline, dropped |")
    assert line.endswith("| 11.0 (1.10x) | 10.5 (1.05x) |")
    assert "baseline" not in markdown({"tiny_fn": {"us_per_call": {"floor": 10.0}, "floor_us": 10.0}})
