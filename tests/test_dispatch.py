"""TensorDict modules: keys, calling conventions, writing outputs back."""

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn

from graphmodule import CudaGraphModule, InputMismatchError, MissingKeyError

BACKENDS = ["simulate", "eager"]


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def _policy():
    torch.manual_seed(0)
    return TensorDictSequential(
        TensorDictModule(nn.Linear(6, 8), in_keys=[("agent", "obs")], out_keys=["hidden"]),
        TensorDictModule(nn.Tanh(), in_keys=["hidden"], out_keys=[("agent", "action")]),
    )


class TestKeys:
    def test_keys_come_from_the_module(self, make):
        policy = _policy()
        g = make(policy)
        assert g.in_keys == [("agent", "obs")]
        assert g.out_keys == ["hidden", ("agent", "action")]

    def test_explicit_keys_that_differ_from_the_modules_warn(self, make):
        module = TensorDictModule(nn.Identity(), in_keys=["x"], out_keys=["y"])
        with pytest.warns(UserWarning, match=r"ignores in_keys=\['z'\]: the module has its own in_keys=\['x'\]"):
            g = make(module, in_keys=["z"])
        assert g.in_keys == ["x"]

    def test_function_with_in_keys_defaults_out_keys_to_empty(self, make):
        g = make(lambda td: td, in_keys=["x"])
        assert (g.in_keys, g.out_keys) == (["x"], [])

    def test_plain_function_has_no_keys(self, make):
        g = make(lambda x: x)
        assert (g.in_keys, g.out_keys) == (None, None)


class TestTensorDictCall:
    def test_outputs_are_written_into_the_callers_tensordict(self, make, backend):
        policy = _policy()
        g = make(policy, backend=backend)
        with torch.no_grad():
            for _ in range(5):
                td = TensorDict({"agent": {"obs": torch.randn(4, 6)}, "reward": torch.zeros(4, 1)}, [4])
                assert g(td) is td
                want = policy(td.select(("agent", "obs")).clone())
                torch.testing.assert_close(td["agent", "action"], want["agent", "action"])
                torch.testing.assert_close(td["hidden"], want["hidden"])
                torch.testing.assert_close(td["reward"], torch.zeros(4, 1))

    def test_extra_keys_are_ignored_and_missing_in_keys_are_named(self, make, backend):
        module = TensorDictModule(lambda x: x + 1, in_keys=["x"], out_keys=["y"])
        g = make(module, warmup=1, backend=backend)
        g(TensorDict(x=torch.zeros(2)))
        g(TensorDict(x=torch.zeros(2), other=torch.zeros(5)))
        out = g(TensorDict(x=torch.ones(2), more=torch.zeros(1)))
        torch.testing.assert_close(out["y"], torch.full((2,), 2.0))
        with pytest.raises(InputMismatchError) as info:
            g(TensorDict(z=torch.zeros(2)))
        assert [m.describe() for m in info.value.mismatches] == [
            "tensordict['x']: missing (expected a tensor of shape (2,), torch.float32 on cpu)"
        ]

    def test_batch_size_and_leaf_shape_reported_together(self, make, backend):
        module = TensorDictModule(nn.Linear(3, 2), in_keys=["obs"], out_keys=["act"])
        g = make(module, warmup=1, backend=backend)
        with torch.no_grad():
            g(TensorDict(obs=torch.randn(4, 3), batch_size=[4]))
            g(TensorDict(obs=torch.randn(4, 3), batch_size=[4]))
            with pytest.raises(InputMismatchError) as info:
                g(TensorDict(obs=torch.randn(5, 3), batch_size=[5]))
        assert [m.describe() for m in info.value.mismatches] == [
            "tensordict: expected batch_size (4,), got (5,)",
            "tensordict['obs']: expected shape (4, 3), got (5, 3)",
        ]

    def test_recurrent_module_reads_its_new_input_each_call(self, make, backend):
        module = TensorDictModule(lambda h: h * 0.5 + 1, in_keys=["h"], out_keys=["h"])
        g = make(module, warmup=1, backend=backend)
        td, ref = TensorDict(h=torch.zeros(2)), TensorDict(h=torch.zeros(2))
        for _ in range(6):
            g(td)
            module(ref)
            torch.testing.assert_close(td["h"], ref["h"])

    def test_locked_tensordict_raises_like_eager(self, make):
        module = TensorDictModule(lambda x: x + 1, in_keys=["x"], out_keys=["y"])
        g = make(module, warmup=1)
        g(TensorDict(x=torch.zeros(2)))
        g(TensorDict(x=torch.zeros(2)))
        with pytest.raises(RuntimeError, match="locked"):
            g(TensorDict(x=torch.zeros(2)).lock_())


class TestKeywordCall:
    def test_returns_the_out_keys(self, make, backend):
        module = TensorDictModule(lambda obs, h: (obs * 2 + h, h + 1), in_keys=["obs", "h"], out_keys=["act", "h"])
        g = make(module, warmup=1, backend=backend)
        for _ in range(4):
            obs, h = torch.randn(3), torch.randn(3)
            act, h_next = g(obs=obs, h=h)
            torch.testing.assert_close(act, obs * 2 + h)
            torch.testing.assert_close(h_next, h + 1)

    def test_nested_key_by_separator(self, make, backend):
        module = TensorDictModule(lambda x: x * 3, in_keys=[("agent", "obs")], out_keys=["act"])
        g = make(module, warmup=1, backend=backend)
        for _ in range(3):
            x = torch.randn(2)
            torch.testing.assert_close(g(agent_obs=x), x * 3)

    def test_a_positional_tensor_is_passed_on_as_eagerly(self, make, backend):
        # tensordict's dispatch puts the tensor in a TensorDict under the in_key; the wrapper
        # then takes the TensorDict's path once (no dispatch again): captured and replayed
        module = TensorDictModule(nn.Linear(4, 2), in_keys=["x"], out_keys=["y"])
        g = make(module, warmup=1, backend=backend)
        for _ in range(4):
            x = torch.randn(3, 4)
            got, want = g(x), module(x)
            assert type(got) is type(want)
            torch.testing.assert_close(got, want)
        if backend == "simulate":
            assert g.stats.replays == 3  # the capturing call's and the last two calls'

    def test_missing_keyword_is_named(self, make):
        module = TensorDictModule(lambda a, b: a + b, in_keys=["a", "b"], out_keys=["c"])
        g = make(module, warmup=1)
        g(a=torch.zeros(1), b=torch.zeros(1))
        g(a=torch.zeros(1), b=torch.zeros(1))
        with pytest.raises(MissingKeyError) as info:
            g(a=torch.zeros(1))
        assert isinstance(info.value, KeyError) and isinstance(info.value, InputMismatchError)
        assert str(info.value).splitlines() == [
            "CudaGraphModule(TensorDictModule) was captured with other inputs than this call's (1 mismatch):",
            "  tensordict['b']: missing (expected a tensor of shape (1,), torch.float32 on cpu)",
            "To fix: pass the same containers, keys and number of arguments as at capture "
            "(keyword arguments are matched by name).",
            "(tensordict.nn.CudaGraphModule's words: CudaGraphModule input is missing the in_keys "
            "['b'] that the captured graph reads.)",
        ]

    def test_missing_at_capture_is_the_modules_own_error(self, make):
        # eagerly the module raises for a missing in_key; the capturing call does the same
        module = TensorDictModule(lambda a, b: a + b, in_keys=["a", "b"], out_keys=["c"])
        g = make(module, warmup=1)
        g(a=torch.zeros(1), b=torch.zeros(1))
        with pytest.raises(KeyError) as info:
            g(a=torch.zeros(1))
        with pytest.raises(KeyError) as eager:
            module(a=torch.zeros(1))
        assert type(info.value) is type(eager.value) and str(info.value) == str(eager.value)
        assert g.state == "warmup"


class TestTensordictOut:
    def test_outputs_go_to_tensordict_out_only(self, make, backend):
        module = TensorDictModule(lambda x: x + 1, in_keys=["x"], out_keys=["y"])
        g = make(module, warmup=1, backend=backend)
        for _ in range(4):
            td, out = TensorDict(x=torch.randn(2)), TensorDict()
            assert g(td, tensordict_out=out) is out
            assert "y" not in td.keys()
            torch.testing.assert_close(out["y"], td["x"] + 1)
        if backend == "simulate":
            # calls with tensordict_out replay the graph too: the capturing call's replay and
            # the last two calls'
            assert g.stats.replays == 3


class TestEmptyInKeys:
    def test_function_returning_its_input_keeps_identity(self, make, backend):
        def fn(td):
            td["y"] = td["x"].exp()
            return td

        g = make(fn, in_keys=[], out_keys=[], backend=backend)
        for _ in range(5):
            td = TensorDict(x=torch.randn(3))
            assert g(td) is td
            torch.testing.assert_close(td["y"], td["x"].exp())

    def test_function_returning_a_new_tensordict(self, make, backend):
        g = make(lambda td: TensorDict(z=td["x"] * 3), in_keys=[], warmup=1, backend=backend)
        outs = [g(TensorDict(x=torch.full((2,), float(i)))) for i in range(4)]
        for i, out in enumerate(outs):
            torch.testing.assert_close(out["z"], torch.full((2,), 3.0 * i))

    def test_deleted_key_is_deleted_in_the_callers_tensordict(self, make, backend):
        def fn(td):
            del td["tmp"]
            td["y"] = td["x"] + 1
            return td

        g = make(fn, in_keys=[], warmup=1, backend=backend)
        for _ in range(3):
            td = TensorDict(x=torch.zeros(1), tmp=torch.zeros(1))
            g(td)
            assert set(td.keys()) == {"x", "y"}


class TestTensorDictArgumentOfAPlainFunction:
    def test_keys_must_match_exactly(self, make, backend):
        g = make(lambda td, k: td["a"] * k + td["b", "c"], warmup=1, backend=backend)

        def make_td():
            return TensorDict({"a": torch.randn(2), "b": {"c": torch.randn(2)}}, [2])

        for _ in range(3):
            td = make_td()
            torch.testing.assert_close(g(td, 2), td["a"] * 2 + td["b", "c"])
        with pytest.raises(InputMismatchError) as info:
            g(make_td().set("extra", torch.zeros(2)), 2)
        assert [m.describe() for m in info.value.mismatches] == [
            "args[0]['extra']: not in the captured inputs (got a tensor of shape (2,), torch.float32 on cpu)"
        ]
        with pytest.raises(InputMismatchError, match=r"args\[0\]\['b', 'c'\]: missing"):
            g(TensorDict({"a": torch.randn(2), "b": {}}, [2]), 2)

    def test_non_tensor_entries_are_constants(self, make, backend):
        # (max_graphs=1: by default another value gets a graph of its own, see test_variants)
        g = make(lambda td: td["x"] * (2 if td["mode"] == "double" else 1), warmup=1, backend=backend, max_graphs=1)
        td = TensorDict(x=torch.ones(2), mode="double", batch_size=[2])
        for _ in range(3):
            torch.testing.assert_close(g(td), torch.full((2,), 2.0))
        with pytest.raises(InputMismatchError, match=r"args\[0\]\['mode'\]: expected value 'double', got 'single'"):
            g(TensorDict(x=torch.ones(2), mode="single", batch_size=[2]))


def _linear_policy(backend):
    """A TensorDict module, and its wrapper."""
    torch.manual_seed(0)
    module = TensorDictModule(nn.Linear(3, 2), in_keys=["obs"], out_keys=["act"])
    return module, CudaGraphModule(module, warmup=1, backend=backend)


def _obs(k):
    return torch.full((5, 3), float(k))


class TestBothCallingConventions:
    """One TensorDict module called with a TensorDict and with keywords (or a positional
    tensor), in either order, as tensordict's wrapper and the plain module accept."""

    def test_keyword_call_after_tensordict_calls(self, backend):
        module, g = _linear_policy(backend)
        with torch.no_grad():
            for k in range(3):
                td = TensorDict(obs=_obs(k), batch_size=[5])
                assert g(td) is td
            torch.testing.assert_close(g(obs=_obs(7)), module(obs=_obs(7)))
            td = TensorDict(obs=_obs(8), batch_size=[5])
            assert g(td) is td
            torch.testing.assert_close(td["act"], module(obs=_obs(8)))

    def test_tensordict_call_after_keyword_calls(self, backend):
        module, g = _linear_policy(backend)
        with torch.no_grad():
            for k in range(3):
                torch.testing.assert_close(g(obs=_obs(k)), module(obs=_obs(k)))
            td, td_eager = TensorDict(obs=_obs(7), batch_size=[5]), TensorDict(obs=_obs(7), batch_size=[5])
            assert g(td) is td
            module(td_eager)
            assert (td == td_eager).all()

    def test_positional_tensor_after_tensordict_calls(self, backend):
        module, g = _linear_policy(backend)
        with torch.no_grad():
            for k in range(3):
                g(TensorDict(obs=_obs(k), batch_size=[5]))
            torch.testing.assert_close(g(_obs(7)), module(_obs(7)))

    def test_a_tensor_where_a_tensordict_was_captured_is_named(self):
        # a function taking a TensorDict (in_keys=[]) is called with a tensor: not servable
        # (the plain function fails), and the message says what differs
        g = CudaGraphModule(lambda td: td["a"] * 2, in_keys=[], warmup=1, backend="simulate")
        for k in range(3):
            g(TensorDict(a=_obs(k), batch_size=[5]))
        with pytest.raises(InputMismatchError) as info:
            g(_obs(7))
        assert str(info.value).splitlines() == [
            "CudaGraphModule(<lambda>) was captured with other inputs than this call's (1 mismatch):",
            "  tensordict: expected type a TensorDict, got a tensor of shape (5, 3), torch.float32 on cpu",
            "To fix: pass the same kinds of values as at capture (a tensor where a tensor was captured).",
        ]

    def test_a_keyword_call_of_another_shape_is_refused_without_a_batch_size_it_did_not_choose(self):
        _, g = _linear_policy("simulate")
        with torch.no_grad():
            for k in range(3):
                g(TensorDict(obs=_obs(k), batch_size=[5]))
            with pytest.raises(InputMismatchError) as info:
                g(obs=torch.zeros(4, 3))
        assert str(info.value).splitlines()[:2] == [
            "CudaGraphModule(TensorDictModule) was captured with other inputs than this call's (1 mismatch):",
            "  tensordict['obs']: expected shape (5, 3), got (4, 3)",
        ]

    @staticmethod
    def _sequential():
        torch.manual_seed(0)
        return TensorDictSequential(
            TensorDictModule(nn.Linear(3, 4), in_keys=["obs"], out_keys=["hidden"]),
            TensorDictModule(nn.Linear(4, 2), in_keys=["hidden"], out_keys=[("next", "act")]),
        )

    @staticmethod
    def _td(k, batch_size=(5,)):
        # other entries, and a nested TensorDict the module's nested out_key writes into
        return TensorDict(obs=_obs(k), other=torch.ones(5), next=TensorDict(keep=torch.zeros(5), batch_size=[5]),
                          batch_size=batch_size)

    @pytest.mark.parametrize("first", ["keywords", "tensordict"])
    def test_a_sequence_writing_nested_keys_in_both_styles(self, backend, first):
        module = self._sequential()
        g = CudaGraphModule(module, warmup=1, backend=backend)
        with torch.no_grad():
            for k in range(6):
                if (k < 3) == (first == "keywords"):
                    got, want = g(obs=_obs(k)), module(obs=_obs(k))
                    for a, b in zip(got, want):
                        torch.testing.assert_close(a, b)
                else:
                    td, td_eager = self._td(k), self._td(k)
                    assert g(td) is td
                    module(td_eager)
                    assert list(td.keys(True, True)) == list(td_eager.keys(True, True))
                    assert (td == td_eager).all()
        assert g.stats.graphs == 1 and g.stats.input_mismatches == 0

    def test_a_tensordict_whose_batch_the_outputs_do_not_fit_raises_as_eagerly(self, backend):
        # captured from keywords (batch size []), called with a TensorDict of batch size [5, 3]:
        # eagerly the module's write of "act" (5, 2) is refused by tensordict
        module, g = _linear_policy(backend)
        with torch.no_grad():
            for k in range(3):
                g(obs=_obs(k))
            with pytest.raises(RuntimeError) as eager:
                module(TensorDict(obs=_obs(7), batch_size=[5, 3]))
            with pytest.raises(RuntimeError) as ours:
                g(TensorDict(obs=_obs(7), batch_size=[5, 3]))
        assert str(ours.value) == str(eager.value)

    def test_with_room_each_style_has_its_graph(self, backend):
        module, g = _linear_policy(backend)
        g = CudaGraphModule(module, warmup=1, backend=backend, max_graphs=2)
        with torch.no_grad():
            for k in range(3):
                torch.testing.assert_close(g(obs=_obs(k)), module(obs=_obs(k)))
            for k in range(3):
                td = TensorDict(obs=_obs(k), batch_size=[5])
                assert g(td) is td
                torch.testing.assert_close(td["act"], module(obs=_obs(k)))
            torch.testing.assert_close(g(obs=_obs(9)), module(obs=_obs(9)))
        assert g.stats.graphs == 2

    @pytest.mark.cuda
    @pytest.mark.parametrize("first", ["keywords", "tensordict"])
    def test_both_styles_on_cuda_graphs(self, first):
        # real capture: a keyword call's TensorDict is the module's own, the stand-in's writes
        # (lent buffers) land in the caller's TensorDict, and hold their values across replays
        module = self._sequential().cuda()
        g = CudaGraphModule(module, warmup=1, backend="cuda")
        held = []
        with torch.no_grad():
            for k in range(6):
                obs = _obs(k).cuda()
                if (k < 3) == (first == "keywords"):
                    got = g(obs=obs)
                    held.append((got, module(obs=obs)))
                else:
                    td = self._td(k).cuda()
                    ref = td.clone()
                    assert g(td) is td
                    module(ref)
                    held.append((td, ref))
            for got, want in held:
                if isinstance(want, tuple):
                    for a, b in zip(got, want):
                        torch.testing.assert_close(a, b)
                else:
                    assert (got == want).all()
        assert g.stats.graphs == 1 and g.stats.captures == 1
