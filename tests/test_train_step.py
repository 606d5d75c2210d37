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
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from graphmodule import CaptureError, CudaGraphModule, StaleGraphError, UnsupportedError

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
        g = CudaGraphModule(_step(net, opt, zero_inside=False), warmup=1, max_graphs=1, backend=graph_backend)
        for i in range(3):
            opt.zero_grad()
            g(*_batch(i))
        with pytest.raises(StaleGraphError) as info:
            g(*_batch(3))  # no zero_grad(): eagerly the backward would add into the last gradients
        assert str(info.value).splitlines()[1] == (
            "  closure variable 'net' of _step.<locals>.step.0.weight.grad: a tensor, where the capture found None "
            "(eagerly the step's backward would add into it; the graph makes a new gradient): set it to None "
            "before each call (zero_grad()), or pass max_graphs=2 to capture a graph for each (gradient "
            "accumulation)")

    def test_a_gradient_the_step_adds_into_set_to_none_between_calls(self, graph_backend):
        (net, opt), _ = _models()
        g = CudaGraphModule(_step(net, opt, zero_inside=True, set_to_none=False), warmup=1, max_graphs=1,
                            backend=graph_backend)
        for i in range(3):
            g(*_batch(i))
        net[0].weight.grad = None
        with pytest.raises(StaleGraphError) as info:
            g(*_batch(3))
        assert str(info.value).splitlines()[1] == (
            "  closure variable 'net' of _step.<locals>.step.0.weight.grad: None, where the capture found the "
            "gradient the graph accumulates into or reads: keep a gradient there between calls "
            "(zero_grad(set_to_none=False)), or pass max_graphs=2 to capture a graph for each (gradient "
            "accumulation)")


def _lagged(opt, net):
    def step(x, y):
        opt.step()  # the gradients of the last call
        opt.zero_grad()
        (net(x) - y).pow(2).mean().backward()

    return step


class TestRefusedAtCapture:
    """What a replay cannot redo is refused at capture, naming what and where."""

    @pytest.mark.parametrize("opt_kind", ["sgd_momentum", "adam"])  # (adam: fused on a CPU, no version bump)
    def test_an_optimizer_step_before_zero_grad_reads_the_last_calls_gradients(self, graph_backend, opt_kind):
        (net, opt), _ = _models(opt_kind)
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


class _Fail:
    """How the step fails after its backward (a plain object's attribute: not watched)."""

    how = None


def _failing_step(net, opt, zero_inside, fail, seen=None):
    def step(x, y):
        if zero_inside:
            opt.zero_grad()
        loss = (net(x) - y).pow(2).mean()
        loss.backward()
        if seen is not None:
            seen.append(1)  # (Python state: refused by a capture that succeeds)
        if fail.how == "raise":
            raise ValueError("a check after the backward")
        if fail.how == "sync":
            loss.item()  # the host waits for the device: a CUDA capture refuses it
        opt.step()
        return loss.detach()

    return step


class TestACaptureThatFailsAfterBackward:
    """The capturing call raises after its backward bound or added into ``.grad``. A CUDA
    capture runs none of its kernels: a gradient it bound is memory never computed. The call
    then runs eagerly (the function's own exception, ``on_capture_failure="eager"``) or is
    refused: ``.grad``, the parameters and Python state are eager's, or as before the call."""

    @pytest.mark.parametrize("zero", ["inside", "outside"])
    def test_the_functions_own_exception(self, graph_backend, zero):
        inside = zero == "inside"
        (net, opt), (twin, opt_e) = _models("sgd_momentum")
        fail, fail_e = _Fail(), _Fail()
        g = CudaGraphModule(_failing_step(net, opt, inside, fail), warmup=1, backend=graph_backend)
        eager = _failing_step(twin, opt_e, inside, fail_e)
        for i in range(5):
            if not inside:
                opt.zero_grad()
                opt_e.zero_grad()
            fail.how = fail_e.how = "raise" if i == 1 else None  # (the capturing call)
            if i == 1:
                with pytest.raises(ValueError, match="a check after the backward"):
                    g(*_batch(i))
                with pytest.raises(ValueError, match="a check after the backward"):
                    eager(*_batch(i))
            else:
                torch.testing.assert_close(g(*_batch(i)), eager(*_batch(i)), rtol=1e-4, atol=1e-5)
            _same_state(net, twin)
        assert g.state == "captured" and g.stats.captures == 1 and g.stats.replays == 3  # (the capture counts)

    @pytest.mark.parametrize("zero", ["inside", "outside"])
    def test_a_host_sync_run_eagerly_instead(self, graph_backend, zero):
        inside = zero == "inside"
        (net, opt), (twin, opt_e) = _models("sgd_momentum")
        fail, fail_e = _Fail(), _Fail()
        fail.how = fail_e.how = "sync"
        g = CudaGraphModule(_failing_step(net, opt, inside, fail), warmup=1, backend=graph_backend,
                            on_capture_failure="eager")
        eager = _failing_step(twin, opt_e, inside, fail_e)
        for i in range(4):
            if not inside:
                opt.zero_grad()
                opt_e.zero_grad()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # (the capture's failure, at call 1)
                torch.testing.assert_close(g(*_batch(i)), eager(*_batch(i)), rtol=1e-4, atol=1e-5)
            _same_state(net, twin)
        assert g.state == "eager" and g.stats.capture_failures == 1

    @pytest.mark.parametrize("zero", ["inside", "outside"])
    def test_a_host_sync_refused_leaves_the_state_as_before_the_call(self, graph_backend, zero):
        inside = zero == "inside"
        (net, opt), (twin, opt_e) = _models("sgd_momentum")
        fail, fail_e = _Fail(), _Fail()
        g = CudaGraphModule(_failing_step(net, opt, inside, fail), warmup=1, backend=graph_backend)
        eager = _failing_step(twin, opt_e, inside, fail_e)
        torch.testing.assert_close(g(*_batch(0)), eager(*_batch(0)), rtol=1e-4, atol=1e-5)
        if not inside:
            opt.zero_grad()
            opt_e.zero_grad()
        fail.how = "sync"
        with pytest.raises(CaptureError) as info:
            g(*_batch(1))
        assert info.value.cause == "host-sync"
        _same_state(net, twin)  # (the eager twin did not make that call)
        fail.how = None
        g.reset()
        for i in range(1, 5):
            if not inside:
                opt.zero_grad()
                opt_e.zero_grad()
            torch.testing.assert_close(g(*_batch(i)), eager(*_batch(i)), rtol=1e-4, atol=1e-5)
            _same_state(net, twin)
        assert g.state == "captured"

    def test_python_state_it_changed_is_changed_once(self, graph_backend):
        (net, opt), (twin, opt_e) = _models("sgd_momentum")
        fail, fail_e = _Fail(), _Fail()
        seen, seen_e = [], []
        g = CudaGraphModule(_failing_step(net, opt, True, fail, seen), warmup=1, backend=graph_backend)
        eager = _failing_step(twin, opt_e, True, fail_e, seen_e)
        g(*_batch(0))
        eager(*_batch(0))
        fail.how = fail_e.how = "raise"
        for step in (g, eager):
            with pytest.raises(ValueError, match="a check after the backward"):
                step(*_batch(1))
        assert len(seen) == len(seen_e) == 2
        _same_state(net, twin)


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


def _copies_made(monkeypatch):
    """The shapes of the copies made from now on (clones and fresh tensors like another)."""
    made = []
    clone, empty_like = torch.Tensor.clone, torch.empty_like

    def counted_clone(t, *args, **kwargs):
        made.append(tuple(t.shape))
        return clone(t, *args, **kwargs)

    def counted_empty_like(t, *args, **kwargs):
        made.append(tuple(t.shape))
        return empty_like(t, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "clone", counted_clone)
    monkeypatch.setattr(torch, "empty_like", counted_empty_like)
    return made


class TestALoopKeepingEveryLoss:
    """A loop that keeps every loss (``losses.append(step(x, y))``, as RL scripts log them) holds
    the results of every output set: the step's graph is captured once more, returning copies.
    The ``.grad`` the step drops at its next call (``zero_grad()`` first) is still lent: copying
    it would cost a copy of every gradient at every call, which nobody keeps."""

    def _run(self, graph_backend, calls, keep_grad_at=None):
        (net, opt), (twin, opt_e) = _models()
        g = CudaGraphModule(_step(net, opt, zero_inside=True), warmup=1, backend=graph_backend)
        eager = _step(twin, opt_e, zero_inside=True)
        losses, losses_e, kept = [], [], None
        for i in range(calls):
            losses.append(g(*_batch(i)))
            losses_e.append(eager(*_batch(i)))
            _same_state(net, twin)
            if i == keep_grad_at:
                kept, kept_e = net[0].weight.grad, twin[0].weight.grad.clone()
        for i, (a, b) in enumerate(zip(losses, losses_e)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=f"loss {i}")
        if kept is not None:
            torch.testing.assert_close(kept, kept_e, msg="the .grad kept past its step")
        return g, net

    def test_every_loss_and_gradient_is_the_plain_steps(self, graph_backend):
        g, net = self._run(graph_backend, calls=9)
        assert g.stats.copy_recaptures == 1 and g.stats.eager_calls == 0
        assert "outputs: COPYING" in g.explain()

    def test_the_gradients_are_not_copied_at_each_call(self, graph_backend, monkeypatch):
        g, net = self._run(graph_backend, calls=7)
        made = _copies_made(monkeypatch)
        (x, y), where = _batch(7), [p.grad.data_ptr() for p in net.parameters()]  # (not the tensors: held)
        kept = [g(x, y) for _ in range(3)]
        assert () in made, "the losses are copies"
        assert not {tuple(p.shape) for p in net.parameters()} & set(made), f"gradients copied: {made}"
        assert [p.grad.data_ptr() for p in net.parameters()] == where and g.stats.copy_recaptures == 1
        assert len(kept) == 3

    def test_a_gradient_kept_past_its_step_gets_a_graph_copying_everything(self, graph_backend):
        g, net = self._run(graph_backend, calls=10, keep_grad_at=6)
        assert g.stats.copy_recaptures == 2 and g.stats.eager_calls == 0


class TestGradientsKeptBound:
    """A step that drops ``.grad`` first (``zero_grad()`` inside) leaves the ``.grad`` its last
    call bound where nothing else holds them: the replay writes the next gradients into them.
    Whatever holds one (a variable, a view, an autograd graph) or wrote into one since keeps
    what eagerly it would: the old gradient, untouched by later calls."""

    def _pair(self, graph_backend):
        (net, opt), (twin, opt_e) = _models()
        g = CudaGraphModule(_step(net, opt, zero_inside=True), warmup=1, backend=graph_backend)
        eager = _step(twin, opt_e, zero_inside=True)
        for i in range(4):
            g(*_batch(i))
            eager(*_batch(i))
        return g, eager, net, twin

    def test_nothing_held_keeps_the_same_gradients_bound(self, graph_backend):
        g, eager, net, twin = self._pair(graph_backend)
        ids = [id(p.grad) for p in net.parameters()]
        for i in range(4, 7):
            g(*_batch(i))
            eager(*_batch(i))
            _same_state(net, twin)
        assert [id(p.grad) for p in net.parameters()] == ids and g.stats.twin_captures == 0

    @pytest.mark.parametrize("hold", ["tensor", "view", "storage", "autograd", "written"])
    def test_a_gradient_held_or_written_keeps_its_value_as_eagerly(self, graph_backend, hold):
        g, eager, net, twin = self._pair(graph_backend)
        p, q = net[0].weight, twin[0].weight
        w = torch.ones_like(p, requires_grad=True)
        w_e = torch.ones_like(q, requires_grad=True)
        if hold == "tensor":
            kept, kept_e = p.grad, q.grad
        elif hold == "view":
            kept, kept_e = p.grad[:2], q.grad[:2]
        elif hold == "storage":  # another tensor over its memory, not a view of it
            kept, kept_e = (torch.empty(0).set_(t.untyped_storage(), t.storage_offset(), t.shape, t.stride())
                            for t in (p.grad, q.grad))
        elif hold == "autograd":  # an autograd graph that saved the gradient (C++ holds it)
            kept, kept_e = (w * p.grad).sum(), (w_e * q.grad).sum()
        else:  # written in place between the calls (a clipping outside the step)
            p.grad.mul_(0.5)
            q.grad.mul_(0.5)
            kept = kept_e = None
        g(*_batch(4))
        eager(*_batch(4))
        _same_state(net, twin)
        if hold == "autograd":
            kept.backward()
            kept_e.backward()
            torch.testing.assert_close(w.grad, w_e.grad)
        elif kept is not None:
            torch.testing.assert_close(kept, kept_e)
            assert kept is not p.grad
        assert p.grad._version == q.grad._version  # a fresh gradient's, as eagerly
        for i in range(5, 8):  # and the calls after
            g(*_batch(i))
            eager(*_batch(i))
            _same_state(net, twin)


# what a loop may do between two calls of a train step, to its gradients and its losses
_BETWEEN = ("nothing", "keep_grad", "keep_view", "keep_storage", "write_grad", "drop_kept", "zero_outside",
            "keep_loss", "drop_losses")


def _hold(action, grad):
    """What ``action`` keeps of a gradient (``grad``: ``p.grad`` now)."""
    if action == "keep_grad":
        return grad
    if action == "keep_view":
        return grad[:2]
    return torch.empty(0, dtype=grad.dtype, device=grad.device).set_(
        grad.untyped_storage(), grad.storage_offset(), grad.shape, grad.stride())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.sampled_from(_BETWEEN), min_size=4, max_size=12))
def test_any_holds_between_steps_leave_what_the_plain_step_leaves(graph_backend, steps):
    """Generated loops: between calls, gradients kept (a variable, a view, another tensor over
    their memory), written in place, dropped; losses kept or dropped. After every call the
    parameters, ``.grad``, every kept gradient and every kept loss are the plain step's."""
    (net, opt), (twin, opt_e) = _models()
    g = CudaGraphModule(_step(net, opt, zero_inside=True), warmup=1, backend=graph_backend)
    eager = _step(twin, opt_e, zero_inside=True)
    kept, kept_e, losses, losses_e = [], [], [], []
    for i, action in enumerate(steps):
        p, q = net[0].weight, twin[0].weight
        if action.startswith("keep_") and action != "keep_loss" and p.grad is not None:
            kept.append(_hold(action, p.grad))
            kept_e.append(_hold(action, q.grad))
        elif action == "write_grad" and p.grad is not None:
            p.grad.mul_(0.5)
            q.grad.mul_(0.5)
        elif action == "drop_kept":
            kept, kept_e = [], []
        elif action == "zero_outside":
            opt.zero_grad()
            opt_e.zero_grad()
        elif action == "drop_losses":
            losses, losses_e = [], []
        out, out_e = g(*_batch(i)), eager(*_batch(i))
        if action == "keep_loss":
            losses.append(out)
            losses_e.append(out_e)
        where = f"call {i} ({action}) of {steps}"
        _same_state(net, twin)
        assert [a.grad._version for a in net.parameters()] == [b.grad._version for b in twin.parameters()], where
        for k, (a, b) in enumerate(zip(kept, kept_e)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=f"kept gradient {k} after {where}")
        for k, (a, b) in enumerate(zip(losses, losses_e)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=f"kept loss {k} after {where}")


def _adam(params):
    return torch.optim.Adam(params, lr=1e-2, **_DEVICE_STEP[torch.get_default_device().type == "cuda"])


def _same_grads(got, want, where):
    for (name, p), (_, q) in zip(got, want):
        assert (p.grad is None) == (q.grad is None), f"{where}: {name}.grad: {p.grad} vs {q.grad}"
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=f"{where}: {name}")
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=f"{where}: {name}.grad")


def _accumulating(net):
    """A call that only runs backward: its gradients add up across calls."""
    def accumulate(x, y):
        loss = (net(x) - y).pow(2).mean()
        loss.backward()
        return loss.detach()

    return accumulate


def _stepping(opt):
    """The optimizer's step and zero_grad, apart from the accumulating call."""
    def apply():
        opt.step()
        opt.zero_grad()

    return apply


class TestGradientAccumulation:
    """``zero_grad()`` (``set_to_none=True``) every second call: the first call of a cycle finds
    ``.grad`` None (its backward binds a new gradient), the second a tensor (it adds into it).
    Each state is a graph of its own (``max_graphs=2``)."""

    def test_a_step_flag_steps_every_second_call(self, graph_backend):
        (net, opt), (twin, opt_e) = _models()

        def make(net, opt):
            def step(x, y, last):
                loss = (net(x) - y).pow(2).mean()
                loss.backward()
                if last:
                    opt.step()
                    opt.zero_grad()
                return loss.detach()

            return step

        g = CudaGraphModule(make(net, opt), warmup=2, backend=graph_backend, max_graphs=2)
        eager = make(twin, opt_e)
        for i in range(12):
            last = i % 2 == 1
            torch.testing.assert_close(g(*_batch(i), last), eager(*_batch(i), last), rtol=1e-4, atol=1e-5)
            _same_grads(net.named_parameters(), twin.named_parameters(), f"call {i}")
        assert (g.stats.captures, g.stats.replays) == (2, 8)

    @pytest.mark.parametrize("apply", ["eager", "wrapped"])
    @pytest.mark.parametrize("cycle", [2, 3])
    def test_an_accumulating_call_and_a_separate_step(self, graph_backend, apply, cycle):
        # accumulate(x, y) only runs backward; the optimizer steps and drops the gradients outside it
        (net, opt), (twin, opt_e) = _models()

        g = CudaGraphModule(_accumulating(net), warmup=2, backend=graph_backend, max_graphs=2)
        g_apply = _stepping(opt)
        if apply == "wrapped":
            g_apply = CudaGraphModule(g_apply, warmup=2, backend=graph_backend)
        eager, eager_apply = _accumulating(twin), _stepping(opt_e)
        for i in range(6 * cycle):
            torch.testing.assert_close(g(*_batch(i)), eager(*_batch(i)), rtol=1e-4, atol=1e-5)
            _same_grads(net.named_parameters(), twin.named_parameters(), f"call {i}")
            if i % cycle == cycle - 1:
                g_apply()
                eager_apply()
                _same_grads(net.named_parameters(), twin.named_parameters(), f"step after call {i}")
        # a graph per state; one captured before the graph that binds the gradients it adds into
        # reads other memory, and is captured again (cycle 3: the first capture finds a tensor)
        assert (g.stats.graphs, g.stats.captures) == (2, 2 if cycle == 2 else 3)
        if apply == "wrapped":
            assert (g_apply.stats.graphs, g_apply.stats.captures) == (1, 1)

    @pytest.mark.parametrize("kept_at", [6, 8])
    def test_a_gradient_kept_past_its_cycle_with_a_fused_step_wrapped_apart(self, graph_backend, kept_at):
        # the kept gradient makes the accumulating call bind another output set (a twin); the wrapped
        # step read the gradients its capture found, which a fused step shows in no parameter's
        # version: it must be captured again over those bound now, not step with the old memory
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        twin = copy.deepcopy(net)
        cuda = graph_backend == "cuda"  # (capturable on CUDA: else the wrapper switches it, with a warning)
        opt, opt_e = (torch.optim.Adam(m.parameters(), lr=1e-2, fused=True, capturable=cuda) for m in (net, twin))

        g, g_apply = CudaGraphModule(_accumulating(net), warmup=2, backend=graph_backend), \
            CudaGraphModule(_stepping(opt), warmup=2, backend=graph_backend)
        eager, eager_apply = _accumulating(twin), _stepping(opt_e)
        kept = []
        for i in range(12):
            torch.testing.assert_close(g(*_batch(i)), eager(*_batch(i)), rtol=1e-4, atol=1e-5)
            _same_grads(net.named_parameters(), twin.named_parameters(), f"call {i}")
            if i == kept_at:
                kept.append(([p.grad for p in net.parameters()], [q.grad for q in twin.parameters()]))
            if i % 2 == 1:
                g_apply()
                eager_apply()
                _same_grads(net.named_parameters(), twin.named_parameters(), f"step after call {i}")
        for got, want in kept:
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        assert g.stats.twin_captures >= 1 and g_apply.stats.recaptures >= 1  # (the path this is about)

    def test_one_graph_refuses_the_other_state_naming_max_graphs(self, graph_backend):
        (net, opt), _ = _models()

        def accumulate(x, y):
            (net(x) - y).pow(2).mean().backward()

        g = CudaGraphModule(accumulate, warmup=1, max_graphs=1, backend=graph_backend)
        g(*_batch(0))
        g(*_batch(1))  # captured with the gradients of the first call: it adds into them
        opt.zero_grad()
        with pytest.raises(StaleGraphError) as info:
            g(*_batch(2))
        assert str(info.value).splitlines()[1] == (
            f"  closure variable 'net' of {accumulate.__qualname__}.0.weight.grad: None, where the capture found the "
            "gradient the graph accumulates into or reads: keep a gradient there between calls "
            "(zero_grad(set_to_none=False)), or pass max_graphs=2 to capture a graph for each (gradient "
            "accumulation)")


class _Critic(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, obs, act):
        return self.net(torch.cat([obs, act], -1))


def _actor_critic():
    torch.manual_seed(0)
    critic, actor = _Critic(), nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2), nn.Tanh())
    return (critic, actor), copy.deepcopy((critic, actor))


def _updates(critic, actor, zero):
    """The DDPG/TD3/SAC shape: the actor's loss backpropagates through the critic, whose
    parameters get .grad from it; each update zeroes its optimizer's gradients (``zero``:
    "own"), or the whole model's ("model")."""
    critic_opt, actor_opt = _adam(critic.parameters()), _adam(actor.parameters())
    model = nn.ModuleList([critic, actor])

    def update_critic(obs, act, target):
        loss = (critic(obs, act) - target).pow(2).mean()
        (critic_opt if zero == "own" else model).zero_grad()
        loss.backward()
        critic_opt.step()
        return loss.detach()

    def update_actor(obs):
        loss = -critic(obs, actor(obs)).mean()
        (actor_opt if zero == "own" else model).zero_grad()
        loss.backward()
        actor_opt.step()
        return loss.detach()

    return update_critic, update_actor


def _transition(i):
    gen = torch.Generator().manual_seed(i)
    obs, act, target = (torch.randn(5, n, generator=gen, device="cpu") for n in (4, 2, 1))
    device = torch.get_default_device()
    return obs.to(device), act.to(device), target.to(device)


def _named(modules):
    return [(f"{k}.{name}", p) for k, m in enumerate(modules) for name, p in m.named_parameters()]


@pytest.mark.parametrize("order", ["critic_first", "actor_first"])
@pytest.mark.parametrize("zero", ["own", "model"])
def test_actor_and_critic_updates_wrapped_separately(graph_backend, zero, order):
    (critic, actor), (critic_e, actor_e) = _actor_critic()
    g_c, g_a = (CudaGraphModule(f, warmup=2, backend=graph_backend) for f in _updates(critic, actor, zero))
    e_c, e_a = _updates(critic_e, actor_e, zero)
    for i in range(8):
        obs, act, target = _transition(i)
        calls = [(g_c, e_c, (obs, act, target)), (g_a, e_a, (obs,))]
        for g, e, args in (calls if order == "critic_first" else calls[::-1]):
            torch.testing.assert_close(g(*args), e(*args), rtol=1e-4, atol=1e-5)
            _same_grads(_named((critic, actor)), _named((critic_e, actor_e)), f"call {i} of {g}")
    # the actor's graph, captured first, adds into the gradients the critic's warmup bound (zero="own"): it is
    # captured again over those the critic's graph binds
    assert (g_c.stats.captures, g_a.stats.captures) == (1, 1 if order == "critic_first" or zero == "model" else 2)


def test_critic_gradients_held_past_the_next_call(graph_backend):
    # the critic's graph binds another set of gradients while one is held (twins, then copies);
    # the actor's graph, which adds into them, is captured again over the memory bound then:
    # slower, and what eager gives
    (critic, actor), (critic_e, actor_e) = _actor_critic()
    g_c, g_a = (CudaGraphModule(f, warmup=2, backend=graph_backend) for f in _updates(critic, actor, "own"))
    e_c, e_a = _updates(critic_e, actor_e, "own")
    held, held_e = [], []
    for i in range(8):
        obs, act, target = _transition(i)
        for g, e, args in ((g_c, e_c, (obs, act, target)), (g_a, e_a, (obs,))):
            torch.testing.assert_close(g(*args), e(*args), rtol=1e-4, atol=1e-5)
            _same_grads(_named((critic, actor)), _named((critic_e, actor_e)), f"call {i} of {g}")
        held.append([p.grad for p in critic.parameters()])
        held_e.append([p.grad for p in critic_e.parameters()])
    for got, want in zip(held, held_e):
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert g_a.stats.recaptures > 0
