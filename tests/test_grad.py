"""Graphs as layers: gradients through the captured graph, against the plain module as oracle.

Every test runs a graphed block inside an eager model beside an identical eager copy and
compares losses, gradients of inputs and parameters, and parameters after optimizer steps.
Tests taking ``graph_backend`` run on simulated replays here and on real CUDA graphs (forward
and backward captured) with ``-m cuda`` on a GPU.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

from graphmodule import (
    CudaGraphModule,
    GraphStateError,
    InputMismatchError,
    RequiresGradError,
    UnsupportedError,
)


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


class Model(nn.Module):
    """pre (eager) -> block (graphed) -> post (eager)."""

    def __init__(self, width=4, hidden=8, out=1):
        super().__init__()
        self.pre = nn.Linear(3, width)
        self.block = nn.Sequential(nn.Linear(width, hidden), nn.Tanh(), nn.Linear(hidden, width))
        self.post = nn.Linear(width, out)


def _pair(seed=0, **sizes):
    torch.manual_seed(seed)
    model = Model(**sizes)
    return model, copy.deepcopy(model)


def _check_grads(model, twin):
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            _close(p.grad, q.grad)


def _train(model, twin, g, steps=6, batch=5, opt=torch.optim.Adam, zero=True, x_leaf=False):
    """The graphed block inside an eager training loop, beside the eager twin."""
    opt_g, opt_e = opt(model.parameters(), lr=1e-2), opt(twin.parameters(), lr=1e-2)
    for _ in range(steps):
        x = torch.randn(batch, 3, requires_grad=x_leaf)
        x_e = x.detach().clone().requires_grad_(x_leaf)
        if zero:
            opt_g.zero_grad()
            opt_e.zero_grad()
        loss = model.post(g(model.pre(x))).pow(2).mean()
        loss_e = twin.post(twin.block(twin.pre(x_e))).pow(2).mean()
        loss.backward()
        loss_e.backward()
        _close(loss, loss_e)
        _check_grads(model, twin)
        if x_leaf:
            _close(x.grad, x_e.grad)
        opt_g.step()
        opt_e.step()
    for p, q in zip(model.parameters(), twin.parameters()):
        _close(p, q)


class TestGradientsEqualEager:
    def test_block_in_an_eager_training_loop(self, make, graph_backend):
        model, twin = _pair()
        g = make(model.block, backend=graph_backend)
        _train(model, twin, g, steps=8)
        assert g.state == "captured"
        assert g.stats.captures == 1 and g.stats.replays == 6

    @pytest.mark.parametrize("outputs", ["clone", "static", "safe"])
    def test_every_outputs_mode(self, make, graph_backend, outputs):
        model, twin = _pair(1)
        g = make(model.block, outputs=outputs, backend=graph_backend)
        _train(model, twin, g, steps=6, opt=torch.optim.SGD)

    def test_leaf_input_gets_its_gradient(self, make, graph_backend):
        torch.manual_seed(0)
        block = nn.Sequential(nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, 2))
        oracle = copy.deepcopy(block)
        g = make(block, warmup=1, backend=graph_backend)
        for _ in range(4):
            x = torch.randn(4, 3, requires_grad=True)
            x_e = x.detach().clone().requires_grad_()
            block.zero_grad()
            oracle.zero_grad()
            g(x).sum().backward()
            oracle(x_e).sum().backward()
            _close(x.grad, x_e.grad)
            for p, e in zip(block.parameters(), oracle.parameters()):
                _close(e.grad, p.grad)

    def test_parameters_also_used_eagerly_get_both_gradients(self, make, graph_backend):
        # the block's parameters used outside it too (tied weights): autograd accumulates the
        # graph's gradients and the eager ones. On CUDA the parameters' AccumulateGrad nodes
        # live on the capture's stream, so torch may warn of a stream mismatch (a stream
        # synchronisation, not a wrong gradient): allowed here, see the README
        torch.manual_seed(0)
        block = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
        oracle = copy.deepcopy(block)
        g = make(block, warmup=1, backend=graph_backend)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The AccumulateGrad node's stream does not match")
            for _ in range(4):
                x = torch.randn(4, 3)
                block.zero_grad()
                oracle.zero_grad()
                (g(x) + block(x)).pow(2).sum().backward()
                (oracle(x) + oracle(x)).pow(2).sum().backward()
                for p, e in zip(block.parameters(), oracle.parameters()):
                    _close(e.grad, p.grad)

    def test_gradients_accumulate_into_grad_across_backwards(self, make, graph_backend):
        # two micro-batches per step, .grad never set to None: the graph's gradient buffers
        # must not become .grad (the next backward would overwrite and double them)
        model, twin = _pair(2)
        g = make(model.block, backend=graph_backend)
        opt_g = torch.optim.SGD(model.parameters(), lr=1e-2)
        opt_e = torch.optim.SGD(twin.parameters(), lr=1e-2)
        for _ in range(5):
            opt_g.zero_grad(set_to_none=False)
            opt_e.zero_grad(set_to_none=False)
            for _ in range(2):
                x = torch.randn(5, 3)
                model.post(g(model.pre(x))).pow(2).mean().backward()
                twin.post(twin.block(twin.pre(x))).pow(2).mean().backward()
            _check_grads(model, twin)
            opt_g.step()
            opt_e.step()

    def test_only_parameters_require_grad(self, make, graph_backend):
        model, twin = _pair(3)
        g = make(model.block, backend=graph_backend)
        model.pre.requires_grad_(False)
        twin.pre.requires_grad_(False)
        for _ in range(5):
            x = torch.randn(5, 3)
            with torch.no_grad():
                h = model.pre(x)
            model.zero_grad()
            twin.zero_grad()
            model.post(g(h)).sum().backward()
            twin.post(twin.block(h)).sum().backward()
            _check_grads(model, twin)

    def test_autograd_grad_with_respect_to_the_input(self, make, graph_backend):
        torch.manual_seed(4)
        block = nn.Sequential(nn.Linear(3, 5), nn.Sigmoid())
        g = make(block, warmup=1, backend=graph_backend)
        for _ in range(4):
            x = torch.randn(2, 3, requires_grad=True)
            (got,) = torch.autograd.grad(g(x).pow(2).sum(), x)
            (expected,) = torch.autograd.grad(block(x).pow(2).sum(), x)
            _close(got, expected)

    def test_several_outputs_some_unused_or_without_grad(self, make, graph_backend):
        torch.manual_seed(5)
        lin = nn.Linear(3, 3)

        def f(x, scale):
            h = lin(x)
            return {"h": h * scale, "aux": h.sum(-1), "count": (x > 0).sum()}

        g = make(f, warmup=1, backend=graph_backend)
        for n in range(4):
            x = torch.randn(4, 3, requires_grad=True)
            scale = torch.full((1,), 2.0 + n)
            out = g(x, scale=scale)
            assert not out["count"].requires_grad
            lin.zero_grad()
            out["h"].sum().backward()  # "aux" unused: its gradient is zero
            got = [x.grad.clone(), *(p.grad.clone() for p in lin.parameters())]
            x.grad = None
            lin.zero_grad()
            f(x, scale)["h"].sum().backward()
            for a, b in zip(got, [x.grad, *(p.grad for p in lin.parameters())]):
                _close(a, b)

    def test_tensordict_module_with_keys(self, make, graph_backend):
        torch.manual_seed(6)
        net = nn.Sequential(nn.Linear(3, 4), nn.Tanh())
        module = TensorDictModule(net, in_keys=["obs"], out_keys=["hidden"])
        twin = copy.deepcopy(net)
        encoder = nn.Linear(2, 3)
        g = make(module, warmup=1, backend=graph_backend)
        for _ in range(4):
            raw = torch.randn(5, 2)
            td = TensorDict(obs=encoder(raw), batch_size=[5])
            net.zero_grad()
            twin.zero_grad()
            encoder.zero_grad()
            out = g(td)
            assert out is td
            td["hidden"].pow(2).sum().backward()
            got = [p.grad.clone() for p in [*net.parameters(), *encoder.parameters()]]
            encoder.zero_grad()
            twin(encoder(raw)).pow(2).sum().backward()
            for a, b in zip(got, [*twin.parameters(), *encoder.parameters()]):
                _close(a, b.grad)

    def test_keyword_call_of_a_tensordict_module(self, make, graph_backend):
        torch.manual_seed(7)
        net = nn.Linear(3, 2)
        g = make(TensorDictModule(net, in_keys=["obs"], out_keys=["act"]), warmup=1, backend=graph_backend)
        for _ in range(3):
            obs = torch.randn(4, 3, requires_grad=True)
            net.zero_grad()
            g(obs=obs).sum().backward()
            got = obs.grad.clone(), net.weight.grad.clone()
            obs.grad = None
            net.zero_grad()
            net(obs).sum().backward()
            _close(got[0], obs.grad)
            _close(got[1], net.weight.grad)

    def test_backward_twice_with_retain_graph_accumulates(self, make, graph_backend):
        torch.manual_seed(8)
        block = nn.Linear(3, 3)
        g = make(block, warmup=1, backend=graph_backend)
        g(torch.randn(2, 3)).sum().backward()
        x = torch.randn(2, 3)
        block.zero_grad()
        y = g(x)
        y.pow(2).sum().backward(retain_graph=True)
        y.sum().backward()
        got = block.weight.grad.clone()
        block.zero_grad()
        y = block(x)
        y.pow(2).sum().backward(retain_graph=True)
        y.sum().backward()
        _close(got, block.weight.grad)

    def test_parameter_hooks_run_once_per_backward(self, make, graph_backend):
        torch.manual_seed(9)
        block = nn.Linear(3, 2)
        twin = copy.deepcopy(block)
        calls = []
        block.weight.register_hook(lambda grad: calls.append(1) or grad * 3)
        twin.weight.register_hook(lambda grad: grad * 3)
        g = make(block, warmup=1, backend=graph_backend)
        for n in range(4):
            x = torch.randn(2, 3)
            block.zero_grad()
            twin.zero_grad()
            g(x).sum().backward()
            twin(x).sum().backward()
            _close(block.weight.grad, twin.weight.grad)
            assert len(calls) == n + 1

    def test_input_gradient_kept_by_a_hook_is_not_overwritten(self, make, graph_backend):
        block = nn.Linear(3, 3)
        g = make(block, warmup=1, backend=graph_backend)
        kept = []
        for n in range(4):
            x = torch.randn(2, 3, requires_grad=True)
            h = x * 1.0
            h.register_hook(lambda grad: kept.append(grad))
            (g(h) * (n + 1)).sum().backward()
        for n, grad in enumerate(kept):
            _close(grad, (n + 1) * block.weight.sum(0).expand(2, 3))

    def test_explain_states_the_layer(self, make):
        model, _ = _pair()
        g = make(model.block, warmup=1)
        for _ in range(2):
            model.post(g(model.pre(torch.randn(5, 3)))).sum().backward()
        text = g.explain()
        assert ("gradients: a forward and a backward graph (a layer); backward reaches args[0], "
                "module.0.weight, module.0.bias, module.2.weight and 1 more") in text


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    batch=st.integers(1, 4),
    width=st.integers(1, 5),
    hidden=st.integers(1, 6),
    warmup=st.integers(1, 3),
    outputs=st.sampled_from(["clone", "static", "safe"]),
    block_input_grad=st.booleans(),
    side_input=st.sampled_from(["none", "leaf", "detached"]),
    use_aux=st.booleans(),
    optimizer=st.sampled_from(["sgd", "adam"]),
    seed=st.integers(0, 2**16),
)
def test_fuzz_gradients_equal_eager(batch, width, hidden, warmup, outputs, block_input_grad, side_input, use_aux,
                                    optimizer, seed):
    torch.manual_seed(seed)
    model = Model(width, hidden)
    twin = copy.deepcopy(model)

    def block_of(m):
        def f(h, *, side=None):
            out = m.block(h)
            aux = out.sum(-1, keepdim=True) if side is None else out * side
            return out, {"aux": aux}
        return f

    g = CudaGraphModule(block_of(model), warmup=warmup, outputs=outputs, backend="simulate")
    eager = block_of(twin)
    opt_cls = torch.optim.SGD if optimizer == "sgd" else torch.optim.Adam
    opt_g, opt_e = opt_cls(model.parameters(), lr=1e-2), opt_cls(twin.parameters(), lr=1e-2)
    for _ in range(warmup + 4):
        x = torch.randn(batch, 3)
        side = torch.randn(batch, width)
        sides = [None, None] if side_input == "none" else [side.clone(), side.clone()]
        if side_input == "leaf":
            for s in sides:
                s.requires_grad_()
        results = []
        for m, fn, s in ((model, g, sides[0]), (twin, eager, sides[1])):
            h = m.pre(x) if block_input_grad else m.pre(x).detach()
            out, extra = fn(h, side=s) if s is not None else fn(h)
            loss = m.post(out).pow(2).mean() + (extra["aux"].pow(2).mean() if use_aux else 0)
            loss.backward()
            results.append(loss.detach())
        _close(results[0], results[1])
        _check_grads(model, twin)
        if side_input == "leaf":
            _close(sides[0].grad, sides[1].grad)
        opt_g.step()
        opt_e.step()
        opt_g.zero_grad()
        opt_e.zero_grad()
    assert g.state == "captured"


class TestSignature:
    def _captured(self, make, block, x, **options):
        g = make(block, warmup=1, **options)
        for _ in range(2):
            g(x).sum().backward()
        assert g.state == "captured"
        return g

    def test_input_requires_grad_mismatch_is_an_error(self, make):
        g = self._captured(make, nn.Linear(3, 2), torch.randn(2, 3, requires_grad=True))
        with pytest.raises(RequiresGradError) as info:
            g(torch.randn(2, 3))
        assert str(info.value).splitlines()[:2] == [
            "CudaGraphModule(Linear) was captured with other inputs than this call's (1 mismatch):",
            "  args[0]: expected requires_grad True, got False",
        ]
        assert "part of the capture" in str(info.value) and "max_graphs=2" in str(info.value)
        g(torch.randn(2, 3, requires_grad=True)).sum().backward()  # still usable

    def test_max_graphs_keeps_a_graph_per_requires_grad_pattern(self, make, graph_backend):
        torch.manual_seed(0)
        block = nn.Linear(3, 2)
        g = make(block, warmup=1, max_graphs=2, backend=graph_backend)
        for _ in range(3):
            for rg in (True, False):
                x = torch.randn(2, 3, requires_grad=rg)
                block.zero_grad()
                g(x).sum().backward()
                expected = x.grad.clone() if rg else None
                got_w = block.weight.grad.clone()
                block.zero_grad()
                x.grad = None
                block(x).sum().backward()
                _close(got_w, block.weight.grad)
                if rg:
                    _close(expected, x.grad)
        assert g.stats.graphs == 2

    def test_two_graphs_of_one_wrapper_both_pending_backward(self, make, graph_backend):
        # graphs of one wrapper: the second's activations must not lie where the first writes
        torch.manual_seed(1)
        block = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 3))
        twin = copy.deepcopy(block)
        g = make(block, warmup=1, max_graphs=2, backend=graph_backend)
        for _ in range(4):
            xs = [torch.randn(8, 3, requires_grad=True), torch.randn(5, 3, requires_grad=True)]
            copies = [x.detach().clone().requires_grad_() for x in xs]
            block.zero_grad()
            twin.zero_grad()
            sum(g(x).pow(2).sum() for x in xs).backward()  # both forwards, then both backwards
            sum(twin(x).pow(2).sum() for x in copies).backward()
            for x, c in zip(xs, copies):
                _close(x.grad, c.grad)
            for p, q in zip(block.parameters(), twin.parameters()):
                _close(p.grad, q.grad)
        assert g.stats.graphs == 2

    def test_parameter_frozen_after_capture_gets_no_gradient(self, make, graph_backend):
        torch.manual_seed(0)
        block = nn.Linear(3, 2)
        g = make(block, warmup=1, backend=graph_backend)
        for _ in range(2):
            g(torch.randn(2, 3)).sum().backward()
        block.zero_grad(set_to_none=True)
        block.weight.requires_grad_(False)
        x = torch.randn(2, 3)
        g(x).sum().backward()
        assert block.weight.grad is None
        _close(block.bias.grad, torch.full((2,), 2.0))
        block.weight.requires_grad_(True)
        g(x).sum().backward()
        _close(block.weight.grad, x.sum(0).expand(2, 3))

    def test_unfrozen_parameter_after_capture_is_an_error(self, make):
        block = nn.Linear(3, 2)
        block.bias.requires_grad_(False)
        g = self._captured(make, block, torch.randn(2, 3))
        block.bias.requires_grad_(True)
        with pytest.raises(InputMismatchError) as info:
            g(torch.randn(2, 3))
        assert "module.bias: expected requires_grad False, got True" in str(info.value)

    def test_call_under_no_grad_is_a_grad_mode_mismatch(self, make):
        g = self._captured(make, nn.Linear(3, 2), torch.randn(2, 3), max_graphs=1)
        with torch.no_grad(), pytest.raises(InputMismatchError) as info:
            g(torch.randn(2, 3))
        assert [m.kind for m in info.value.mismatches] == ["grad_mode"]

    def test_by_default_a_call_under_no_grad_has_a_plain_graph_of_its_own(self, make):
        block = nn.Linear(3, 2)
        g = self._captured(make, block, torch.randn(2, 3))
        with torch.no_grad():
            for _ in range(3):
                x = torch.randn(2, 3)
                out = g(x)
                assert not out.requires_grad
                torch.testing.assert_close(out, block(x))
        assert g.stats.graphs == 2

    def test_input_requiring_grad_under_no_grad_is_a_plain_graph(self, make):
        block = nn.Linear(3, 2)
        g = make(block, warmup=1)
        with torch.no_grad():
            for _ in range(3):
                x = torch.randn(2, 3, requires_grad=True)
                out = g(x)
                assert not out.requires_grad
                _close(out, block(x))
        assert "gradients" not in g.explain()


def _x():
    return torch.randn(2, 3, requires_grad=True)


def _train_step(detach: bool):
    lin = nn.Linear(3, 1)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)

    def step(x):
        opt.zero_grad()
        loss = lin(x).pow(2).mean()
        loss.backward()
        opt.step()
        return loss.detach() if detach else loss

    return step


_DOUBLE = (
    "CudaGraphModule(Sequential) cannot backpropagate with create_graph=True: expected a first-order "
    "backward, got create_graph=True at the graph's outputs; the backward graph replays fixed kernels, "
    "which autograd cannot differentiate again: compute higher-order gradients with the module itself, "
    "unwrapped."
)
_OVERWRITTEN = (
    "CudaGraphModule(Sequential) cannot backpropagate through the result of an earlier call: expected "
    "that call's activations (replay 2 of the graph), got those of a later call (replay 3, which "
    "overwrote them) at the graph's saved activations; call backward before calling the wrapper again, "
    "or use one CudaGraphModule per use of the block in a step."
)


class TestRefused:
    def _layer(self, make, **options):
        torch.manual_seed(0)
        block = nn.Sequential(nn.Linear(3, 3), nn.Sigmoid())
        g = make(block, warmup=1, **options)
        for _ in range(2):
            g(_x()).sum().backward()
        return block, g

    def _usable(self, g, block):
        x = _x()
        block.zero_grad()
        g(x).sum().backward()
        got = x.grad.clone(), block[0].weight.grad.clone()
        x.grad = None
        block.zero_grad()
        block(x).sum().backward()
        _close(got[0], x.grad)
        _close(got[1], block[0].weight.grad)

    def _refused(self, g, block, backward, message):
        """``backward()`` raises a GraphStateError with ``message``; the wrapper works after."""
        with pytest.raises(GraphStateError) as info:
            backward()
        assert str(info.value) == message
        self._usable(g, block)

    def test_double_backward(self, make, graph_backend):
        block, g = self._layer(make, backend=graph_backend)
        x = _x()
        self._refused(g, block, lambda: torch.autograd.grad(g(x).sum(), x, create_graph=True), _DOUBLE)

    def test_second_backward_without_retain_graph(self, make, graph_backend):
        block, g = self._layer(make, backend=graph_backend)
        y = g(_x())
        y.sum().backward()
        with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
            y.sum().backward()
        self._usable(g, block)

    def test_backward_after_a_later_call(self, make, graph_backend):
        block, g = self._layer(make, outputs="clone", backend=graph_backend)
        first = g(_x())
        second = g(_x())
        self._refused(g, block, lambda: (first.sum() + second.sum()).backward(), _OVERWRITTEN)

    def test_two_calls_then_one_backward_with_lent_outputs(self, make, graph_backend):
        # outputs="safe" (the default): the first call's results are held, so the second call
        # replays a twin, with activations of its own: one backward through both is eager's
        block, g = self._layer(make, backend=graph_backend)
        oracle = copy.deepcopy(block)
        xs = [_x(), _x()]
        block.zero_grad()
        first, second = g(xs[0]), g(xs[1])
        (first.sum() + second.sum()).backward()
        (oracle(xs[0]).sum() + oracle(xs[1]).sum()).backward()
        for p, e in zip(block.parameters(), oracle.parameters()):
            _close(e.grad, p.grad)

    def test_backward_after_reset(self, make, graph_backend):
        block, g = self._layer(make, backend=graph_backend)
        y = g(_x())
        g.reset()
        with pytest.raises(GraphStateError, match="expected the graph that produced it, got none"):
            y.sum().backward()
        for _ in range(2):
            self._usable(g, block)

    def test_static_output_written_before_backward(self, make, graph_backend):
        # sigmoid's backward reads its output: the graph's buffer, with outputs="static"
        block, g = self._layer(make, outputs="static", backend=graph_backend)
        y = g(_x())
        y.mul_(2)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()
        self._usable(g, block)

    def test_cloned_output_may_be_written_before_backward(self, make, graph_backend):
        block, g = self._layer(make, outputs="clone", backend=graph_backend)
        x = _x()
        block.zero_grad()
        y = g(x)
        y.add_(1)
        y.sum().backward()
        got = block[0].weight.grad.clone()
        block.zero_grad()
        block(x).sum().backward()
        _close(got, block[0].weight.grad)

    def test_parameter_written_between_forward_and_backward(self, make, graph_backend):
        block, g = self._layer(make, backend=graph_backend)
        y = g(_x())
        with torch.no_grad():
            block[0].weight.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()
        self._usable(g, block)

    def test_module_backward_hook_at_capture(self, make):
        torch.manual_seed(0)
        block = nn.Sequential(nn.Linear(3, 3), nn.Sigmoid())
        handle = block[1].register_full_backward_hook(lambda m, gi, go: None)
        g = make(block, warmup=1)
        g(_x()).sum().backward()
        with pytest.raises(UnsupportedError) as info:
            g(_x())
        # a layer's backward replays apart from the capture: its module hooks cannot be judged
        assert str(info.value) == (
            "CudaGraphModule(Sequential) cannot replay this call as a CUDA graph: module.1 has 1 module backward "
            "hook, which a replay would not run (a replay runs no Python).\nTo fix: register the hook on a module "
            "outside the wrapped block, or hook the parameters' gradients (p.register_hook), which run eagerly at "
            "every backward."
        )
        handle.remove()
        self._usable(g, block)
        assert g.state == "captured"

    def test_module_backward_hook_added_after_capture(self, make):
        block, g = self._layer(make)
        handle = block[0].register_full_backward_hook(lambda m, gi, go: None)
        with pytest.raises(InputMismatchError) as info:
            g(_x())
        assert "  module.0: expected hook none, got 1 module backward hook" in str(info.value)
        handle.remove()
        self._usable(g, block)

    def test_input_requiring_grad_passed_twice(self, make):
        g = make(lambda a, b: a * b, warmup=1)
        x = torch.randn(3, requires_grad=True)
        g(x, x)
        with pytest.raises(UnsupportedError, match="args\\[0\\] requires grad and shares memory with another input"):
            g(x, x)

    def test_tensor_requiring_grad_computed_outside_the_call(self, make):
        lin = nn.Linear(3, 3)
        h = lin(torch.randn(3))  # requires grad, not an argument
        g = make(lambda x: x * h, warmup=1)
        g(torch.randn(3))
        with pytest.raises(UnsupportedError, match="was computed before the call, without receiving it"):
            g(torch.randn(3))

    def test_train_step_given_inputs_that_require_grad(self, make):
        g = make(_train_step(detach=True), warmup=1)
        g(torch.randn(4, 3, requires_grad=True))
        with pytest.raises(RequiresGradError) as info:
            g(torch.randn(4, 3, requires_grad=True))
        assert str(info.value).splitlines() == [
            "CudaGraphModule(step) was captured as a train step (the function runs backward itself) "
            "with other inputs than this call's (1 mismatch):",
            "  args[0]: expected requires_grad False, got True",
            "To fix: the function runs backward itself (a train step), and a replay cannot extend that "
            "backward to the tensors you pass: pass x.detach() (the step's gradients stop at its inputs), "
            "or compute the loss outside the wrapped function (the wrapped block then backpropagates as "
            "a layer).",
        ]
        for _ in range(2):  # detached inputs: another signature, its warmup call, then captured as a train step
            g(torch.randn(4, 3))
        assert g.state == "captured"

    def test_train_step_returning_its_loss_refuses_backward(self, make, graph_backend):
        g = make(_train_step(detach=False), warmup=1, backend=graph_backend)
        for _ in range(3):
            loss = g(torch.randn(4, 3))
        assert loss.requires_grad
        with pytest.raises(RuntimeError, match="gradients cannot flow back through a CUDA graph replay"):
            loss.backward()


@pytest.mark.cuda
class TestCuda:
    """Real CUDA graphs: forward and backward captured."""

    def test_the_wrapper_holds_a_cuda_graph(self, cuda):
        torch.manual_seed(0)
        block = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8)).to(cuda)
        g = CudaGraphModule(block, warmup=2)
        x = torch.randn(16, 8, device=cuda, requires_grad=True)
        for _ in range(3):
            g(x).sum().backward()
        assert isinstance(g.graph, torch.cuda.CUDAGraph)
        assert g.stats.captures == 1 and g.stats.graph_bytes[0] >= 0

    def test_backward_replays_without_autograd_of_the_block(self, cuda):
        # after capture, a Python autograd.Function inside the block would run in backward
        # eagerly; replayed, its backward is never called again
        calls = []

        class Traced(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, grad):
                calls.append(1)
                return grad * 2

        lin = nn.Linear(4, 4).to(cuda)
        g = CudaGraphModule(lambda x: Traced.apply(lin(x)), warmup=1)
        x = torch.randn(2, 4, device=cuda)
        g(x).sum().backward()
        assert len(calls) == 1  # warmup, eagerly
        g(x).sum().backward()  # capture: one eager warm backward, one captured
        captured = len(calls)
        for _ in range(3):
            lin.zero_grad()
            g(x).sum().backward()
            torch.testing.assert_close(lin.weight.grad, 2 * torch.ones(4, 1, device=cuda) * x.sum(0))
        assert len(calls) == captured

    def test_calls_on_a_side_stream(self, cuda):
        torch.manual_seed(0)
        model = Model().to(cuda)
        twin = copy.deepcopy(model)
        g = CudaGraphModule(model.block)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(5):
                x = torch.randn(64, 3, device=cuda)
                model.zero_grad()
                twin.zero_grad()
                model.post(g(model.pre(x))).pow(2).mean().backward()
                twin.post(twin.block(twin.pre(x))).pow(2).mean().backward()
                _check_grads(model, twin)
        torch.cuda.current_stream().wait_stream(stream)

    def test_larger_block_with_dropout_in_eval_and_layernorm(self, cuda):
        torch.manual_seed(0)
        block = nn.Sequential(nn.Linear(64, 256), nn.LayerNorm(256), nn.GELU(), nn.Dropout(0.1),
                              nn.Linear(256, 64)).to(cuda).eval()
        twin = copy.deepcopy(block)
        g = CudaGraphModule(block)
        opt_g = torch.optim.Adam(block.parameters(), lr=1e-3)
        opt_e = torch.optim.Adam(twin.parameters(), lr=1e-3)
        for _ in range(10):
            x = torch.randn(128, 64, device=cuda, requires_grad=True)
            x_e = x.detach().clone().requires_grad_()
            opt_g.zero_grad()
            opt_e.zero_grad()
            g(x).pow(2).mean().backward()
            twin(x_e).pow(2).mean().backward()
            _close(x.grad, x_e.grad)
            for p, q in zip(block.parameters(), twin.parameters()):
                _close(p.grad, q.grad)
            opt_g.step()
            opt_e.step()


class TestCompiledLayer:
    """A ``torch.compile``'d module used as a graphed layer. Its backward may free the
    activations it saved (AOTAutograd's donated buffers), which a backward captured once and
    replayed cannot allow: refused at capture naming the cause and the fix, or served."""

    @staticmethod
    def _compiled():
        import torch._dynamo

        torch._dynamo.reset()
        torch.manual_seed(0)
        block = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        return block, copy.deepcopy(block), torch.compile(block, backend="aot_eager")

    def test_donated_buffers_are_refused_at_capture(self, graph_backend):
        if graph_backend == "simulate":
            pytest.skip("backend='simulate' records a compiled function's eager code (torch.compile runs "
                        "the original frame under a dispatch mode): its backward frees no buffer")
        block, _, compiled = self._compiled()
        g = CudaGraphModule(compiled, warmup=2, backend=graph_backend)
        x = torch.randn(3, 4)
        for _ in range(2):
            g(x).sum().backward()
        for _ in range(2):  # refused at the capture, and again at the next call: no raw error
            with pytest.raises(UnsupportedError, match=(
                r"^CudaGraphModule\(Sequential\) cannot replay this call as a CUDA graph: .*torch\.compile.*"
                r"donated buffers.*\nTo fix: .*torch\._functorch\.config\.donated_buffer = False")):
                g(x)
        assert g.state == "warmup"

    def test_without_donated_buffers_gradients_equal_eager(self, graph_backend, monkeypatch):
        # the fix the refusal gives: compiled without donated buffers, the layer is served
        monkeypatch.setattr(torch._functorch.config, "donated_buffer", False)
        block, twin, compiled = self._compiled()
        g = CudaGraphModule(compiled, warmup=2, backend=graph_backend)
        for i in range(5):
            x = torch.randn(3, 4)
            block.zero_grad()
            twin.zero_grad()
            out, want = g(x), twin(x)
            (out * (i + 1)).sum().backward()
            (want * (i + 1)).sum().backward()
            _close(out, want)
            _check_grads(block, twin)
        assert g.state == "captured"
