"""Hooks outside the module hook dicts that a train step runs: the parameters' tensor hooks
(``register_hook``, ``register_post_accumulate_grad_hook``), the optimizers' step hooks and
torch's global ones. A replay runs none of their Python: present at the capture, one that only
computes tensors is recorded and served, one that changes Python state is refused naming it;
added or removed after the capture, the graph is stale. Each test runs the plain step on a twin
of the same state beside the wrapper."""

import copy

import pytest
import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from graphmodule import CudaGraphModule, StaleGraphError, UnsupportedError, allow_hook


def _nets():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    return net, copy.deepcopy(net)


def _step(net, opt=None):
    opt = opt if opt is not None else torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)

    def step(x):
        opt.zero_grad()
        loss = net(x).pow(2).sum()
        loss.backward()
        opt.step()
        return loss.detach()

    step.opt = opt
    return step


def _x(i):
    return torch.linspace(-1.0, 1.0, 6).reshape(2, 3) + 0.1 * i


def _same(net, twin):
    for (name, p), q in zip(net.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, msg=name)
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, msg=f"{name}.grad")


def _calls(g, plain, net, twin, n, start=0):
    for i in range(start, start + n):
        torch.testing.assert_close(g(_x(i)), plain(_x(i)))
        _same(net, twin)


def _refusal(kind, hook, register, where, changes, scope, advice):
    return (f"CudaGraphModule(step) cannot replay this call as a CUDA graph: expected the Python hooks {scope} to "
            f"change no Python state, got {kind} {hook!r} ({register}) on {where}, which changes: {changes}. A replay "
            f"runs no Python, so the hook would run once, at capture, and never again.\nTo fix: {advice}")


TENSORS = "on the tensors the graph's backward reaches"
OPTIMIZERS = "on the optimizers the graph steps"
TENSOR_ADVICE = ("keep that state outside the hook (do its work on p.grad after the call), remove the hook while the "
                 "wrapper runs (handle.remove()), wrap the forward only (a graph used as a layer runs its parameters' "
                 "hooks eagerly at every backward), or, if running it at the warmup calls and the capture only is "
                 "what you want, mark it with graphmodule.allow_hook(hook).")
OPTIMIZER_ADVICE = ("keep that state outside the hook (do its work after the call; a learning rate it sets, in a "
                    "tensor updated in place), remove the hook while the wrapper runs (handle.remove()), or, if "
                    "running it at the warmup calls and the capture only is what you want, mark it with "
                    "graphmodule.allow_hook(hook).")
WEIGHT = "closure variable 'net' of _step.<locals>.step.0.weight"
OPT = "closure variable 'opt' of _step.<locals>.step"


def halve(grad):
    return grad * 0.5


class TestServed:
    """A hook present at the capture that only computes tensors is recorded: every replay runs
    its tensor work, as every eager call runs the hook."""

    def test_a_tensor_hook_that_scales_the_gradient(self, graph_backend):
        net, twin = _nets()
        for m in (net, twin):
            m[0].weight.register_hook(halve)
        g, plain = CudaGraphModule(_step(net), warmup=1, backend=graph_backend), _step(twin)
        _calls(g, plain, net, twin, 5)
        assert g.stats.captures == 1 and g.stats.replays == 4

    def test_an_optimizer_stepped_in_backward(self, graph_backend):
        # torch's "optimizer step in backward" recipe: each parameter stepped, and its gradient
        # dropped, as soon as it is accumulated
        net, twin = _nets()

        def make(m):
            opts = {p: torch.optim.SGD([p], lr=0.1) for p in m.parameters()}

            def step_now(p):
                opts[p].step()
                opts[p].zero_grad()

            for p in m.parameters():
                p.register_post_accumulate_grad_hook(step_now)

            def step(x):
                loss = m(x).pow(2).sum()
                loss.backward()
                return loss.detach()

            return step

        g, plain = CudaGraphModule(make(net), warmup=1, backend=graph_backend), make(twin)
        _calls(g, plain, net, twin, 5)
        assert all(p.grad is None for p in net.parameters())
        assert g.stats.captures == 1 and g.stats.replays == 4

    def test_a_step_post_hook_that_averages_the_weights(self, graph_backend):
        net, twin = _nets()
        averages = []

        def make(m):
            step = _step(m)
            params = list(m.parameters())
            average = [p.detach().clone() for p in params]
            averages.append(average)

            def update(opt, args, kwargs):
                with torch.no_grad():
                    for a, p in zip(average, params):
                        a.lerp_(p, 0.25)

            step.opt.register_step_post_hook(update)
            return step

        g, plain = CudaGraphModule(make(net), warmup=1, backend=graph_backend), make(twin)
        for i in range(5):
            torch.testing.assert_close(g(_x(i)), plain(_x(i)))
            _same(net, twin)
            for a, b in zip(*averages):
                torch.testing.assert_close(a, b)
        assert g.stats.captures == 1

    def test_a_global_step_hook_that_clamps_the_weights(self, graph_backend):
        def clamp(opt, args, kwargs):
            with torch.no_grad():
                for group in opt.param_groups:
                    for p in group["params"]:
                        p.clamp_(-0.3, 0.3)

        net, twin = _nets()
        handle = register_optimizer_step_post_hook(clamp)
        try:
            g, plain = CudaGraphModule(_step(net), warmup=1, backend=graph_backend), _step(twin)
            _calls(g, plain, net, twin, 5)
        finally:
            handle.remove()
        assert g.stats.captures == 1

    def test_an_effectful_hook_marked_with_allow_hook(self, graph_backend):
        net, twin = _nets()
        norms, eager_norms = [], []
        net[0].weight.register_hook(allow_hook(lambda grad: norms.append(grad.norm())))
        twin[0].weight.register_hook(lambda grad: eager_norms.append(grad.norm()))
        g, plain = CudaGraphModule(_step(net), warmup=1, backend=graph_backend), _step(twin)
        _calls(g, plain, net, twin, 5)
        assert len(norms) == 2 and len(eager_norms) == 5  # (the warmup call and the capture)
        torch.testing.assert_close(norms[0], eager_norms[0])

    def test_a_hook_on_a_graph_used_as_a_layer_runs_eagerly(self, graph_backend):
        # the backward runs outside the function: autograd runs the parameters' hooks at each one
        net, twin = _nets()
        g = CudaGraphModule(net, warmup=1, backend=graph_backend)
        for i in range(2):
            g(_x(i)).sum().backward()
            twin(_x(i)).sum().backward()
        for m in (net, twin):
            m[0].weight.register_hook(halve)
        for i in range(2, 5):
            g(_x(i)).sum().backward()
            twin(_x(i)).sum().backward()
            _same(net, twin)
        assert g.stats.captures == 1 and g.stats.recaptures == 0


class TestRefused:
    """A hook present at the capture that changes Python state would run at the capture only:
    refused before any replay, naming it; what it changed during the capture is put back."""

    def test_a_tensor_hook_that_logs(self, graph_backend):
        net, _ = _nets()
        norms = []

        def log_norm(grad):
            norms.append(grad.norm())

        net[0].weight.register_hook(log_norm)
        g = CudaGraphModule(_step(net), warmup=1, backend=graph_backend)
        g(_x(0))
        with pytest.raises(UnsupportedError) as info:
            g(_x(1))
        assert str(info.value) == _refusal(
            "tensor hook", "TestRefused.test_a_tensor_hook_that_logs.<locals>.log_norm", "register_hook", WEIGHT,
            "closure variable 'norms' of TestRefused.test_a_tensor_hook_that_logs.<locals>.log_norm (list) was "
            "modified in place", TENSORS, TENSOR_ADVICE)
        assert len(norms) == 1  # the warmup call's: the capture's was put back

    def test_a_post_accumulate_grad_hook_that_counts(self, graph_backend):
        net, _ = _nets()
        counts = {"accumulated": 0}

        def count(p):
            counts["accumulated"] += 1

        net[0].weight.register_post_accumulate_grad_hook(count)
        g = CudaGraphModule(_step(net), warmup=1, backend=graph_backend)
        g(_x(0))
        with pytest.raises(UnsupportedError) as info:
            g(_x(1))
        assert str(info.value) == _refusal(
            "post-accumulate-grad hook", "TestRefused.test_a_post_accumulate_grad_hook_that_counts.<locals>.count",
            "register_post_accumulate_grad_hook", WEIGHT,
            "closure variable 'counts' of TestRefused.test_a_post_accumulate_grad_hook_that_counts.<locals>.count "
            "(dict) was modified in place", TENSORS, TENSOR_ADVICE)
        assert counts == {"accumulated": 1}

    def test_a_step_pre_hook_that_sets_the_learning_rate(self, graph_backend):
        net, _ = _nets()
        step = _step(net)

        def decay(opt, args, kwargs):
            for group in opt.param_groups:
                group["lr"] *= 0.5

        step.opt.register_step_pre_hook(decay)
        g = CudaGraphModule(step, warmup=1, backend=graph_backend)
        g(_x(0))
        with pytest.raises(UnsupportedError) as info:
            g(_x(1))
        assert str(info.value) == _refusal(
            "optimizer step pre-hook", "TestRefused.test_a_step_pre_hook_that_sets_the_learning_rate.<locals>.decay",
            "register_step_pre_hook", OPT, f"{OPT}.param_groups[0].lr was rebound (0.05 → 0.025)", OPTIMIZERS,
            OPTIMIZER_ADVICE)
        assert step.opt.param_groups[0]["lr"] == 0.05  # the warmup call's decay: the capture's was put back

    def test_a_global_step_hook_that_counts(self, graph_backend):
        steps = []

        def count(opt, args, kwargs):
            steps.append(1)

        net, _ = _nets()
        handle = register_optimizer_step_pre_hook(count)
        try:
            g = CudaGraphModule(_step(net), warmup=1, backend=graph_backend)
            g(_x(0))
            with pytest.raises(UnsupportedError) as info:
                g(_x(1))
        finally:
            handle.remove()
        assert str(info.value) == _refusal(
            "optimizer step pre-hook", "TestRefused.test_a_global_step_hook_that_counts.<locals>.count",
            "register_optimizer_step_pre_hook", "every optimizer (global)",
            "closure variable 'steps' of TestRefused.test_a_global_step_hook_that_counts.<locals>.count (list) was "
            "modified in place", OPTIMIZERS, OPTIMIZER_ADVICE)
        assert steps == [1]


def _stale_message(where, what):
    return [
        "CudaGraphModule(step) was captured reading state that has changed since:",
        f"  {where}: {what}",
    ]


class TestWatchedAfterCapture:
    """Hooks added or removed after the capture: the graph is stale (a replay would not run
    the new hook, or would run the removed one's recorded work); recaptured with
    ``on_stale="recapture"``."""

    def test_a_tensor_hook_added(self, graph_backend):
        net, twin = _nets()
        g, plain = CudaGraphModule(_step(net), warmup=1, backend=graph_backend), _step(twin)
        _calls(g, plain, net, twin, 3)
        handle = net[0].weight.register_hook(halve)
        with pytest.raises(StaleGraphError) as info:
            g(_x(3))
        assert str(info.value).splitlines()[:2] == _stale_message(
            WEIGHT, "tensor hook 'halve' (register_hook) added since the capture, which a replay would not run: "
                    "remove it (handle.remove()) to replay")
        handle.remove()
        replays = g.stats.replays
        _calls(g, plain, net, twin, 2, start=3)
        assert g.stats.replays == replays + 2

    @pytest.mark.parametrize("hook_kind", ["register_hook", "register_post_accumulate_grad_hook",
                                           "register_step_post_hook", "register_optimizer_step_post_hook"])
    def test_a_hook_added_with_recapture_is_served(self, graph_backend, hook_kind):
        net, twin = _nets()
        g, plain = CudaGraphModule(_step(net), warmup=1, backend=graph_backend, on_stale="recapture"), _step(twin)
        _calls(g, plain, net, twin, 3)
        handles = []
        for m, step in ((net, g.module), (twin, plain)):
            weight = m[0].weight
            if hook_kind == "register_hook":
                handles.append(weight.register_hook(halve))
            elif hook_kind == "register_post_accumulate_grad_hook":
                handles.append(weight.register_post_accumulate_grad_hook(_clamp_grad))
            elif hook_kind == "register_step_post_hook":
                handles.append(step.opt.register_step_post_hook(lambda opt, a, k: _shrink(opt)))
        if hook_kind == "register_optimizer_step_post_hook":
            handles.append(register_optimizer_step_post_hook(lambda opt, a, k: _shrink(opt)))
        try:
            _calls(g, plain, net, twin, 4, start=3)
        finally:
            for handle in handles:
                handle.remove()
        assert g.stats.recaptures == 1 and g.stats.captures == 2

    def test_a_tensor_hook_removed(self, graph_backend):
        net, twin = _nets()
        handle = net[0].weight.register_hook(halve)
        eager_handle = twin[0].weight.register_hook(halve)
        g, plain = CudaGraphModule(_step(net), warmup=1, backend=graph_backend), _step(twin)
        _calls(g, plain, net, twin, 3)
        handle.remove()
        eager_handle.remove()
        with pytest.raises(StaleGraphError) as info:
            g(_x(3))
        assert info.value.changes == [
            (f"{WEIGHT}: tensor hook 'halve' (register_hook)", "removed"),
            (WEIGHT, "tensor hook 'halve' (register_hook) removed since the capture, which the graph replays")]

    def test_a_tensor_hook_removed_with_recapture_is_served(self, graph_backend):
        net, twin = _nets()
        handles = [m[0].weight.register_hook(halve) for m in (net, twin)]
        g, plain = CudaGraphModule(_step(net), warmup=1, backend=graph_backend, on_stale="recapture"), _step(twin)
        _calls(g, plain, net, twin, 3)
        for handle in handles:
            handle.remove()
        _calls(g, plain, net, twin, 4, start=3)
        assert g.stats.recaptures == 1 and g.stats.captures == 2

    def test_step_hooks_added(self, graph_backend):
        net, _ = _nets()
        g = CudaGraphModule(_step(net), warmup=1, backend=graph_backend)
        for i in range(3):
            g(_x(i))
        handle = g.module.opt.register_step_post_hook(_shrink_hook)
        with pytest.raises(StaleGraphError) as info:
            g(_x(3))
        handle.remove()
        assert str(info.value).splitlines()[:2] == _stale_message(
            OPT, "optimizer step post-hook '_shrink_hook' (register_step_post_hook) added since the capture, which "
                 "a replay would not run: remove it (handle.remove()) to replay")
        handle = register_optimizer_step_post_hook(_shrink_hook)
        try:
            with pytest.raises(StaleGraphError) as info:
                g(_x(3))
        finally:
            handle.remove()
        assert str(info.value).splitlines()[:2] == _stale_message(
            "every optimizer (global)", "optimizer step post-hook '_shrink_hook' (register_optimizer_step_post_hook) "
                                        "added since the capture, which a replay would not run: remove it "
                                        "(handle.remove()) to replay")
        g(_x(3))  # (both removed: replayed)

    def test_a_hook_on_a_tensor_the_graph_does_not_read_is_no_change(self, graph_backend):
        net, twin = _nets()
        g, plain = CudaGraphModule(_step(net), warmup=1, backend=graph_backend), _step(twin)
        _calls(g, plain, net, twin, 3)
        other = nn.Linear(2, 2)
        other.weight.register_hook(halve)
        torch.optim.SGD(other.parameters(), lr=0.1).register_step_post_hook(_shrink_hook)
        replays = g.stats.replays
        _calls(g, plain, net, twin, 3, start=3)
        assert g.stats.replays == replays + 3

    def test_a_python_value_a_tensor_hook_reads(self, graph_backend):
        global SCALE
        net, twin = _nets()
        net[0].weight.register_hook(scaled)
        g = CudaGraphModule(_step(net), warmup=1, backend=graph_backend)
        for i in range(3):
            g(_x(i))
        SCALE = 0.25
        try:
            with pytest.raises(StaleGraphError) as info:
                g(_x(3))
        finally:
            SCALE = 0.5
        assert info.value.changes == [("global 'SCALE' read by scaled", "0.5 at capture, 0.25 now (the graph uses 0.5)")]


SCALE = 0.5


def scaled(grad):
    return grad * SCALE


def _shrink(opt):
    with torch.no_grad():
        for group in opt.param_groups:
            for p in group["params"]:
                p.mul_(0.9)


def _shrink_hook(opt, args, kwargs):
    _shrink(opt)


def _clamp_grad(p):
    p.grad.clamp_(-0.1, 0.1)
