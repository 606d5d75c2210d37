"""Module hooks: Python a replay would not run is refused at capture, and watched after it."""

import warnings

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torch.nn.modules.module import register_module_forward_hook
from torch.nn.utils import prune

from graphmodule import CudaGraphModule, InputMismatchError, StaleGraphError, UnsupportedError

X = torch.ones(2, 3)


def _net():
    return nn.Sequential(nn.Linear(3, 3), nn.ReLU())


def _calls(g, n=3, x=X):
    with torch.no_grad():
        return [g(x + i) for i in range(n)]


def log_activation(module, args, output):
    LOG.append(output.sum().item())


LOG: list = []


class TestRefusedAtCapture:
    def test_a_forward_hook_with_a_python_effect(self, graph_backend, ones):
        net = _net()
        handle = net[0].register_forward_hook(log_activation)
        g = CudaGraphModule(net, warmup=1, backend=graph_backend)
        with torch.no_grad(), pytest.raises(UnsupportedError) as info:
            for _ in range(10):
                g(ones)
        assert str(info.value) == (
            "CudaGraphModule(Sequential) cannot replay this call as a CUDA graph: expected no Python hooks on the "
            "modules the graph runs, got forward hook 'log_activation' (register_forward_hook) on module.0: a replay "
            "runs no Python, so the hook would run once, at capture, and never again.\n"
            "To fix: remove the hook while the wrapper runs (handle.remove()), do its work on the results outside "
            "the wrapped function, or keep that module out of the wrapped function."
        )
        handle.remove()  # the wrapper was left as if the call had not been made
        out = _calls(g, x=ones)[-1]
        torch.testing.assert_close(out, net(ones + 2))
        assert g.stats.captures == 1

    def test_a_forward_pre_hook(self):
        net = _net()
        net.register_forward_pre_hook(lambda module, args: None)
        g = CudaGraphModule(net, warmup=1, backend="simulate")
        with pytest.raises(UnsupportedError, match=r"got forward pre-hook '.*<lambda>' \(register_forward_pre_hook\) "
                                                   r"on module:"):
            _calls(g)

    def test_a_global_forward_hook(self):
        g = CudaGraphModule(_net(), warmup=1, backend="simulate")
        handle = register_module_forward_hook(log_activation)
        try:
            with pytest.raises(UnsupportedError, match=r"got forward hook 'log_activation' "
                                                       r"\(register_module_forward_hook\) on every module \(global\):"):
                _calls(g)
        finally:
            handle.remove()

    def test_a_backward_hook_in_a_train_step(self, graph_backend, ones):
        net = _net()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        net[1].register_full_backward_hook(lambda module, grad_in, grad_out: None)

        def step(x):
            opt.zero_grad()
            loss = net(x).sum()
            loss.backward()
            opt.step()
            return loss.detach()

        g = CudaGraphModule(step, warmup=1, backend=graph_backend)
        g(ones)
        weight = net[0].weight.detach().clone()
        with pytest.raises(UnsupportedError, match=r"got backward hook '.*<lambda>' \(register_full_backward_hook\) "
                                                   r"on closure variable 'net' of .*step\.1:"):
            g(ones)
        assert torch.equal(net[0].weight, weight)  # refused before the step ran

    def test_a_backward_hook_is_not_run_without_grad(self):
        net = _net()
        net[0].register_full_backward_hook(lambda module, grad_in, grad_out: None)
        g = CudaGraphModule(net, warmup=1, backend="simulate")
        torch.testing.assert_close(_calls(g)[-1], net(X + 2))


class TestWatchedAfterCapture:
    def test_a_hook_added(self, graph_backend, ones):
        net = _net()
        g = CudaGraphModule(net, warmup=1, backend=graph_backend)
        _calls(g, x=ones)
        handle = net[0].register_forward_hook(log_activation)
        with torch.no_grad(), pytest.raises(StaleGraphError) as info:
            g(ones)
        assert str(info.value).splitlines()[:2] == [
            "CudaGraphModule(Sequential) was captured reading state that has changed since:",
            "  module.0: forward hook 'log_activation' (register_forward_hook) added since the capture, which a "
            "replay would not run: remove it (handle.remove()) to replay",
        ]
        handle.remove()
        replays = g.stats.replays
        torch.testing.assert_close(_calls(g, 1, x=ones)[0], net(ones))
        assert g.stats.replays == replays + 1

    def test_a_hook_added_with_recapture_is_refused_at_the_capture(self):
        net = _net()
        g = CudaGraphModule(net, warmup=1, backend="simulate", on_stale="recapture")
        _calls(g)
        net.register_forward_pre_hook(lambda module, args: None)
        with pytest.raises(UnsupportedError, match="expected no Python hooks"):
            _calls(g)

    def test_a_hook_registered_elsewhere_is_no_change(self):
        net, other = _net(), _net()
        g = CudaGraphModule(net, warmup=1, backend="simulate")
        _calls(g)
        other.register_forward_hook(log_activation)
        torch.ones(1, requires_grad=True).register_hook(lambda grad: grad)
        replays = g.stats.replays
        _calls(g)
        assert g.stats.replays == replays + 3

    def test_a_pure_hook_removed(self):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # (old-style weight_norm is deprecated)
            net = torch.nn.utils.weight_norm(nn.Linear(3, 3))
        g = CudaGraphModule(net, warmup=1, backend="simulate")
        _calls(g)
        torch.nn.utils.remove_weight_norm(net)
        with torch.no_grad(), pytest.raises(StaleGraphError, match=r"module: forward pre-hook 'WeightNorm' "
                                                                    r"\(register_forward_pre_hook\): removed"):
            g(X)


def _weight_norm():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return torch.nn.utils.weight_norm(nn.Linear(3, 3))


def _spectral_norm():
    return torch.nn.utils.spectral_norm(nn.Linear(3, 3))


def _pruned():
    lin = nn.Linear(3, 3)
    prune.l1_unstructured(lin, "weight", amount=0.5)
    return lin


class TestPureHooks:
    """torch's own hooks that compute a weight from parameters are recorded by the capture."""

    @pytest.mark.parametrize("make", [_weight_norm, _spectral_norm, _pruned], ids=["weight_norm", "spectral_norm",
                                                                                  "prune"])
    @pytest.mark.parametrize("grad", [False, True])
    def test_served_as_eagerly(self, graph_backend, make, grad):
        torch.manual_seed(0)
        net = make()
        torch.manual_seed(0)
        twin = make()
        g = CudaGraphModule(net, warmup=1, backend=graph_backend)
        with torch.set_grad_enabled(grad):
            for i in range(5):
                x = torch.full((2, 3), 0.1 * i)
                torch.testing.assert_close(g(x), twin(x))
        assert g.stats.captures == 1

    @pytest.mark.parametrize("make", [_weight_norm, _spectral_norm, _pruned], ids=["weight_norm", "spectral_norm",
                                                                                  "prune"])
    def test_backpropagated_through_as_eagerly(self, graph_backend, make):
        # the weight computed when the hook was applied (in grad mode, on the default stream)
        # holds the parameters' gradient accumulators: the capture's backward must not use them
        torch.manual_seed(0)
        net = make()
        torch.manual_seed(0)
        twin = make()
        g = CudaGraphModule(net, warmup=1, backend=graph_backend)
        for i in range(5):
            x = torch.full((2, 3), 0.1 * i)
            net.zero_grad()
            twin.zero_grad()
            g(x).pow(2).sum().backward()
            twin(x).pow(2).sum().backward()
            for (name, p), q in zip(net.named_parameters(), twin.parameters()):
                torch.testing.assert_close(p.grad, q.grad, msg=f"{name}, call {i}")
        assert g.stats.captures == 1 and g.stats.replays == 4

    def test_a_refused_call_leaves_the_hooks_weight_alone(self, graph_backend):
        # the kept weight is detached before a warmup call or a capture, not before a call the
        # wrapper refuses: a refused call has no effect
        net = _weight_norm()
        g = CudaGraphModule(net, warmup=1, backend=graph_backend)
        for _ in range(3):
            g(torch.ones(2, 3)).sum().backward()
        weight = net.weight
        with pytest.raises(InputMismatchError):
            g(torch.ones(4, 3))
        assert net.weight is weight

    def test_select_out_keys(self, graph_backend, ones):
        module = TensorDictModule(nn.Linear(3, 3), in_keys=["x"], out_keys=["y", ]).select_out_keys("y")
        g = CudaGraphModule(module, warmup=1, backend=graph_backend)
        with torch.no_grad():
            for i in range(4):
                td = TensorDict(x=ones + i, batch_size=[2])
                assert sorted(g(td).keys()) == ["x", "y"]
        assert g.stats.captures == 1
