"""Outputs and effects on inputs, through the public API (simulated replays).

The simulated backend runs the real buffer machinery on CPU: inputs copied into
static buffers, outputs produced in fixed buffers that each replay overwrites.
"""

import pytest
import torch
from tensordict import TensorDict

from graphmodule import CudaGraphModule


def _replaying(make, fn, *args, **options):
    g = make(fn, warmup=1, **options)
    g(*args)
    g(*args)
    assert g.state == "captured"
    return g


class TestOutputs:
    def test_default_outputs_survive_later_calls(self, make):
        g = _replaying(make, lambda x: x * 2, torch.zeros(3))
        outs = [g(torch.full((3,), float(i))) for i in range(4)]
        for i, out in enumerate(outs):
            torch.testing.assert_close(out, torch.full((3,), 2.0 * i))

    def test_static_outputs_are_one_buffer_overwritten_by_each_call(self, make):
        g = _replaying(make, lambda x: x * 2, torch.zeros(3), outputs="static")
        first = g(torch.ones(3))
        second = g(torch.full((3,), 5.0))
        assert first is second
        torch.testing.assert_close(first, torch.full((3,), 10.0))

    def test_nested_outputs_keep_their_structure(self, make):
        g = _replaying(make, lambda x: {"a": x + 1, "b": [x * 2, "label"], "c": None}, torch.zeros(2))
        out = g(torch.full((2,), 3.0))  # a different value in each leaf: swapped leaves show
        assert set(out) == {"a", "b", "c"} and out["b"][1] == "label" and out["c"] is None
        assert isinstance(out["b"], list) and len(out["b"]) == 2
        torch.testing.assert_close(out["a"], torch.full((2,), 4.0))
        torch.testing.assert_close(out["b"][0], torch.full((2,), 6.0))

    def test_returned_input_is_the_callers_tensor(self, make):
        g = _replaying(make, lambda x: (x, x + 1), torch.zeros(2))
        x = torch.randn(2)
        same, plus = g(x)
        assert same is x
        torch.testing.assert_close(plus, x + 1)

    def test_outputs_track_grad_and_backpropagate_as_eagerly(self, make):
        # eagerly x * w requires grad: the graph is captured with its backward (see test_grad)
        w = torch.nn.Parameter(torch.ones(2))
        g = _replaying(make, lambda x: x * w, torch.ones(2))
        out = g(torch.full((2,), 3.0))
        assert out.requires_grad
        (out.sum() + w.sum()).backward()
        torch.testing.assert_close(w.grad, torch.full((2,), 4.0))

    def test_outputs_under_no_grad_do_not_require_grad(self, make):
        w = torch.nn.Parameter(torch.ones(2))
        with torch.no_grad():
            g = _replaying(make, lambda x: x * w, torch.ones(2))
            assert not g(torch.ones(2)).requires_grad

    def test_tensordict_output_is_cloned(self, make):
        g = _replaying(make, lambda x: TensorDict(y=x + 1), torch.zeros(2))
        first = g(torch.zeros(2))
        g(torch.ones(2))
        torch.testing.assert_close(first["y"], torch.ones(2))


class TestEffectsOnInputs:
    def test_in_place_writes_reach_the_caller(self, make):
        def step(x, counter):
            counter.add_(1)
            return x * counter

        g = make(step, warmup=1)
        counter = torch.zeros(())
        for i in range(1, 6):
            out = g(torch.ones(2), counter)
            assert counter.item() == i
            torch.testing.assert_close(out, torch.full((2,), float(i)))

    def test_untouched_inputs_are_not_written(self, make):
        g = _replaying(make, lambda x: x + 1, torch.zeros(2))
        x = torch.zeros(2)
        version = x._version
        g(x)
        assert x._version == version

    def test_key_written_into_an_input_tensordict(self, make):
        def fn(td):
            td["y"] = td["x"] * 2

        g = make(fn, warmup=1)
        for i in range(4):
            td = TensorDict(x=torch.full((2,), float(i)))
            assert g(td) is None
            torch.testing.assert_close(td["y"], torch.full((2,), 2.0 * i))


class TestStaticInputs:
    def test_passing_the_same_tensor_each_call(self, make):
        g = _replaying(make, lambda x: x.sum(), torch.zeros(4))
        x = torch.zeros(4)
        for i in range(3):
            x.fill_(i)
            torch.testing.assert_close(g(x), torch.tensor(4.0 * i))

    def test_inputs_are_copied_not_referenced(self, make):
        x = torch.ones(2)
        g = _replaying(make, lambda t: t * 3, x)
        x.fill_(7)  # the capture call's input, changed afterwards: the graph reads copies
        torch.testing.assert_close(g(torch.ones(2)), torch.full((2,), 3.0))


def test_simulate_backend_matches_eager_over_many_calls(make):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 2))
    g = CudaGraphModule(net, backend="simulate")
    with torch.no_grad():
        for _ in range(6):
            x = torch.randn(3, 5)
            torch.testing.assert_close(g(x), net(x))
