"""The examples run, print what they claim, and agree with eager execution."""

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
