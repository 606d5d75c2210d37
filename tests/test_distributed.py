"""graphmodule on torch.distributed (``_distributed``): graphs released before their process
group is destroyed, whatever the order of teardown; the rules of capturing a DDP step; a
wrapper on a second GPU; the DDP and FSDP2 examples against eager.

On CPU: a gloo group of one process inside this process (release, rules, simulated graphs),
and one torchrun of two processes (gloo, simulated graphs) over both examples' steps, the CI
smoke. On two GPUs (markers ``cuda`` and ``gpus2``): the examples, every exit order and the
rules under torchrun with NCCL, and a wrapper on cuda:1.
"""

from __future__ import annotations

import copy
import logging
import re
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from examples.common.distributed import mlp, train_step
from graphmodule import CaptureError, CudaGraphModule, GraphStateError, InputMismatchError
from tests.distributed.launch import ROOT, torchrun
from tests.distributed.worker import ORDERS

TWO_GPUS = [pytest.mark.cuda, pytest.mark.gpus2,
            pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")]


@pytest.fixture
def group():
    """A gloo process group of this process alone, destroyed after the test if still alive."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    if dist.is_initialized():
        dist.destroy_process_group()


def double(x):
    return x * 2


def captured(make, fn=double, x=None):
    g = make(fn, warmup=1)
    x = torch.ones(3) if x is None else x
    g(x)
    g(x)
    assert g.state == "captured"
    return g


class TestRelease:
    def test_a_wrapper_captured_under_a_group_is_released_before_the_group_is_destroyed(self, group, make):
        g = captured(make)
        dist.destroy_process_group()
        assert (g.state, g.stats.graphs) == ("warmup", 0)
        assert g(torch.ones(3)).tolist() == [2.0, 2.0, 2.0]  # it warms up again

    def test_the_release_is_logged(self, group, make, caplog):
        g = captured(make)
        with caplog.at_level(logging.INFO, logger="graphmodule"):
            dist.destroy_process_group()
        assert "CudaGraphModule(double): released its CUDA graphs before process group shutdown()" in caplog.messages
        assert g.state == "warmup"

    def test_a_wrapper_captured_before_the_group_existed_keeps_its_graph(self, make):
        g = captured(make)
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        dist.destroy_process_group()
        assert (g.state, g.stats.graphs) == ("captured", 1)

    def test_destroying_a_group_releases_only_the_wrappers_that_captured_while_it_was_alive(self, group, make):
        before = captured(make)
        sub = dist.new_group([0], backend="gloo")
        during = captured(make)
        dist.destroy_process_group(sub)
        assert (before.state, during.state) == ("captured", "warmup")

    def test_a_wrapper_never_called_again_is_released_at_interpreter_exit(self):
        # no destroy_process_group(): the exit handler releases it before the groups go
        program = (
            "import logging, sys, torch, torch.distributed as dist\n"
            "from graphmodule import CudaGraphModule\n"
            "logging.basicConfig(level=logging.INFO, stream=sys.stdout, format='%(message)s')\n"
            "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
            "g = CudaGraphModule(lambda x: x + 1, warmup=1, backend='simulate')\n"
            "g(torch.ones(2)); g(torch.ones(2))\n"
            "print('state', g.state)\n"
        )
        proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.splitlines()[-2:] == ["state captured",
                                                 "CudaGraphModule(<lambda>): released its CUDA graphs at interpreter exit"]


def ddp_step(warmup=11, **ddp_kwargs):
    """A graphed DDP train step and its eager twin (CPU, simulated graphs): ``step(x, y)``."""
    from torch.nn.parallel import DistributedDataParallel

    net = mlp(4, 2, torch.device("cpu"))
    graphed_model, eager_model = DistributedDataParallel(copy.deepcopy(net), **ddp_kwargs), DistributedDataParallel(
        net, **ddp_kwargs)
    graphed = CudaGraphModule(train_step(graphed_model, torch.device("cpu")), warmup=warmup, backend="simulate")
    return graphed, train_step(eager_model, torch.device("cpu"))


class TestRules:
    def test_a_ddp_step_warmed_up_enough_is_captured_and_matches_eager(self, group):
        graphed, eager = ddp_step(static_graph=True)
        for x, y in torch.randn(15, 2, 2, 4):
            assert torch.equal(graphed(x, y), eager(x, y))
        assert (graphed.state, graphed.stats.replays) == ("captured", 4)

    def test_too_few_warmup_calls_for_ddp_raise_before_capturing(self, group):
        graphed, _ = ddp_step(warmup=3, static_graph=True)
        for _ in range(3):
            graphed(*torch.randn(2, 2, 4))
        with pytest.raises(CaptureError) as info:
            graphed(*torch.randn(2, 2, 4))
        assert info.value.cause == "ddp-warmup"
        assert str(info.value) == (
            "CudaGraphModule(step) failed to capture its CUDA graph: RuntimeError: DistributedDataParallel(Sequential) "
            "ran 3 forward pass(es) with gradients before this capture; a capture needs 11 before it (closure "
            "variable 'model' of train_step.<locals>.step).\n"
            "Likely cause (ddp-warmup): DistributedDataParallel waits for the GPU in its first 11 forward passes with "
            "gradients (it times them for its runtime statistics) and rebuilds its gradient buckets in the second. "
            "Warm up longer: CudaGraphModule(step, warmup=11) or more (forward passes run outside the wrapper count "
            "too)."
        )
        with pytest.raises(GraphStateError, match="failed to capture its graph earlier"):
            graphed(*torch.randn(2, 2, 4))

    def test_a_cross_stream_failure_with_ddp_names_the_stream_ddp_was_built_on(self, group):
        # what a DDP built on the default stream makes its backward raise under capture (GPU)
        graphed, _ = ddp_step()
        step, fail = graphed.module, [False]

        def fn(x, y):
            if fail[0]:
                raise RuntimeError("CUDA error: operation would make the legacy stream depend on a capturing blocking "
                                   "stream")
            return step(x, y)

        g = CudaGraphModule(fn, warmup=11, backend="simulate")
        for _ in range(11):
            g(*torch.randn(2, 2, 4))
        fail[0] = True
        with pytest.raises(CaptureError) as info:
            g(*torch.randn(2, 2, 4))
        assert info.value.cause == "ddp-default-stream"
        assert str(info.value).startswith("CudaGraphModule(fn) failed to capture its CUDA graph at test_distributed.py:")
        assert str(info.value).endswith(
            "Likely cause (ddp-default-stream): DistributedDataParallel was built on the default stream. It keeps its "
            "parameters' gradient accumulators, which run on the stream they were created on, and the default "
            "(legacy) stream cannot join a capture. Build it on a side stream: `s = torch.cuda.Stream()`, then `with "
            "torch.cuda.stream(s): model = DistributedDataParallel(...)`, then "
            "`torch.cuda.current_stream().wait_stream(s)`.")
        assert isinstance(info.value.__cause__, RuntimeError) and "legacy stream" in str(info.value.__cause__)

    def test_the_same_failure_without_ddp_keeps_its_generic_cause(self, make):
        def fn(x):
            if fail[0]:
                raise RuntimeError("operation would make the legacy stream depend on a capturing blocking stream")
            return x + 1

        fail = [False]
        g = make(fn, warmup=1)
        g(torch.ones(2))
        fail[0] = True
        with pytest.raises(CaptureError) as info:
            g(torch.ones(2))
        assert info.value.cause == "cross-stream"

    def test_a_refused_ddp_step_runs_eagerly_with_on_capture_failure_eager(self, group):
        graphed, eager = ddp_step(warmup=2, static_graph=True)
        graphed = CudaGraphModule(graphed.module, warmup=2, backend="simulate", on_capture_failure="eager")
        batches = torch.randn(4, 2, 2, 4)
        with pytest.warns(UserWarning, match=r"Likely cause \(ddp-warmup\)"):
            results = [graphed(x, y) for x, y in batches]
        assert graphed.state == "eager"
        assert all(torch.equal(r, eager(x, y)) for r, (x, y) in zip(results, batches))


def results(output: str) -> dict[str, str]:
    return dict(re.findall(r"^RESULT ([\w-]+): (.*)$", output, re.M))


@pytest.mark.xfail(strict=True, reason="backend='simulate' does not see the collectives DDP's reducer launches "
                   "(they do not reach the dispatch mode it records with): its replays reduce no gradient")
def test_the_examples_steps_under_torchrun_match_eager_on_cpu():
    """The CI smoke: two processes on gloo, simulated graphs, both examples' steps. CUDA is
    hidden from the workers: on a machine with GPUs they would take NCCL and a GPU each."""
    ended = torchrun(["examples"], timeout=120, env={"CUDA_VISIBLE_DEVICES": ""})
    assert ended.code == 0, ended.output[-3000:]
    assert ended.output.count("2 process(es) (gloo, cpu), graph backend 'simulate'") == 2, ended.output[-3000:]
    found = results(ended.output)
    assert found["ddp"] == "loss_diff=0.000e+00 param_diff=0.000e+00"
    assert found["fsdp"] == "loss_diff=0.000e+00 param_diff=0.000e+00"
    assert found["destroy"] == "captured=captured after=warmup graphs=0"


@pytest.mark.parametrize("example", ["ddp_train_step.py", "fsdp_train_step.py"])
def test_an_example_run_as_a_file_is_a_group_of_one(example):
    args = ["--steps", "13", "--width", "8", "--depth", "2", "--batch", "2"]
    proc = subprocess.run([sys.executable, f"examples/{example}", *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "1 process(es)" in proc.stdout
    assert "max |loss graphed - eager| = 0.000e+00 over 13 steps on 1 rank(s)" in proc.stdout


# -- two GPUs ---------------------------------------------------------------------------------

@pytest.mark.parametrize("mark", [pytest.param(None, marks=TWO_GPUS)])
def test_the_examples_match_eager_bit_for_bit_on_two_gpus(mark):
    ended = torchrun(["examples", "--steps", "40"], timeout=300)
    assert ended.code == 0, ended.output[-3000:]
    found = results(ended.output)
    assert found["ddp"] == found["fsdp"] == "loss_diff=0.000e+00 param_diff=0.000e+00"
    assert "graph backend 'cuda'" in ended.output
    assert found["destroy"] == "captured=captured after=warmup graphs=0"


EXIT_CODES = {"exception": 1, "finally": 1}


@pytest.mark.parametrize("model, order", [pytest.param("ddp", o, marks=TWO_GPUS) for o in ORDERS]
                         + [pytest.param("fsdp", "alive", marks=TWO_GPUS)])
def test_every_exit_order_ends_within_the_time_limit(model, order):
    # without the release, NCCL waits for ever for the graphs holding its collectives
    ended = torchrun(["exit", order, "--model", model], timeout=120)
    assert ended.code == EXIT_CODES.get(order, 0), ended.output[-3000:]
    assert ended.seconds < 90, ended.output[-3000:]
    assert "captured: state captured" in ended.output
    if order == "alive":
        assert "destroyed; the wrapper is in state warmup with 0 graph(s)" in ended.output
    if order in EXIT_CODES:
        assert "RuntimeError: the program ends by an exception" in ended.output


CAPTURED = "state=captured captures=1 replays={} loss_diff=0.000e+00 param_diff=0.000e+00"
RULES = {  # what 16 steps of each case (tests/distributed/worker.py CASES) end with
    "ok": CAPTURED.format(5),
    "no-static": CAPTURED.format(5),
    "find-unused": CAPTURED.format(5),
    "fsdp-warmup1": CAPTURED.format(15),
    "warmup2": "CaptureError cause=ddp-warmup",
    "warmup10": "CaptureError cause=ddp-warmup",
    "default-stream": "CaptureError cause=ddp-default-stream",
    "adam": CAPTURED.format(5),  # a plain Adam, made capturable before its first step
    "gloo": "CaptureError cause=collective-on-cpu-group",
}


# cases that fail before capturing, or not at all, share one torchrun; those that fail inside a
# capture get a process group of their own
ALONE = ("default-stream",)


@pytest.fixture(scope="module")
def rule_results():
    ended = torchrun(["rule", *(case for case in RULES if case not in ALONE)], timeout=240)
    assert ended.code == 0, ended.output[-3000:]
    return ended


@pytest.mark.parametrize("case", [pytest.param(c, marks=TWO_GPUS) for c in RULES])
def test_a_ddp_step_is_captured_or_refused_with_its_cause(case, request):
    ended = torchrun(["rule", case], timeout=180) if case in ALONE else request.getfixturevalue("rule_results")
    assert ended.code == 0, ended.output[-3000:]
    assert results(ended.output)[case] == RULES[case], ended.output[-3000:]


@pytest.mark.parametrize("mark", [pytest.param(None, marks=TWO_GPUS)])
def test_a_wrapper_on_the_second_gpu_captures_and_replays_there(mark):
    assert torch.cuda.current_device() == 0
    second = torch.device("cuda", 1)
    net = mlp(8, 2, second)
    graphed_model, eager_model = copy.deepcopy(net), net
    graphed = CudaGraphModule(train_step(graphed_model, second), device=second)
    eager = train_step(eager_model, second)
    for x, y in torch.randn(6, 2, 4, 8, device=second):
        assert torch.equal(graphed(x, y), eager(x, y))
    assert (graphed.state, graphed.stats.replays, graphed.device) == ("captured", 4, second)
    assert torch.cuda.current_device() == 0
    pool = tuple(graphed.pool.id)
    segments = [s for s in torch.cuda.memory_snapshot() if tuple(s["segment_pool_id"]) == pool]
    assert segments and {s["device"] for s in segments} == {1}
    with pytest.raises(InputMismatchError, match=re.escape("args[0]: expected device cuda:1, got cuda:0")):
        graphed(*torch.randn(2, 4, 8, device="cuda:0"))
    # built without device=, a wrapper takes the current device, and says so at its capture
    other = CudaGraphModule(lambda x: x * 2)
    x = torch.ones(3, device=second)
    other(x), other(x)
    with pytest.raises(InputMismatchError, match=re.escape("asked to capture on cuda:0")) as info:
        other(x)
    assert "args[0]: expected device cuda:0, got cuda:1" in str(info.value)
