"""The child processes of the CUDA tests and of benchmarks/programs.py, on any machine."""

import sys

import pytest
import torch

from . import train_step
from .isolated import how_it_ended, last_lines, run_child, run_programs

TINY = dict(steps=6, batch_size=8, hidden=8, burnin=2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine tensordict's wrapper captures the CPU model")
def test_results_come_back():
    ref, got = run_programs(train_step.run_train_step, TINY, ["eager", "tensordict"], device="cpu")
    assert got["metrics"] == ref["metrics"] and len(ref["metrics"]["loss"]) == TINY["steps"]
    assert ref["built"] == [] and len(got["built"]) == 1
    assert got["built"][0]["graph"] is False  # (tensordict's wrapper runs eagerly without CUDA)


def test_exceptions_are_raised_again_as_their_builtin_class():
    with pytest.raises(TypeError, match=r"(?s)in the child process: builtins.TypeError: .*'bogus'.*Traceback"):
        run_programs(train_step.run_train_step, dict(TINY, bogus=1), ["eager"], device="cpu")


def test_crashes_and_hangs_are_reported():
    code, output = run_child(["-c", "import os, sys; print('last words', file=sys.stderr); os.abort()"], 30)
    assert how_it_ended(code, 30) == "killed by SIGABRT (exit -6)"
    assert last_lines(output).startswith("Fatal Python error: Aborted") and "last words" in output
    code, output = run_child(["-c", "import time; print('started', flush=True); time.sleep(60)"], 0.5)
    assert code is None and how_it_ended(code, 0.5) == "timed out after 0.5 s" and output == "started\n"
    code, _ = run_child(["-c", f"import sys; sys.exit(3 if sys.executable == {sys.executable!r} else 4)"], 30)
    assert how_it_ended(code, 30) == "exited with status 3"
