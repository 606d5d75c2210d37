"""Outputs and effects on inputs, through the public API (simulated replays).

The simulated backend runs the real buffer machinery on CPU: inputs copied into
static buffers, outputs produced in fixed buffers that each replay overwrites.
"""

import pytest
import torch
from tensordict import TensorDict

from graphmodule import CudaGraphModule, UnsupportedError


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


class _Tagged(torch.Tensor):
    """A tensor subclass a function may return."""


class TestReturnedObjectsAsEagerly:
    """What a call returns is the object the plain call returns: a new view of a parameter or
    buffer per call, lazy conjugate and negative bits, tensor subclasses and ``nn.Parameter``.
    (#26 class 6)"""

    @staticmethod
    def _table():
        torch.manual_seed(0)
        lin = torch.nn.Linear(3, 2)
        lin.register_buffer("table", torch.arange(6.0).reshape(2, 3))
        return lin

    @pytest.mark.parametrize("outputs", ["safe", "clone", "static"])
    def test_a_view_of_a_parameter_is_a_new_object_at_each_call(self, graph_backend, outputs):
        lin = self._table()
        g = CudaGraphModule(lambda x: (lin.weight.t(), x * 2), warmup=1, backend=graph_backend, outputs=outputs)
        views = [g(torch.ones(3))[0] for _ in range(4)]
        assert len({id(v) for v in views}) == len(views)
        for v in views:
            torch.testing.assert_close(v, lin.weight.t())
            assert v.requires_grad and v.grad_fn is not None  # a view that backpropagates, as eagerly

    @pytest.mark.parametrize("change", ["t_", "unsqueeze_", "requires_grad_"])
    def test_changing_a_returned_view_of_a_buffer_leaves_later_results_alone(self, graph_backend, change):
        lin = self._table()

        def fn(x):
            return lin.table[1:], x * 2

        g = CudaGraphModule(fn, warmup=1, backend=graph_backend)
        for _ in range(3):
            view = g(torch.ones(3))[0]
        {"t_": lambda: view.t_(), "unsqueeze_": lambda: view.unsqueeze_(0),
         "requires_grad_": lambda: view.requires_grad_()}[change]()
        got, want = g(torch.ones(3))[0], fn(torch.ones(3))[0]
        assert (got.shape, got.stride(), got.requires_grad) == (want.shape, want.stride(), want.requires_grad)
        torch.testing.assert_close(got, want)

    LAZY = {
        "conj_of_input": (lambda z: z.conj(), torch.complex64),
        "conj_of_result": (lambda z: (z * 2).conj(), torch.complex64),
        "neg_view_of_input": (lambda z: torch._neg_view(z), torch.float32),
        "neg_view_of_result": (lambda z: torch._neg_view(z * 2), torch.float32),
    }

    @pytest.mark.parametrize("outputs", ["safe", "clone", "static"])
    @pytest.mark.parametrize("case", sorted(LAZY))
    def test_results_with_lazy_conjugate_or_negative_bits(self, graph_backend, case, outputs):
        fn, dtype = self.LAZY[case]
        g = CudaGraphModule(fn, warmup=1, backend=graph_backend, outputs=outputs)
        for k in range(5):
            z = (torch.arange(4.0) + k).to(dtype) * (1 + 2j if dtype.is_complex else 1)
            got, want = g(z), fn(z.clone())
            assert (got.is_conj(), got.is_neg()) == (want.is_conj(), want.is_neg())
            torch.testing.assert_close(got.resolve_conj().resolve_neg(), want.resolve_conj().resolve_neg())

    KINDS = {
        "parameter": lambda x: torch.nn.Parameter(x * 2),
        "subclass": lambda x: (x * 2).as_subclass(_Tagged),
        "subclass_view_of_input": lambda x: x.as_subclass(_Tagged),
    }

    @pytest.mark.parametrize("outputs", ["safe", "clone", "static"])
    @pytest.mark.parametrize("case", sorted(KINDS))
    def test_parameter_and_subclass_results_keep_their_type(self, graph_backend, case, outputs):
        fn = self.KINDS[case]
        g = CudaGraphModule(fn, warmup=1, backend=graph_backend, outputs=outputs)
        for k in range(4):
            x = torch.full((3,), float(k))
            got, want = g(x), fn(x.clone())
            assert (type(got), got.requires_grad) == (type(want), want.requires_grad)
            torch.testing.assert_close(got.detach().as_subclass(torch.Tensor), want.detach().as_subclass(torch.Tensor))

    def test_a_view_of_a_complex_parameter_as_another_dtype_is_a_new_view_at_each_call(self, graph_backend):
        table = torch.nn.Parameter(torch.arange(4.0).to(torch.complex64) * (1 + 1j))
        g = CudaGraphModule(lambda x: (torch.view_as_real(table), x + 1), warmup=1, backend=graph_backend)
        views = [g(torch.ones(2))[0] for _ in range(3)]
        assert len({id(v) for v in views}) == 3
        for v in views:
            assert v.dtype == torch.float32 and v.requires_grad
            torch.testing.assert_close(v, torch.view_as_real(table))

    def test_a_wrapper_subclass_result_is_rebuilt_from_its_tensors(self, graph_backend):
        from torch.testing._internal.two_tensor import TwoTensor

        def fn(x):
            return TwoTensor(x * 2, x + 1)

        g = CudaGraphModule(fn, warmup=1, backend=graph_backend)
        for k in range(4):
            x = torch.full((3,), float(k))
            got, want = g(x), fn(x.clone())
            assert type(got) is TwoTensor
            torch.testing.assert_close(got.a, want.a)
            torch.testing.assert_close(got.b, want.b)

    def test_a_subclass_with_its_own_dispatch_and_no_flatten_is_refused_at_capture(self, graph_backend):
        class Dispatching(torch.Tensor):
            @classmethod
            def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
                return func(*args, **(kwargs or {}))

        def fn(x):
            return torch.Tensor._make_subclass(Dispatching, x * 2)

        g = CudaGraphModule(fn, warmup=1, backend=graph_backend)
        g(torch.ones(3))
        with pytest.raises(UnsupportedError) as info:
            g(torch.ones(3))
        assert str(info.value) == (
            "CudaGraphModule(fn) cannot replay this call as a CUDA graph: the function returned a Dispatching, a "
            "tensor subclass with its own __torch_dispatch__ and no __tensor_flatten__, which graphmodule cannot "
            "rebuild.\nTo fix: return tensors, containers of tensors, TensorDicts, tensorclasses or plain objects "
            "holding them."
        )
