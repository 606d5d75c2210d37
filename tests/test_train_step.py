"""Whole train steps in the wrapped function: what every call leaves in ``.grad`` and attributes.

A train step (forward, loss, backward, optimizer step) rebinds Python state: with
``optimizer.zero_grad()`` (``set_to_none=True``, torch's default) inside, backward binds a
new tensor to every ``p.grad`` at each call; a step may also store its loss on a module. A
replay runs no Python: what a capture bound stays bound, and a second capture of the step
(a twin while results are held, another batch size) binds its own tensors. After every call
of every graph, ``p.grad``, the parameters and every attribute the step rebinds must be what
the plain step leaves.

Simulated replays run the recorded tensor operations and no Python, as a real replay; the
``cuda`` variants run real graphs.
"""

import copy

import pytest
import torch
from torch import nn

from graphmodule import CudaGraphModule, StaleGraphError, UnsupportedError

_DEVICE_STEP = {True: {"capturable": True}, False: {"fused": True}}


def _models(opt_kind="adam"):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    twin = copy.deepcopy(net)
    make = {
        # capturable on CUDA; fused on a CPU, where capturable is refused (both keep the step count
        # on the device: a non-capturable Adam reads it on the host, which a capture refuses)
        "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2, **_DEVICE_STEP[torch.get_default_device().type == "cuda"]),
        "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True),
    }[opt_kind]
    return (net, make(net.parameters())), (twin, make(twin.parameters()))


def _step(net, opt, zero_inside, set_to_none=True):
    def step(x, y):
        if zero_inside:
            opt.zero_grad(set_to_none=set_to_none)
        loss = (net(x) - y).pow(2).mean()
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def _batch(i, n=5):
    gen = torch.Generator().manual_seed(i)  # (on the CPU, whatever the default device)
    x, y = torch.randn(n, 4, generator=gen, device="cpu"), torch.randn(n, 1, generator=gen, device="cpu")
    device = torch.get_default_device()
    return x.to(device), y.to(device)


def _same_state(net, twin):
    for (name, p), q in zip(net.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)
        assert (p.grad is None) == (q.grad is None), f"{name}.grad: {p.grad} vs {q.grad}"
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=f"{name}.grad")


@pytest.mark.parametrize("hold", [False, True], ids=["dropped", "held"])
@pytest.mark.parametrize("zero", ["inside", "inside_keep", "outside", "outside_keep"])
@pytest.mark.parametrize("opt_kind", ["adam", "sgd_momentum"])
def test_grads_and_parameters_after_every_step(graph_backend, opt_kind, zero, hold):
    # `zero`: where optimizer.zero_grad() runs, and whether it sets .grad to None ("_keep": zeros)
    inside, set_to_none = zero.startswith("inside"), not zero.endswith("_keep")
    (net, opt), (twin, opt_e) = _models(opt_kind)
    g = CudaGraphModule(_step(net, opt, inside, set_to_none), warmup=2, backend=graph_backend)
    eager = _step(twin, opt_e, inside, set_to_none)
    held, grads = [], []
    for i in range(8):
        if not inside:
            opt.zero_grad(set_to_none=set_to_none)
            opt_e.zero_grad(set_to_none=set_to_none)
        loss, loss_e = g(*_batch(i)), eager(*_batch(i))
        torch.testing.assert_close(loss, loss_e, rtol=1e-4, atol=1e-5)
        _same_state(net, twin)
        grads.append(([id(p.grad) for p in net.parameters()], [id(q.grad) for q in twin.parameters()]))
        if hold:  # the loss, and the .grad tensors as they are now
            held.append(([loss] + [p.grad for p in net.parameters()], [loss_e] + [q.grad for q in twin.parameters()]))
        del loss, loss_e  # (dropped: nothing of this call is held at the next one)
    for got, want in held:
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    if hold:  # a new .grad tensor at every step where eagerly one (set_to_none), the same one otherwise
        new = [len(set(ids)) for ids in zip(*(got for got, _ in grads))]
        new_e = [len(set(ids)) for ids in zip(*(want for _, want in grads))]
        assert new == new_e


def test_grads_after_steps_of_two_batch_sizes(graph_backend):
    # one graph per batch size, each capture binding its own .grad tensors
    (net, opt), (twin, opt_e) = _models()
    g = CudaGraphModule(_step(net, opt, True), warmup=1, backend=graph_backend, max_graphs=2, outputs="clone")
    eager = _step(twin, opt_e, True)
    for i in range(8):
        n = 5 if i % 2 else 6
        torch.testing.assert_close(g(*_batch(i, n)), eager(*_batch(i, n)), rtol=1e-4, atol=1e-5)
        _same_state(net, twin)


def _logging_step(net, opt):
    def step(x, y):
        opt.zero_grad()
        loss = (net(x) - y).pow(2).mean()
        loss.backward()
        opt.step()
        net.last_loss = loss.detach()  # rebinds a module attribute at every call
        return loss.detach()

    return step


def test_a_module_attribute_the_step_rebinds(graph_backend):
    # bound after each replay to this call's value (lent, as the returned loss is)
    (net, opt), (twin, opt_e) = _models()
    g = CudaGraphModule(_logging_step(net, opt), warmup=2, backend=graph_backend)
    eager = _logging_step(twin, opt_e)
    logged, logged_e = [], []
    for i in range(6):
        g(*_batch(i))
        eager(*_batch(i))
        logged.append(net.last_loss)
        logged_e.append(twin.last_loss)
    assert len({id(t) for t in logged}) == len(logged)  # a new tensor at every call, as eagerly
    for got, want in zip(logged, logged_e):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


class TestWhatEachCallMustFind:
    """A ``.grad`` the graph adds into (or whose absence its backward relies on) must be bound at
    every call as at capture: a call that finds another raises before any replay."""

    def test_a_gradient_left_from_the_last_call_where_zero_grad_runs_outside(self, graph_backend):
        (net, opt), _ = _models()
        g = CudaGraphModule(_step(net, opt, zero_inside=False), warmup=1, backend=graph_backend)
        for i in range(3):
            opt.zero_grad()
            g(*_batch(i))
        with pytest.raises(StaleGraphError) as info:
            g(*_batch(3))  # no zero_grad(): eagerly the backward would add into the last gradients
        assert str(info.value).splitlines()[1] == (
            "  closure variable 'net' of _step.<locals>.step.0.weight.grad: a tensor, where the capture found None "
            "(eagerly the step's backward would add into it; the graph makes a new gradient): set it to None "
            "before each call (zero_grad())")

    def test_a_gradient_the_step_adds_into_set_to_none_between_calls(self, graph_backend):
        (net, opt), _ = _models()
        g = CudaGraphModule(_step(net, opt, zero_inside=True, set_to_none=False), warmup=1, backend=graph_backend)
        for i in range(3):
            g(*_batch(i))
        net[0].weight.grad = None
        with pytest.raises(StaleGraphError) as info:
            g(*_batch(3))
        assert str(info.value).splitlines()[1] == (
            "  closure variable 'net' of _step.<locals>.step.0.weight.grad: None, where the capture found the tensor "
            "the graph accumulates into or reads: keep that tensor between calls (zero_grad(set_to_none=False))")


def _lagged(opt, net):
    def step(x, y):
        opt.step()  # the gradients of the last call
        opt.zero_grad()
        (net(x) - y).pow(2).mean().backward()

    return step


class TestRefusedAtCapture:
    """What a replay cannot redo is refused at capture, naming what and where."""

    def test_an_optimizer_step_before_zero_grad_reads_the_last_calls_gradients(self, graph_backend):
        (net, opt), _ = _models("sgd_momentum")
        g = CudaGraphModule(_lagged(opt, net), warmup=1, backend=graph_backend)
        g(*_batch(0))
        with pytest.raises(UnsupportedError) as info:
            g(*_batch(1))
        assert str(info.value) == (
            "CudaGraphModule(step) cannot replay this call as a CUDA graph: the function reads closure variable "
            "'net' of _lagged.<locals>.step.0.weight.grad as bound before the call (set by an earlier backward) and "
            "then binds another gradient there (an optimizer step before zero_grad()); a replay would read the "
            "gradient tensor of the capture, not the one bound at the call.\nTo fix: keep the gradients in one "
            "tensor (zero_grad(set_to_none=False)), or run zero_grad() and the backward before the optimizer "
            "step inside the function.")
        assert g.state == "warmup"

    def test_an_attribute_read_then_rebound(self, graph_backend):
        stat = nn.Module()
        stat.mean = torch.zeros(3)

        def update(x):
            stat.mean = 0.9 * stat.mean + 0.1 * x  # the last call's mean, read
            return stat.mean * 2

        g = CudaGraphModule(update, warmup=1, backend=graph_backend)
        g(torch.ones(3))
        with pytest.raises(UnsupportedError) as info:
            g(torch.ones(3))
        assert str(info.value) == (
            "CudaGraphModule(update) cannot replay this call as a CUDA graph: the function reads closure variable "
            f"'stat' of {update.__qualname__}.mean and then rebinds it to a new tensor; a replay would read the tensor of the "
            "capture, not the one bound at the call.\nTo fix: update the tensor in place (x.copy_(new), "
            "x.mul_(0.9).add_(y)), or keep it outside the wrapped function.")

    def test_an_attribute_counter(self, graph_backend):
        net = nn.Linear(4, 1)
        net.calls = 0

        def fn(x):
            net.calls += 1
            return net(x)

        g = CudaGraphModule(fn, warmup=1, backend=graph_backend)
        g(torch.ones(4))
        with pytest.raises(UnsupportedError) as info:
            g(torch.ones(4))
        assert str(info.value).splitlines()[0] == (
            "CudaGraphModule(fn) cannot replay this call as a CUDA graph: the function changes Python state, "
            f"which a replay (GPU work only) would not: closure variable 'net' of {fn.__qualname__}.calls was rebound "
            "(1 → 2).")


def test_an_optimizer_step_whose_backward_runs_outside(graph_backend):
    # zero_grad(set_to_none=False): the gradients stay in the tensors the graph reads
    (net, opt), (twin, opt_e) = _models("sgd_momentum")

    def apply(opt):
        def step():
            opt.step()
            opt.zero_grad(set_to_none=False)

        return step

    g, eager = CudaGraphModule(apply(opt), warmup=1, backend=graph_backend), apply(opt_e)
    for i in range(5):
        for m in (net, twin):
            (m(_batch(i)[0]) - _batch(i)[1]).pow(2).mean().backward()
        g()
        eager()
        _same_state(net, twin)


def test_gradients_bound_by_the_last_call_do_not_hold_its_output_set(graph_backend):
    # the step drops them (zero_grad() inside): a loop that keeps nothing needs one output set
    (net, opt), _ = _models()
    g = CudaGraphModule(_step(net, opt, zero_inside=True), warmup=1, backend=graph_backend)
    for i in range(6):
        g(*_batch(i))
    assert (g.stats.twin_captures, g.stats.copy_recaptures) == (0, 0)
    kept = net[0].weight.grad  # a gradient kept past the next call: that call gets another set
    g(*_batch(6))
    assert g.stats.twin_captures == 1 and net[0].weight.grad is not kept
