"""The examples run, print what they claim, and agree with eager execution."""

import os
import re
import subprocess
import sys

import pytest

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
    assert max(diffs(out, "max |graphed - eager|")) < 1e-5
    assert "us/call" in out
    assert "args[0]: expected dtype torch.float32, got torch.float64" in out


def test_rl_policy():
    out = run("rl_policy.py", "--steps", "10")
    assert max(diffs(out, "max |loc graphed - eager|") + diffs(out, "max |loc - eager|")) < 1e-5
    assert "fresh noise at each replay: True" in out
    assert "keyword call returned 4 tensors" in out


@pytest.mark.parametrize("steps", ["12"])
def test_train_step(steps):
    out = run("train_step.py", "--steps", steps)
    assert max(diffs(out, "max |loss graphed - eager|")) < 1e-4
    assert max(diffs(out, "max |critic weight diff|")) < 1e-4
    assert "us/step" in out
