"""Every replay is checked: structure, keys, shape, dtype, device, requires_grad, constants.

Run with the eager backend (the CPU fallback), which applies the same checks as a GPU.
"""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from graphmodule import CudaGraphModule, InputMismatchError, Mismatch, RequiresGradError
from graphmodule._record import read_call
from graphmodule._spec import FlatCall, InputSpec, TensorFacts, facts


def _captured(make, fn, *args, max_graphs=1, **kwargs):
    """Captured with ``max_graphs=1`` unless told: a call of another signature is refused (by
    default, one differing only in Python values gets a graph of its own)."""
    g = make(fn, warmup=1, backend="eager", max_graphs=max_graphs)
    g(*args, **kwargs)
    g(*args, **kwargs)  # the call that records the signature
    assert g.state == "eager"
    return g


class TestTensorLeaves:
    def test_dtype_mismatch_is_refused_with_the_exact_message(self, make):
        g = _captured(make, lambda x, y: x + y, torch.zeros(3), torch.zeros(3))
        with pytest.raises(InputMismatchError) as info:
            g(torch.zeros(3), torch.zeros(3, dtype=torch.float64))
        assert str(info.value) == (
            "CudaGraphModule(<lambda>) was first called after warmup (eagerly: no CUDA graph) with other inputs "
            "than this call's (1 mismatch):\n"
            "  args[1]: expected dtype torch.float32, got torch.float64\n"
            "To fix: copying into the graph's buffer would cast silently: convert the input with "
            ".to(dtype) before the call."
        )
        err = info.value
        assert (err.path, err.expected, err.got) == ("args[1]", "torch.float32", "torch.float64")
        assert err.mismatches == [Mismatch("args[1]", "dtype", "torch.float32", "torch.float64")]

    def test_shape_mismatch_names_both_shapes(self, make):
        g = _captured(make, lambda x: x * 2, torch.zeros(64, 17))
        with pytest.raises(InputMismatchError, match=r"args\[0\]: expected shape \(64, 17\), got \(32, 17\)"):
            g(torch.zeros(32, 17))

    def test_broadcastable_shape_is_still_refused(self, make):
        # copy_ would broadcast (1, 3) into (4, 3) without a word
        g = _captured(make, lambda x: x * 2, torch.zeros(4, 3))
        with pytest.raises(InputMismatchError, match="expected shape"):
            g(torch.zeros(1, 3))

    def test_all_mismatches_of_a_call_are_reported_together(self, make):
        g = _captured(make, lambda x, y, n: x + y + n, torch.zeros(2), torch.zeros(2), 1)
        with pytest.raises(InputMismatchError) as info:
            g(torch.zeros(3, dtype=torch.int64), torch.zeros(2), 2)
        assert [(m.path, m.kind) for m in info.value.mismatches] == [
            ("args[0]", "shape"),
            ("args[0]", "dtype"),
            ("args[2]", "value"),
        ]
        text = str(info.value)
        assert "(3 mismatches)" in text and text.count("To fix:") == 3

    def test_the_stride_of_a_dim_of_one_element_does_not_count(self, make):
        # a batch of one observation: (1, 17) with strides (17, 1) or (1, 1) is one layout
        g = make(lambda x: x * 2, warmup=1, backend="simulate")
        for _ in range(2):
            g(torch.ones(1, 17))
        x = torch.arange(17.0).reshape(17, 1).t()
        assert x.stride() == (1, 1)
        torch.testing.assert_close(g(x), x * 2)
        assert g.stats.graphs == 1 and g.stats.replays == 2

    def test_requires_grad_is_part_of_the_signature(self, make):
        g = make(lambda x: x * 2, warmup=1, backend="eager")
        g(torch.zeros(2))
        g(torch.zeros(2))
        with pytest.raises(RequiresGradError) as info:
            g(torch.zeros(2, requires_grad=True))
        assert isinstance(info.value, ValueError) and isinstance(info.value, RuntimeError)
        assert "args[0]: expected requires_grad False, got True" in str(info.value)
        assert "max_graphs=2 to keep one graph per pattern of inputs" in str(info.value)


# A (3, 4) tensor of each layout a call may pass: the values differ from call to call (``i``).
LAYOUTS = {
    "contiguous": lambda i: torch.arange(12.0).reshape(3, 4) + i,
    "transposed": lambda i: (torch.arange(12.0).reshape(4, 3) + i).t(),
    "expanded": lambda i: (torch.arange(4.0) + i).expand(3, 4),  # stride (0, 1)
    "broadcast_column": lambda i: (torch.arange(3.0) + i).reshape(3, 1).expand(3, 4),  # stride (1, 0)
    "broadcast_scalar": lambda i: torch.tensor(2.0 + i).expand(3, 4),  # stride (0, 0)
    "sliced": lambda i: (torch.arange(24.0).reshape(3, 8) + i)[:, ::2],
    "offset": lambda i: (torch.arange(20.0) + i)[5:17].view(3, 4),  # storage offset 5
    "transposed_slice": lambda i: (torch.arange(40.0).reshape(8, 5) + i).t()[1:4, ::2],  # strides (1, 10)
}


def affine(x):
    return x * 2 + 1


class TestLayout:
    """Strides are no part of a signature: a tensor of any layout is copied into the graph's
    buffer and gets eager's values; the results keep the layout of the capture."""

    @pytest.mark.parametrize("captured", sorted(LAYOUTS))
    @pytest.mark.parametrize("called", sorted(LAYOUTS))
    def test_any_layout_is_served_by_the_graph_of_another(self, graph_backend, captured, called):
        g = CudaGraphModule(affine, warmup=1, backend=graph_backend)
        g(LAYOUTS[captured](0))
        first = g(LAYOUTS[captured](1))  # the capture
        for i in (2, 3):
            x = LAYOUTS[called](i)
            out = g(x)
            torch.testing.assert_close(out, affine(x))
            assert out.stride() == first.stride()  # the capture's layout
        assert (g.stats.graphs, g.stats.captures, g.stats.replays) == (1, 1, 3)

    def test_captured_transposed_then_called_expanded(self, graph_backend):
        # the report of #30: InputMismatchError 'expected stride (1, 8) (column-major), got (0, 1)'
        g = CudaGraphModule(lambda x: x * 2 + x.sum(0), warmup=1, backend=graph_backend)
        for _ in range(2):
            g(torch.randn(8, 3).t())
        x = torch.randn(8).expand(3, 8)
        torch.testing.assert_close(g(x), x * 2 + x.sum(0))

    @pytest.mark.parametrize("backend", ["eager", "simulate"])
    def test_the_fallback_without_cuda_serves_any_layout_too(self, make, backend):
        g = make(affine, warmup=1, backend=backend)
        for _ in range(2):
            g(torch.zeros(3, 4))
        for name, layout in LAYOUTS.items():
            x = layout(1)
            torch.testing.assert_close(g(x), affine(x), msg=name)

    def test_with_room_for_more_graphs_one_graph_serves_every_layout(self, graph_backend):
        # values are eager's either way: one capture, not one per layout
        g = CudaGraphModule(affine, warmup=1, backend=graph_backend, max_graphs=3)
        for i, name in enumerate(["contiguous", "contiguous", *LAYOUTS, "transposed", "contiguous"]):
            x = LAYOUTS[name](i)
            torch.testing.assert_close(g(x), affine(x))
        assert (g.stats.graphs, g.stats.captures) == (1, 1)

    def test_tensordict_leaves_of_other_layouts(self, graph_backend):
        def fn(td):
            return td["a"] * 10 + td["b", "c"]

        def td(i, a, c):
            return TensorDict(a=LAYOUTS[a](i), b=TensorDict(c=LAYOUTS[c](i), batch_size=[3]), batch_size=[3])

        g = CudaGraphModule(fn, warmup=1, backend=graph_backend)
        for i in range(2):
            g(td(i, "contiguous", "transposed"))
        for i, (a, c) in enumerate([("transposed", "expanded"), ("sliced", "offset"), ("broadcast_scalar", "contiguous")]):
            call = td(i, a, c)
            torch.testing.assert_close(g(call), fn(call))
        assert g.stats.graphs == 1

    def test_a_tensordict_module_writes_its_result_for_an_input_of_another_layout(self, graph_backend):
        module = TensorDictModule(lambda a: a.exp() - a, in_keys=["a"], out_keys=["b"])
        g = CudaGraphModule(module, warmup=1, backend=graph_backend)
        for i in range(2):
            g(TensorDict(a=LAYOUTS["contiguous"](i) / 10, batch_size=[3]))
        for name in ("transposed", "expanded", "transposed_slice"):
            a = LAYOUTS[name](1) / 10
            ours, eager = TensorDict(a=a, batch_size=[3]), TensorDict(a=a.clone(), batch_size=[3])
            assert g(ours) is ours
            module(eager)
            torch.testing.assert_close(ours["b"], eager["b"])
            assert ours["a"] is a  # the input entry untouched

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(data=st.data())
    def test_random_layouts(self, graph_backend, data):
        shape = (2, 3, 4)

        def view(i):
            """A tensor of ``shape``: its dims in any memory order, with gaps, an offset and
            broadcast (stride 0) dims."""
            order = data.draw(st.permutations(range(3)))
            steps = [data.draw(st.integers(1, 3)) for _ in shape]
            broadcast = [data.draw(st.booleans()) for _ in shape]
            offset = data.draw(st.integers(0, 4))
            sizes = [1 if broadcast[d] else shape[d] * steps[d] for d in order]  # outermost first
            base = (torch.arange(offset + math.prod(sizes), dtype=torch.float32) * 0.5 - i)[offset:]
            t = base.view(sizes).permute([order.index(d) for d in range(3)])
            t = t[tuple(slice(None, None, 1 if broadcast[d] else steps[d]) for d in range(3))]
            return t.expand(shape)

        def fn(x):
            return (x * 3).cumsum(1) + x.amax(0)

        g = CudaGraphModule(fn, warmup=1, backend=graph_backend)
        captured = view(0)
        g(captured)
        first = g(captured)
        for i in (1, 2):
            x = view(i)
            out = g(x)
            torch.testing.assert_close(out, fn(x))
            assert out.stride() == first.stride()
        assert g.stats.graphs == 1


class TestStructure:
    def test_kwargs_are_matched_by_name(self, make):
        g = _captured(make, lambda x, y: x - y, x=torch.ones(2), y=torch.zeros(2))
        torch.testing.assert_close(g(y=torch.zeros(2), x=torch.ones(2)), torch.ones(2))

    def test_renamed_kwarg_reports_missing_and_extra(self, make):
        g = _captured(make, lambda **kw: sum(kw.values()), obs=torch.ones(2))
        with pytest.raises(InputMismatchError) as info:
            g(ob=torch.ones(2))
        assert str(info.value).splitlines()[1:3] == [
            "  kwargs['obs']: missing (expected a tensor of shape (2,), torch.float32 on cpu)",
            "  kwargs['ob']: not in those inputs (got a tensor of shape (2,), torch.float32 on cpu)",
        ]

    def test_nested_containers_are_checked_by_path(self, make):
        batch = {"obs": [torch.zeros(2), torch.zeros(3)], "extra": (torch.zeros(1),)}
        g = _captured(make, lambda b: b["obs"][1].sum(), batch)
        bad = {"obs": [torch.zeros(2), torch.zeros(4)], "extra": (torch.zeros(1),)}
        with pytest.raises(InputMismatchError, match=r"args\[0\]\['obs'\]\[1\]: expected shape \(3,\), got \(4,\)"):
            g(bad)

    def test_list_for_tuple_is_a_structure_mismatch(self, make):
        g = _captured(make, lambda xs: xs[0] + xs[1], (torch.zeros(2), torch.zeros(2)))
        with pytest.raises(InputMismatchError) as info:
            g([torch.zeros(2), torch.zeros(2)])
        assert info.value.mismatches[0].kind == "structure"

    def test_extra_positional_argument(self, make):
        g = _captured(make, lambda *xs: sum(xs), torch.zeros(2))
        with pytest.raises(InputMismatchError, match=r"args\[1\]: not in those inputs"):
            g(torch.zeros(2), torch.zeros(2))

    def test_tensor_where_a_constant_was_captured(self, make):
        g = _captured(make, lambda x, n: x * n, torch.zeros(2), 3)
        with pytest.raises(InputMismatchError) as info:
            g(torch.zeros(2), torch.tensor(3.0))
        assert info.value.mismatches[0].kind == "type"


class TestConstants:
    def test_changed_constant_is_refused(self, make):
        g = _captured(make, lambda x, scale: x * scale, torch.ones(2), 0.5)
        with pytest.raises(InputMismatchError) as info:
            g(torch.ones(2), 0.7)
        assert info.value.mismatches == [Mismatch("args[1]", "value", "0.5", "0.7")]
        assert "pass a value that changes as a tensor" in str(info.value)

    def test_int_and_bool_constants_are_not_confused(self, make):
        g = _captured(make, lambda x, flag: x + flag, torch.ones(2), 1)
        with pytest.raises(InputMismatchError):
            g(torch.ones(2), True)

    def test_by_default_int_and_bool_constants_get_a_graph_each(self, make):
        def fn(x, flag):
            return x + (10 if flag is True else flag)

        g = _captured(make, fn, torch.ones(2), 1, max_graphs=None)
        for flag in (True, True, 1, True, 1):
            torch.testing.assert_close(g(torch.ones(2), flag), fn(torch.ones(2), flag))
        assert (g.stats.graphs, g.stats.input_mismatches) == (2, 0)

    @pytest.mark.parametrize(
        "captured, equal",
        [
            ("double", "".join(["dou", "ble"])),  # equal, not the same (interned) object
            (1000, int("1000")),  # outside CPython's small-int cache
            (0.5, float("0.5")),
        ],
    )
    def test_equal_constant_passes(self, make, captured, equal):
        assert captured == equal and captured is not equal  # compared by value, not identity
        g = _captured(make, lambda x, c: x * (2 if c == captured else 1), torch.ones(2), captured)
        torch.testing.assert_close(g(torch.ones(2), equal), torch.full((2,), 2.0))
        assert g.stats.input_mismatches == 0

    def test_none_is_part_of_the_structure(self, make):
        g = _captured(make, lambda x, mask: x if mask is None else x * mask, torch.ones(2), None)
        with pytest.raises(InputMismatchError):
            g(torch.ones(2), torch.ones(2))


class TestUsableAfterAnError:
    def test_good_call_after_a_bad_one(self, make):
        g = _captured(make, lambda x: x + 1, torch.zeros(2))
        for bad in (torch.zeros(3), torch.zeros(2, dtype=torch.int32), [torch.zeros(2)]):
            with pytest.raises(InputMismatchError):
                g(bad)
        torch.testing.assert_close(g(torch.ones(2)), torch.full((2,), 2.0))
        assert g.stats.input_mismatches == 3


class TestFlatCallReader:
    """The flat-call fast path (each argument one leaf, some by keyword) must decide exactly
    as the flattening reader does, on matching and on mismatching calls."""

    @staticmethod
    def _spec(args, kwargs):
        from graphmodule._spec import InputSpec
        from graphmodule._tree import Layout

        tree = (args, kwargs)
        layout = Layout.capture(tree, {})
        return InputSpec(layout, layout.leaves(tree)[0])

    @staticmethod
    def _slow(spec, args, kwargs):
        split = spec.layout.leaves((args, kwargs))
        return split is not None and spec.matches(split[0])

    def test_policy_called_by_keyword_takes_the_fast_path(self):
        obs = torch.zeros(4, 3)
        spec = self._spec((), {"obs": obs})
        assert spec.flat_call == FlatCall(0, ("obs",))
        leaves, _ = spec.match((), {"obs": torch.ones(4, 3)})
        assert leaves[0].shape == (4, 3)

    @pytest.mark.parametrize("call", [
        ((), {"obs": torch.zeros(4, 3)}),                       # same
        ((), {"obs": torch.zeros(5, 3)}),                       # shape
        ((), {"obs": torch.zeros(4, 3, dtype=torch.float64)}),  # dtype
        ((), {"obs": [torch.zeros(4, 3)]}),                     # a container for a leaf
        ((), {"obs": None}),                                    # None for a leaf
        ((), {"obs": 3}),                                       # a constant for a tensor
        ((torch.zeros(4, 3),), {}),                             # positional instead
        ((), {"obs": torch.zeros(4, 3), "k": 2}),               # an extra keyword
    ])
    def test_one_keyword_tensor(self, call):
        spec = self._spec((), {"obs": torch.zeros(4, 3)})
        assert (spec.match(*call) is not None) == self._slow(spec, *call)

    @pytest.mark.parametrize("call", [
        ((torch.zeros(2),), {"a": torch.zeros(3), "n": 5}),
        ((torch.zeros(2),), {"n": 5, "a": torch.zeros(3)}),     # keyword order changed
        ((torch.zeros(2),), {"a": torch.zeros(3), "n": 6}),     # constant changed
        ((torch.zeros(2),), {"a": torch.zeros(3), "n": 5.0}),   # constant type changed
        ((torch.zeros(2), torch.zeros(3)), {"n": 5}),
        ((torch.zeros(2),), {"a": (torch.zeros(3),), "n": 5}),
    ])
    def test_positional_and_keywords_with_a_constant(self, call):
        spec = self._spec((torch.zeros(2),), {"a": torch.zeros(3), "n": 5})
        assert spec.flat_call == FlatCall(1, ("a", "n"))
        assert (spec.match(*call) is not None) == self._slow(spec, *call)

    def test_containers_and_none_keep_the_flattening_reader(self):
        assert self._spec((), {"obs": (torch.zeros(1),)}).flat_call is None
        assert self._spec((), {"obs": torch.zeros(1), "h": None}).flat_call is None
        assert self._spec((torch.zeros(1),), {}).flat_call is None  # positional: its own path


class Config(dict):
    """A user's dict subclass, which optree does not flatten: passed whole, as one constant."""


class TestAContainerPassedWhole:
    """A ``dict`` subclass argument changed in place since the capture: eagerly the call reads its
    entries now; a replay would read those baked in at capture, so it is another constant."""

    @staticmethod
    def f(x, cfg):
        return x * cfg["scale"] + cfg["shift"]

    def _calls(self, g, cfg, x):
        got, want = [], []
        for scale in (2.0, 2.0, 2.0, 3.0, 3.0, 2.0):
            cfg["scale"] = scale  # the same object, changed in place
            got.append(g(x, cfg))
            want.append(self.f(x, cfg))
        return got, want

    def test_served_as_eagerly_by_default(self, graph_backend):
        x, cfg = torch.arange(3.0), Config(scale=2.0, shift=1.0)
        g = CudaGraphModule(self.f, warmup=1, backend=graph_backend)
        got, want = self._calls(g, cfg, x)
        for a, b in zip(got, want):
            assert torch.equal(a, b)
        assert g.stats.captures == 2  # a graph for each content of the config

    def test_refused_with_one_graph(self, graph_backend):
        x, cfg = torch.arange(3.0), Config(scale=2.0, shift=1.0)
        g = CudaGraphModule(self.f, warmup=1, max_graphs=1, backend=graph_backend)
        for _ in range(3):
            assert torch.equal(g(x, cfg), self.f(x, cfg))
        cfg["scale"] = 3.0
        with pytest.raises(InputMismatchError) as info:
            g(x, cfg)
        assert info.value.mismatches == [
            Mismatch("args[1]", "value", "{'scale': 2.0, 'shift': 1.0}", "{'scale': 3.0, 'shift': 1.0}",
                     "Varying inputs must be torch.Tensor subclasses.")]
        cfg["scale"] = 2.0  # as captured again: replayed
        assert torch.equal(g(x, cfg), self.f(x, cfg))

    def test_an_equal_copy_is_the_same_constant(self, graph_backend):
        x = torch.arange(3.0)
        g = CudaGraphModule(self.f, warmup=1, max_graphs=1, backend=graph_backend)
        for _ in range(4):
            cfg = Config(scale=2.0, shift=1.0)  # a new object each call, equal entries
            assert torch.equal(g(x, cfg), self.f(x, cfg))
        assert g.stats.captures == 1 and g.stats.replays == 3


class TestTheGuardShortCut:
    """``InputSpec.matches`` answers True as soon as the tensor guard passes, without reading
    ``facts``: every fact must be one the guard compares too, or a call differing in it would be
    replayed. Tested through the public path: a call is served exactly when its tensor's facts
    equal the capture's (its memory layout and dispatch keys, which the guard also compares, do
    not count), and refused otherwise."""

    @staticmethod
    def _tensor(shape, dtype, requires_grad, transposed, inference):
        t = torch.arange(math.prod(shape), dtype=torch.float64).reshape(shape).to(dtype)
        if transposed:
            t = t.t().contiguous().t()
        if inference:
            with torch.inference_mode():
                t = t.clone()
        return t.requires_grad_() if requires_grad and dtype.is_floating_point and not inference else t

    @settings(max_examples=60, deadline=None)
    @given(data=st.data())
    def test_served_exactly_when_the_facts_match(self, data):
        def draw():
            return self._tensor(data.draw(st.sampled_from([(2, 3), (3, 2), (2, 2)])),
                                data.draw(st.sampled_from([torch.float32, torch.float64, torch.int64])),
                                data.draw(st.booleans()), data.draw(st.booleans()), data.draw(st.booleans()))

        captured, call = draw(), draw()
        g = CudaGraphModule(lambda x: x * 2, warmup=1, max_graphs=1, backend="simulate")
        with torch.no_grad():
            g(captured)
            g(captured)
            if facts(call) == facts(captured):
                torch.testing.assert_close(g(call), call * 2)
            else:
                with pytest.raises(InputMismatchError):
                    g(call)


def test_a_signature_reads_its_tensor_facts_by_name():
    x = torch.ones(2, 3, dtype=torch.float64, requires_grad=True)
    f = facts(x)
    assert isinstance(f, TensorFacts) and f._fields == ("shape", "dtype", "device", "requires_grad", "layout")
    assert (f.shape, f.dtype, f.device, f.requires_grad, f.layout) == (
        torch.Size([2, 3]), torch.float64, torch.device("cpu"), True, torch.strided)
    call = read_call("f", ((x, 0.5), {}), {}, (), None)
    spec = InputSpec(call.layout, call.leaves)
    assert spec.facts == (f,) and spec.shapes == [f.shape]
    assert spec.tensor_key[1] == (f._replace(device="cpu"),)
