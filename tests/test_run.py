"""_run: a graph's replay laid out once for the common calls. A replayed call of a policy, or of
a TensorDict module, runs the laid-out replay (none of the general one's steps, no dynamo
wrapper around the call) and gives what the plain call gives; other calls keep the general one."""

import os
import sys

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

from graphmodule import CudaGraphModule

GENERAL = {"_replay", "finish", "values", "apply"}  # (Entry, Plan/Lender, Effects: the general replay)


def _run_seen(call):
    """``call()`` and the Python functions it ran, as (file, function)."""
    seen = []

    def profile(frame, event, arg):
        if event == "call":
            seen.append((os.path.basename(frame.f_code.co_filename), frame.f_code.co_name))

    sys.setprofile(profile)
    try:
        out = call()
    finally:
        sys.setprofile(None)
    return out, seen


@pytest.fixture
def policy():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))


@pytest.mark.parametrize("held", [True, False], ids=["held", "dropped"])
def test_a_policy_call_takes_the_laid_out_replay(policy, held, graph_backend):
    device = "cuda" if graph_backend == "cuda" else "cpu"
    policy = policy.to(device)
    g = CudaGraphModule(policy, backend=graph_backend)
    x = torch.randn(1, 8, device=device)
    with torch.no_grad():
        out = None
        for _ in range(5):  # warmup, capture, the twin a held result asks for
            out = g(x)
        if not held:
            out = None
        y = torch.randn(1, 8, device=device)
        result, seen = _run_seen(lambda: g(y))
        torch.testing.assert_close(result, policy(y))
    names = {name for file, name in seen}
    files = {file for file, name in seen}
    assert "run" in names and not names & GENERAL
    assert "eval_frame.py" not in files  # (no torch.compiler.disable wrapper outside compile)
    assert out is None or not out.data_ptr() == result.data_ptr()  # a held result is never overwritten


def test_a_tensordict_module_call_writes_its_results_as_eagerly(policy, graph_backend):
    device = "cuda" if graph_backend == "cuda" else "cpu"
    module = TensorDictModule(policy.to(device), in_keys=["observation"], out_keys=["action"])
    g = CudaGraphModule(module, backend=graph_backend)
    with torch.no_grad():
        td = None
        for _ in range(5):
            td = g(TensorDict(observation=torch.randn(1, 8, device=device), batch_size=[1], device=device))
        call = TensorDict(observation=torch.randn(1, 8, device=device), batch_size=[1], device=device)
        result, seen = _run_seen(lambda: g(call))
        assert result is call and list(call.keys()) == ["observation", "action"]
        torch.testing.assert_close(call["action"], module.module(call["observation"]))
        assert td["action"].data_ptr() != call["action"].data_ptr()  # the one held is not overwritten
    names = {name for file, name in seen}
    assert "run" in names and not names & GENERAL


def test_a_call_with_several_results_takes_the_general_replay(graph_backend):
    device = "cuda" if graph_backend == "cuda" else "cpu"
    g = CudaGraphModule(lambda x: (x + 1, x * 2), backend=graph_backend)
    x = torch.ones(3, device=device)
    for _ in range(4):
        g(x)
    (a, b), seen = _run_seen(lambda: g(x))
    torch.testing.assert_close(a, x + 1)
    torch.testing.assert_close(b, x * 2)
    assert "finish" in {name for file, name in seen}
