"""Eager-exact semantics on a real GPU: what simulated replays cannot prove.

A CUDA capture records without running, and a replay runs no Python: these tests
check that aliasing, views, writes (also through ``.data``), container effects,
staleness, modes and Python-state refusal hold with real graphs.
"""

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

from graphmodule import (
    CudaGraphModule,
    InputMismatchError,
    StaleGraphError,
    UnsupportedError,
)

pytestmark = pytest.mark.cuda


def _calls(g, make_args, n=5):
    return [g(*make_args(i)) for i in range(n)]


def test_same_tensor_twice_with_a_write_matches_eager(cuda):
    def f(a, b):
        a.add_(1)
        return b * 2

    g = CudaGraphModule(f, warmup=1)
    for i in range(5):
        x = torch.full((4,), float(i), device=cuda)
        ref = x.clone()
        out = g(x, x)
        want = f(ref, ref)
        torch.testing.assert_close(out, want)
        torch.testing.assert_close(x, ref)


def test_view_inputs_written_in_place_match_eager(cuda):
    def f(a, b):
        a.mul_(2)
        return b + 0

    g = CudaGraphModule(f, warmup=1)
    for i in range(5):
        x = torch.arange(6.0, device=cuda) + i
        ref = x.clone()
        torch.testing.assert_close(g(x, x[2:]), f(ref, ref[2:]))
        torch.testing.assert_close(x, ref)


def test_aliasing_not_seen_at_capture_is_refused(cuda):
    def f(a, b):
        a.add_(1)
        return b * 2

    g = CudaGraphModule(f, warmup=1)
    for _ in range(3):
        g(torch.ones(2, device=cuda), torch.ones(2, device=cuda))
    x = torch.ones(2, device=cuda)
    with pytest.raises(InputMismatchError, match=r"args\[1\]: expected its own memory"):
        g(x, x)
    torch.testing.assert_close(x, torch.ones(2, device=cuda))  # refused before any write


def test_returned_view_of_an_input_is_a_view_of_the_callers_tensor(cuda):
    g = CudaGraphModule(lambda x: x[1:], warmup=1)
    for _ in range(3):
        x = torch.zeros(3, device=cuda)
        v = g(x)
        v.add_(5)
        torch.testing.assert_close(x, torch.tensor([0.0, 5.0, 5.0], device=cuda))


def test_outputs_sharing_memory_share_it_in_the_copy(cuda):
    def f(x):
        y = x * 2
        return y, y, y[0]

    g = CudaGraphModule(f, warmup=1)
    for i in range(4):
        a, b, a0 = g(torch.full((3,), float(i), device=cuda))
    assert a is b
    a0.add_(1)
    assert a[0].item() == 2.0 * 3 + 1


def test_writes_through_data_reach_the_caller(cuda):
    def f(x):
        x.data.add_(1)  # no version counter moves
        return x * 1

    g = CudaGraphModule(f, warmup=1)
    for i in range(4):
        x = torch.full((2,), float(i), device=cuda)
        out = g(x)
        torch.testing.assert_close(x, torch.full((2,), i + 1.0, device=cuda))
        torch.testing.assert_close(out, x)


def test_container_effects_reach_the_callers_containers(cuda):
    def f(d, lst):
        d["y"] = d["x"] * 2
        d.pop("tmp")
        lst.append(d["x"] + 1)
        return d

    g = CudaGraphModule(f, warmup=1)
    for i in range(4):
        d, lst = {"x": torch.full((2,), float(i), device=cuda), "tmp": 0}, []
        assert g(d, lst) is d
        assert list(d) == ["x", "y"] and len(lst) == 1
        torch.testing.assert_close(d["y"], torch.full((2,), 2.0 * i, device=cuda))
        torch.testing.assert_close(lst[0], torch.full((2,), i + 1.0, device=cuda))


def test_distribution_outputs_are_fresh_each_call(cuda):
    g = CudaGraphModule(lambda loc: torch.distributions.Normal(loc, torch.ones_like(loc), validate_args=False), warmup=1)
    dists = _calls(g, lambda i: (torch.full((2,), float(i), device=cuda),))
    kl = torch.distributions.kl_divergence(dists[3], dists[4])
    assert kl.sum().item() > 0
    torch.testing.assert_close(dists[3].loc, torch.full((2,), 3.0, device=cuda))


def test_capture_under_inference_mode(cuda):
    policy = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).to(cuda)
    g = CudaGraphModule(policy)
    with torch.inference_mode():
        for _ in range(5):
            x = torch.randn(3, 4, device=cuda)
            torch.testing.assert_close(g(x), policy(x))
    assert g.stats.captures == 1


def test_replaced_parameter_is_detected_before_any_replay(cuda):
    lin = nn.Linear(3, 3).to(cuda)
    g = CudaGraphModule(lin)
    x = torch.randn(2, 3, device=cuda)
    with torch.no_grad():
        for _ in range(4):
            g(x)
        lin.weight = nn.Parameter(torch.zeros(3, 3, device=cuda))
        with pytest.raises(StaleGraphError, match=r"module.weight: another tensor"):
            g(x)
        lin.weight.data = torch.ones(3, 3, device=cuda)  # .data= moves the memory too
        with pytest.raises(StaleGraphError):
            g(x)


def test_recapture_policy_follows_replaced_parameters(cuda):
    lin = nn.Linear(3, 3).to(cuda)
    g = CudaGraphModule(lin, on_stale="recapture")
    x = torch.randn(2, 3, device=cuda)
    with torch.no_grad():
        for _ in range(4):
            g(x)
        lin.load_state_dict({"weight": torch.eye(3, device=cuda), "bias": torch.zeros(3, device=cuda)}, assign=True)
        outs = [g(x) for _ in range(4)]
    torch.testing.assert_close(outs[-1], x)
    assert g.stats.recaptures == 1 and g.stats.captures == 2


def test_scheduler_float_lr_is_detected(cuda):
    lin = nn.Linear(3, 1).to(cuda)
    opt = torch.optim.Adam(lin.parameters(), lr=1e-2, capturable=True)
    x = torch.randn(8, 3, device=cuda)

    def step():
        opt.zero_grad(set_to_none=False)
        lin(x).pow(2).mean().backward()
        opt.step()

    g = CudaGraphModule(step)
    for _ in range(4):
        g()
    opt.param_groups[0]["lr"] = 5e-3
    with pytest.raises(StaleGraphError, match=r"\['lr'\]: 0.01 at capture, 0.005 now"):
        g()


def test_python_state_changed_by_the_function_is_refused(cuda):
    counter = {"n": 0}

    def f(x):
        counter["n"] += 1
        return x + 1

    g = CudaGraphModule(f, warmup=1)
    g(torch.zeros(1, device=cuda))
    with pytest.raises(UnsupportedError, match="changes Python state"):
        g(torch.zeros(1, device=cuda))
    torch.randn(3, device=cuda)  # CUDA still works


def test_users_own_error_at_capture_leaves_cuda_working(cuda):
    bad = {"batch": False}

    def f(x):
        if bad["batch"]:
            raise ValueError("bad batch")
        return x * 2

    g = CudaGraphModule(f, warmup=1)
    g(torch.ones(1, device=cuda))
    bad["batch"] = True
    with pytest.raises(ValueError, match="bad batch"):
        g(torch.ones(1, device=cuda))
    assert g.state == "warmup"
    bad["batch"] = False
    torch.randn(4, device=cuda)
    torch.testing.assert_close(g(torch.ones(1, device=cuda)), torch.full((1,), 2.0, device=cuda))
    assert g.state == "captured"


def test_tensordict_out_with_scalar_outputs(cuda):
    # the PPO-style update: a [16]-batch minibatch, scalar losses into a fresh TensorDict()
    loss = TensorDictModule(lambda x: (x.mean(), x.std()), in_keys=["x"], out_keys=["m", "s"])
    g = CudaGraphModule(loss)
    for _ in range(5):
        mb = TensorDict(x=torch.randn(16, device=cuda), batch_size=[16])
        out = TensorDict()
        assert g(mb, tensordict_out=out) is out
        assert set(out.keys()) == {"m", "s"} and "x" not in out.keys()
        torch.testing.assert_close(out["m"], mb["x"].mean())


def test_train_step_without_arguments(cuda):
    torch.manual_seed(0)
    net = nn.Linear(4, 1).to(cuda)
    ref = nn.Linear(4, 1).to(cuda)
    ref.load_state_dict(net.state_dict())
    x = torch.randn(32, 4, device=cuda)

    def make_step(model):
        opt = torch.optim.Adam(model.parameters(), lr=1e-2, capturable=True)

        def step():
            opt.zero_grad(set_to_none=False)
            model(x).pow(2).mean().backward()
            opt.step()

        return step

    g, eager = CudaGraphModule(make_step(net)), make_step(ref)
    for _ in range(10):
        g()
        eager()
    torch.testing.assert_close(net.weight, ref.weight, rtol=1e-4, atol=1e-5)


def test_wrapper_called_inside_another_capture_runs_inline(cuda):
    policy = nn.Linear(3, 3).to(cuda)
    inner = CudaGraphModule(policy)

    def rollout(x):
        for _ in range(3):
            x = inner(x).tanh()
        return x

    outer = CudaGraphModule(rollout)
    with torch.no_grad():
        for _ in range(5):
            x = torch.randn(2, 3, device=cuda)
            want = x
            for _ in range(3):
                want = policy(want).tanh()
            torch.testing.assert_close(outer(x), want)
    assert outer.stats.captures == 1 and inner.stats.inline_calls >= 3


def test_graphs_per_shape_share_one_pool(cuda):
    policy = nn.Linear(3, 2).to(cuda)
    g = CudaGraphModule(policy, warmup=1, max_graphs=2, on_graph_limit="evict")
    with torch.no_grad():
        for batch in (4, 4, 8, 8, 4, 8, 4):
            x = torch.randn(batch, 3, device=cuda)
            torch.testing.assert_close(g(x), policy(x))
        assert g.stats.graphs == 2 and g.stats.captures == 2
        for _ in range(2):
            g(torch.randn(16, 3, device=cuda))
        assert g.stats.evictions == 1 and g.stats.graphs == 2


def test_two_wrappers_share_a_pool(cuda):
    a = CudaGraphModule(lambda x: x * 2, warmup=1)
    b = CudaGraphModule(lambda x: x + 1, warmup=1, pool=a.pool)
    assert b.pool == a.pool
    for i in range(4):
        x = torch.full((4,), float(i), device=cuda)
        torch.testing.assert_close(b(a(x)), x * 2 + 1)
