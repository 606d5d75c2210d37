"""The simulated graph (``backend="simulate"``): a replay runs the tensor operations the capture
recorded, on the same memory, and no Python, as a CUDA graph's replay does.

Each test runs one body on the simulator and, on a GPU, on real CUDA graphs (``graph_backend``),
and compares with the plain function on fresh copies of the state.
"""

import copy
import itertools
import weakref

import pytest
import torch
from torch import nn

from graphmodule import CaptureError, CudaGraphModule
from graphmodule._runner_simulate import SimulatedRunner


def _twins(module: nn.Module) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    return module, copy.deepcopy(module)


class TestReplayRunsNoPython:
    def test_the_function_body_runs_at_warmup_and_capture_only(self, graph_backend):
        calls = itertools.count()

        def fn(x):
            next(calls)  # (an iterator the watch does not see: the function runs it unrefused)
            return x * 2 + 1

        g = CudaGraphModule(fn, warmup=1, backend=graph_backend)
        for i in range(5):
            x = torch.full((3,), float(i))
            torch.testing.assert_close(g(x), x * 2 + 1)
        assert next(calls) == 2 and g.stats.replays == 4  # (the capturing call counts as a replay)

    @pytest.mark.xfail(strict=True, reason="an element of a list read through an object's attribute is not "
                       "watched: a replay keeps the capture's value (on CUDA as on the simulator)")
    def test_a_python_value_changed_since_the_capture(self, graph_backend):
        class Scale:
            def __init__(self):
                self.values = [1.0]

        scale = Scale()
        fn = lambda x: x * scale.values[0]  # noqa: E731
        g = CudaGraphModule(fn, warmup=1, backend=graph_backend)
        x = torch.ones(2)
        g(x)
        g(x)  # captured with 1.0
        scale.values[0] = 5.0
        torch.testing.assert_close(g(x), fn(x))


class TestOperations:
    def test_in_place_writes_into_state_replay(self, graph_backend):
        state, twin = torch.zeros(3), torch.zeros(3)

        def step(buf):
            def fn(x):
                buf.add_(x)
                return buf * 2

            return fn

        g, plain = CudaGraphModule(step(state), warmup=1, backend=graph_backend), step(twin)
        for i in range(4):
            x = torch.arange(3.0) + i
            torch.testing.assert_close(g(x), plain(x))
            torch.testing.assert_close(state, twin)
        assert g.stats.replays == 3

    def test_a_cast_that_may_alias_is_replayed_where_it_copied(self):
        """Under inference mode, autocast's casts reach the recorder as ``aten::to``, whose schema
        says its result may alias its input: where it copied, the replay casts the new input
        (it replayed the capture's cast values)."""
        torch.manual_seed(0)
        m = nn.Linear(2, 2)
        g = CudaGraphModule(m, warmup=1, backend="simulate")
        with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16, cache_enabled=False):
            for _ in range(4):
                x = torch.randn(3, 2)
                assert torch.equal(g(x), m(x))
        assert g.stats.replays == 3

    def test_views_and_writes_through_them(self, graph_backend):
        def fn(x):
            h = x + 1
            v = h.t()
            v[0].mul_(3)  # writes through a view into h's memory
            return h, v[1:]

        g = CudaGraphModule(fn, warmup=1, backend=graph_backend)
        for i in range(4):
            x = torch.arange(6.0).reshape(2, 3) * (i + 1)
            out, want = g(x), fn(x)
            for a, b in zip(out, want):
                torch.testing.assert_close(a, b)
            assert out[1].shape == want[1].shape and out[1].stride() == want[1].stride()

    def test_factories_are_made_again_at_each_replay(self, graph_backend):
        def fn(x):
            acc = torch.zeros(3)
            acc += x  # into a tensor the function made: zeros again at every replay
            return acc + torch.arange(3) + torch.full((3,), 2.0) + torch.ones(3).cumsum(0)

        g = CudaGraphModule(fn, warmup=1, backend=graph_backend)
        for i in range(4):
            x = torch.full((3,), float(i))
            torch.testing.assert_close(g(x), fn(x))

    def test_random_operations_draw_fresh_numbers_at_each_replay(self, graph_backend):
        g = CudaGraphModule(lambda x: x + torch.randn_like(x), warmup=1, backend=graph_backend)
        x = torch.zeros(64)
        outs = [g(x) for _ in range(4)]
        assert g.stats.replays == 3
        assert not torch.equal(outs[2], outs[3]) and not torch.equal(outs[1], outs[2])

    def test_dropout_draws_a_fresh_mask_at_each_replay(self, graph_backend):
        drop = nn.Dropout(0.5).train()
        g = CudaGraphModule(drop, warmup=1, backend=graph_backend)
        x = torch.ones(256)
        outs = [g(x) for _ in range(4)]
        masks = [o != 0 for o in outs[2:]]
        assert not torch.equal(masks[0], masks[1])
        for o in outs:  # kept values scaled by 1 / (1 - p), as eagerly
            assert set(o.unique().tolist()) <= {0.0, 2.0}

    def test_a_backward_inside_the_function_is_replayed(self, graph_backend):
        net, twin = _twins(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)))

        def train(model):
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

            def step(x, y):
                loss = (model(x) - y).pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=False)
                return loss.detach()

            return step

        g, plain = CudaGraphModule(train(net), warmup=1, backend=graph_backend), train(twin)
        for i in range(5):
            x, y = torch.randn(6, 4), torch.randn(6, 1)
            torch.testing.assert_close(g(x, y), plain(x, y))
            for p, q in zip(net.parameters(), twin.parameters()):
                torch.testing.assert_close(p, q)
        assert g.stats.replays == 4

    def test_a_layers_gradients_come_from_the_recorded_backward(self, graph_backend):
        net, twin = _twins(nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2)))
        g = CudaGraphModule(net, warmup=1, backend=graph_backend)
        for i in range(4):
            x = torch.randn(4, 3, requires_grad=True)
            x2 = x.detach().clone().requires_grad_(True)
            net.zero_grad()
            twin.zero_grad()
            (g(x) * (i + 1)).sum().backward()
            (twin(x2) * (i + 1)).sum().backward()
            torch.testing.assert_close(x.grad, x2.grad)
            for p, q in zip(net.parameters(), twin.parameters()):
                torch.testing.assert_close(p.grad, q.grad)


class TestHostSyncs:
    """What makes the host wait for the device is refused at capture, as CUDA refuses it."""

    @pytest.mark.parametrize("line", [
        lambda x: x * x.sum().item(),
        lambda x: x * 2 if x.sum() > 0 else x,
        lambda x: x[x > 0].sum() + x,
        lambda x: x + x.nonzero().shape[0],
        lambda x: x + 1 if torch.equal(x, x * 1) else x,
    ], ids=["item", "if-tensor", "mask-index", "nonzero", "equal"])
    def test_refused_at_capture_naming_the_cause(self, graph_backend, line):
        g = CudaGraphModule(line, warmup=1, backend=graph_backend)
        x = torch.ones(3)
        g(x)
        with pytest.raises(CaptureError) as info:
            g(x)
        # (a CUDA error that names nonzero reads as a data-dependent shape)
        assert info.value.cause == "host-sync" or graph_backend == "cuda" and info.value.cause == "data-dependent-shape"
        assert "test_simulate.py" in info.value.where
        if graph_backend == "simulate":
            assert str(info.value).startswith(
                "CudaGraphModule(<lambda>) failed to capture its CUDA graph at test_simulate.py:")
            assert (": RuntimeError: operation not permitted when stream is capturing (refused as by a CUDA "
                    "capture: this operation makes the host wait for the device)\n"
                    "Likely cause (host-sync): ") in str(info.value)

    @pytest.mark.parametrize("line", [
        lambda x: x + 1 if torch.equal(x, x) else x,
        lambda x: x + 1 if torch.equal(x[1:], x[1:]) else x,
        lambda x: x + 1 if torch.equal(x, x[:2]) else x,
        lambda x: x + 1 if torch.equal(x[:0], x[1:1] * 2) else x,
    ], ids=["same", "same-view", "other-size", "empty"])
    def test_equal_answered_from_sizes_and_memory_is_served(self, graph_backend, line):
        # CUDA's torch.equal reads no value for these (the same memory seen the same way, other
        # sizes, no elements): a capture takes them, and each replay gives the eager answer
        g = CudaGraphModule(line, warmup=1, backend=graph_backend)
        for i in range(4):
            x = torch.arange(3.0) + i
            torch.testing.assert_close(g(x), line(x), rtol=0, atol=0)
        assert g.state == "captured" and g.stats.replays > 0

    def test_a_failed_capture_leaves_the_memory_it_wrote_as_it_was(self, graph_backend):
        state = torch.zeros(3)

        def fn(x):
            state.add_(x)  # a CUDA capture records this write without running it
            return state * x.sum().item()

        g = CudaGraphModule(fn, warmup=1, backend=graph_backend)
        x = torch.ones(3)
        g(x)
        torch.testing.assert_close(state, torch.ones(3))
        with pytest.raises(CaptureError):
            g(x)
        torch.testing.assert_close(state, torch.ones(3))


class TestReturnTypes:
    """``torch.return_types`` results (structseqs) are built at each call with this call's values
    (they were the capture's object, returned at every later call)."""

    @pytest.mark.parametrize("fn", [
        lambda x: x.max(-1),
        lambda x: x.min(dim=0),
        lambda x: x.topk(2),
        lambda x: x.sort(-1, descending=True),
        lambda x: torch.aminmax(x),
        lambda x: {"best": x.max(-1), "rest": [x.sort(0)]},
    ], ids=["max", "min", "topk", "sort", "aminmax", "nested"])
    def test_fresh_results_of_the_same_type_at_each_call(self, graph_backend, fn):
        g = CudaGraphModule(fn, warmup=1, backend=graph_backend)
        held = []
        for i in range(4):
            x = torch.randn(3, 4)
            out, want = g(x), fn(x)
            held.append((out, want))
            leaves, spec = torch.utils._pytree.tree_flatten(out)
            wanted, wanted_spec = torch.utils._pytree.tree_flatten(want)
            assert spec == wanted_spec  # (the same structseq types, nested the same way)
            for a, b in zip(leaves, wanted):
                torch.testing.assert_close(a, b)
        for out, want in held:  # results of earlier calls kept their values, as eagerly
            for a, b in zip(torch.utils._pytree.tree_leaves(out), torch.utils._pytree.tree_leaves(want)):
                torch.testing.assert_close(a, b)
        assert len({id(out) for out, _ in held}) == len(held)  # a new result object per call


class TestDetachedReturns:
    """``p.detach()`` of a parameter or an input returned by the function tracks no gradient
    (it came back requiring grad, and a backward through it added into ``p.grad``)."""

    def test_a_detached_parameter(self, graph_backend):
        net, twin = _twins(nn.Linear(3, 2))

        def fn(model):
            return lambda x: (model(x), model.weight.detach(), model.bias.detach()[1:])

        g = CudaGraphModule(fn(net), warmup=1, backend=graph_backend)
        plain = fn(twin)
        for i in range(3):
            x = torch.randn(4, 3)
            net.zero_grad()
            twin.zero_grad()
            out, want = g(x), plain(x)
            assert [t.requires_grad for t in out] == [t.requires_grad for t in want] == [True, False, False]
            (out[0].sum() + (out[1] * 2).sum()).backward() if out[1].requires_grad else out[0].sum().backward()
            want[0].sum().backward()
            for p, q in zip(net.parameters(), twin.parameters()):
                torch.testing.assert_close(p.grad, q.grad)

    def test_a_detached_input(self, graph_backend):
        g = CudaGraphModule(lambda x: (x * 2, x.detach()), warmup=1, backend=graph_backend)
        for i in range(3):
            x = torch.randn(3, requires_grad=True)
            out = g(x)
            assert out[0].requires_grad and not out[1].requires_grad
            assert out[1].data_ptr() == x.data_ptr()  # eagerly a view of x's memory


def test_a_released_graph_frees_what_its_capture_made():
    runner = SimulatedRunner()
    made = []

    def body():
        t = torch.ones(4) * 2
        made.append(weakref.ref(t))
        return t.sum()

    captured = runner.capture(body, "test")
    out = captured.out
    runner.replay(captured.handle)
    assert made[0]() is not None  # the graph holds its intermediate memory, as a pool does
    runner.release(captured.handle)
    del captured
    assert made[0]() is None
    torch.testing.assert_close(out, torch.tensor(8.0))
