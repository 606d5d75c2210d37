"""``max_graphs=None`` (the default): a graph per Python value and mode, up to 8 (``_variants``).

Every test is differential: the wrapper and the plain function are called on the same inputs
(fresh copies of the state where the function changes it), and what a user sees is compared.
The calls alternate from the first one, as TorchRL's TD3 update does with ``update_actor``.
"""

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from torch import nn

from graphmodule import CudaGraphModule, InputMismatchError

LIMIT_ADVICE = (
    "To fix: max_graphs=None (the default) keeps a graph for each of up to 8 calls that differ only in Python "
    "values (non-tensor arguments) and modes, and this call would be one more: pass a value that changes from "
    "call to call as a tensor, max_graphs=N to keep up to N graphs, or on_graph_limit='evict' to replace the "
    "least recently used graph.\n"
    "(tensordict.nn.CudaGraphModule's words: Varying inputs must be torch.Tensor subclasses.)"
)


# -- TD3's update: one train step, its actor updated every other call ----------------------
def _td3():
    torch.manual_seed(0)
    actor = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1), nn.Tanh())
    critic = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    # capturable on CUDA; fused on a CPU, where capturable is refused (both keep the step count on the
    # device: a plain Adam reads it on the host, which a capture refuses)
    step = {"capturable": True} if torch.get_default_device().type == "cuda" else {"fused": True}
    actor_opt = torch.optim.Adam(actor.parameters(), lr=1e-2, **step)
    critic_opt = torch.optim.Adam(critic.parameters(), lr=1e-2, **step)

    def update(td, update_actor):
        critic_opt.zero_grad()
        q = critic(torch.cat([td["obs"], td["action"]], -1))
        loss_q = (q - td["target"]).pow(2).mean()
        loss_q.backward()
        critic_opt.step()
        out = {"loss_qvalue": loss_q.detach()}
        if update_actor:  # (TorchRL: policy_update_delay=2)
            actor_opt.zero_grad()
            loss_actor = -critic(torch.cat([td["obs"], actor(td["obs"])], -1)).mean()
            loss_actor.backward()
            actor_opt.step()
            out["loss_actor"] = loss_actor.detach()
        return out

    return update, (actor, critic)


def _batch(i):
    gen = torch.Generator().manual_seed(i)  # (on the CPU, whatever the default device)
    data = {key: torch.randn(16, n, generator=gen, device="cpu") for key, n in (("obs", 3), ("action", 1), ("target", 1))}
    return TensorDict(data, batch_size=[16]).to(torch.get_default_device())


class TestTD3Update:
    def test_params_after_every_call_are_the_plain_loops(self, graph_backend):
        update, modules = _td3()
        plain, plain_modules = _td3()  # the same seed: the same parameters
        g = CudaGraphModule(update, warmup=2, backend=graph_backend)
        for i in range(12):
            update_actor = i % 2 == 0
            out, want = g(_batch(i), update_actor), plain(_batch(i), update_actor)
            assert list(out) == list(want)
            for key in want:
                torch.testing.assert_close(out[key], want[key], rtol=1e-4, atol=1e-5)
            for module, twin in zip(modules, plain_modules):
                for (name, p), q in zip(module.named_parameters(), twin.parameters()):
                    torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=f"call {i}: {name}")
        stats = g.stats
        assert (stats.graphs, stats.captures, stats.input_mismatches, stats.warmup_calls) == (2, 2, 0, 4)

    def test_each_value_warms_up_on_its_own_calls(self, graph_backend):
        """Two signatures alternating from the first call, warmup=2: each is captured at its
        own third call (the first one's at call 5, not at call 3 after one warmup call)."""
        def f(x, flag):
            return x * 2 if flag else x - 1

        g = CudaGraphModule(f, warmup=2, backend=graph_backend)
        x = torch.ones(3)
        states = []
        for i in range(10):
            flag = i % 2 == 0
            torch.testing.assert_close(g(x, flag), x * 2 if flag else x - 1)
            stats = g.stats
            states.append((str(g.state), stats.warmup_calls, stats.captures))
        assert states == [("warmup", 1, 0), ("warmup", 2, 0), ("warmup", 3, 0), ("warmup", 4, 0),
                          ("captured", 4, 1), ("captured", 4, 2)] + [("captured", 4, 2)] * 4

    def test_a_warmup_call_that_raises_is_not_counted(self, graph_backend):
        fault = {"on": True}

        def f(x, flag):
            if fault["on"]:
                raise RuntimeError("warmup fault")
            return x * 2 if flag else x - 1

        g = CudaGraphModule(f, warmup=2, backend=graph_backend)
        x = torch.ones(3)
        for flag in (True, False):
            with pytest.raises(RuntimeError, match="warmup fault"):
                g(x, flag)
        assert (str(g.state), g.stats.warmup_calls) == ("warmup", 0)
        fault["on"] = False
        for i in range(6):
            flag = i % 2 == 0
            torch.testing.assert_close(g(x, flag), f(x, flag))
        assert (g.stats.warmup_calls, g.stats.captures) == (4, 2)

    def test_alternating_values_replay_without_the_slow_path(self, slow_calls):
        g = CudaGraphModule(lambda x, flag: x * 2 if flag else x - 1, warmup=1, backend="simulate")
        x = torch.ones(3)
        for i in range(10):  # (the second graph's next call captures it again, to lend: see outputs.md)
            g(x, i % 2 == 0)
        slow = slow_calls(g)
        for i in range(20):
            torch.testing.assert_close(g(x, i % 2 == 0), x * 2 if i % 2 == 0 else x - 1)
        assert slow == [] and g.stats.replays == 28


class TestValuesAndModes:
    def test_an_int_flag_with_three_values(self, graph_backend):
        def f(x, k):
            return x * k if k else x.neg()

        g = CudaGraphModule(f, warmup=1, backend=graph_backend)
        x = torch.arange(3.0)
        for i in range(15):
            k = i % 3
            torch.testing.assert_close(g(x + i, k), f(x + i, k))
        assert (g.stats.graphs, g.stats.captures, g.stats.warmup_calls) == (3, 3, 3)

    @settings(max_examples=25, deadline=None)
    @given(st.lists(st.sampled_from([True, False, 1, 0, None, "a", 2.5]), min_size=1, max_size=40))
    def test_any_sequence_of_values_gives_the_plain_results(self, values):
        """Values that share a call key (True and 1, False and 0 hash alike) cost a scan, never
        a wrong graph; fewer than 8 values are all served."""
        def f(x, v):
            return x * 3 if v is True else x + (1 if v == 1 else 0) if v is not None else x - 5

        g = CudaGraphModule(f, warmup=1, backend="simulate")
        x = torch.arange(3.0)
        for v in values:
            out, want = g(x, v), f(x, v)
            assert torch.equal(out, want)
        assert g.stats.input_mismatches == 0 and g.stats.graphs <= len(set(map(repr, values)))

    def test_none_or_a_value(self, graph_backend):
        def f(x, scale=None):
            return x if scale is None else x * scale

        g = CudaGraphModule(f, warmup=1, backend=graph_backend)
        x = torch.arange(3.0)
        for i in range(8):
            scale = None if i % 2 else 2.0
            out = g(x, scale=scale)
            want = f(x, scale=scale)
            torch.testing.assert_close(out, want)
            assert (out is x) == (want is x)  # returns its input where eager does
        assert g.stats.graphs == 2

    def test_a_non_tensor_entry_of_a_tensordict(self, graph_backend):
        def f(td):
            return td["x"] * 2 if td["mode"] == "double" else td["x"] + 1

        g = CudaGraphModule(f, warmup=1, backend=graph_backend)
        for i in range(8):
            td = TensorDict({"x": torch.full((2,), float(i)), "mode": "double" if i % 2 else "add"}, batch_size=[2])
            torch.testing.assert_close(g(td), f(td))
        assert g.stats.graphs == 2

    def test_stats_and_explain_show_each_value(self):
        g = CudaGraphModule(lambda x, flag: x * 2 if flag else x - 1, warmup=1, backend="simulate")
        x = torch.ones(3)
        for flag in (True, False, True, False, True):
            g(x, flag)
        assert (g.stats.graphs, g.stats.captures, g.stats.warmup_calls) == (2, 2, 2)
        text = g.explain().splitlines()
        assert [line for line in text[1:] if "outputs" not in line] == [
            "graph 0 inputs:",
            "  args[0]: a tensor of shape (3,), torch.float32 on cpu",
            "  args[1]: constant True",
            "graph 1 inputs:",
            "  args[0]: a tensor of shape (3,), torch.float32 on cpu",
            "  args[1]: constant False",
        ]


class TestRefused:
    def _eight(self, graph_backend, **options):
        g = CudaGraphModule(lambda x, k: x * k, warmup=1, backend=graph_backend, **options)
        x = torch.ones(3)
        for k in range(8):
            for _ in range(2):  # its warmup call, then its capture
                torch.testing.assert_close(g(x, k), x * k)
        return g, x

    def test_a_ninth_value_names_the_limit(self, graph_backend):
        g, x = self._eight(graph_backend)
        with pytest.raises(InputMismatchError) as info:
            g(x, 8)
        assert str(info.value) == (
            "CudaGraphModule(<lambda>) was captured with other inputs than this call's (1 mismatch):\n"
            "  args[1]: expected value 7, got 8\n" + LIMIT_ADVICE
        )
        assert (g.stats.graphs, g.stats.input_mismatches) == (8, 1)
        torch.testing.assert_close(g(x, 3), x * 3)  # the wrapper is unchanged by the error

    def test_a_ninth_value_before_any_capture_names_the_limit(self, graph_backend):
        """A value that changes at every call (a step counter) never repeats to be captured:
        refused at the ninth, not run eagerly for ever."""
        g = CudaGraphModule(lambda x, step: x + step, warmup=2, backend=graph_backend)
        x = torch.ones(3)
        for step in range(8):
            torch.testing.assert_close(g(x, step), x + step)
        with pytest.raises(InputMismatchError) as info:
            g(x, 8)
        assert str(info.value) == (
            "CudaGraphModule(<lambda>) was warmed up with other inputs than this call's (1 mismatch):\n"
            "  args[1]: expected value 7, got 8\n" + LIMIT_ADVICE
        )
        assert (str(g.state), g.stats.warmup_calls) == ("warmup", 8)

    def test_a_ninth_value_evicts_with_on_graph_limit_evict(self, graph_backend):
        g, x = self._eight(graph_backend, on_graph_limit="evict")
        g(x, 0)  # 1 is now the least recently used
        for _ in range(2):
            torch.testing.assert_close(g(x, 8), x * 8)
        assert (g.stats.graphs, g.stats.evictions) == (8, 1)
        replays = g.stats.replays
        g(x, 0)
        assert g.stats.replays == replays + 1
        g(x, 1)  # evicted: warms up again
        assert g.stats.replays == replays + 1

    def test_a_float64_input_is_refused_as_in_the_readme(self, graph_backend):
        g = CudaGraphModule(lambda x, y: x * y + 1, backend=graph_backend)
        x, y = torch.ones(3), torch.full((3,), 2.0)
        for _ in range(4):
            g(x, y)
        with pytest.raises(InputMismatchError) as info:
            g(x, y.double())
        assert str(info.value) == (
            "CudaGraphModule(<lambda>) was captured with other inputs than this call's (1 mismatch):\n"
            "  args[1]: expected dtype torch.float32, got torch.float64\n"
            "To fix: copying into the graph's buffer would cast silently: convert the input with .to(dtype) "
            "before the call."
        )

    def test_other_tensors_are_explained_against_the_graph_of_the_same_value(self):
        g = CudaGraphModule(lambda x, flag: x * 2 if flag else x - 1, warmup=1, backend="simulate")
        x = torch.ones(3)
        for flag in (True, False, True, False):
            g(x, flag)
        g(x, False)  # the most recently used graph is False's
        with pytest.raises(InputMismatchError) as info:
            g(torch.ones(4), True)
        assert [m.describe() for m in info.value.mismatches] == ["args[0]: expected shape (3,), got (4,)"]

    def test_other_tensors_replace_every_graph_with_on_graph_limit_evict(self):
        g = CudaGraphModule(lambda x, flag: x * 2 if flag else x - 1, warmup=1, backend="simulate",
                            on_graph_limit="evict")
        for flag in (True, False, True, False):
            g(torch.ones(3), flag)
        for flag in (True, True, False, False):
            y = torch.ones(4)
            torch.testing.assert_close(g(y, flag), y * 2 if flag else y - 1)
        assert (g.stats.graphs, g.stats.evictions) == (2, 2)
        assert [line for line in g.explain().splitlines() if "args[0]" in line] == [
            "  args[0]: a tensor of shape (4,), torch.float32 on cpu"] * 2

    def test_max_graphs_1_refuses_another_value(self, graph_backend):
        g = CudaGraphModule(lambda x, flag: x * 2 if flag else x - 1, warmup=1, backend=graph_backend,
                            max_graphs=1)
        x = torch.ones(3)
        g(x, True)
        g(x, True)
        with pytest.raises(InputMismatchError) as info:
            g(x, False)
        assert str(info.value) == (
            "CudaGraphModule(<lambda>) was captured with other inputs than this call's (1 mismatch):\n"
            "  args[1]: expected value True, got False\n"
            "To fix: non-tensor arguments are baked into the graph at capture: pass a value that changes as a "
            "tensor, or use one CudaGraphModule per value.\n"
            "(tensordict.nn.CudaGraphModule's words: Varying inputs must be torch.Tensor subclasses.)"
        )

    def test_repr_shows_an_explicit_max_graphs(self):
        def policy(x):
            return x

        assert repr(CudaGraphModule(policy, backend="simulate", max_graphs=1)) == (
            f"CudaGraphModule({policy!r}, warmup=2, in_keys=None, out_keys=None, device=None, max_graphs=1, "
            "backend='simulate')"
        )
        assert "max_graphs=" not in repr(CudaGraphModule(policy, backend="simulate"))
        copied = copy.deepcopy(CudaGraphModule(policy, backend="simulate", max_graphs=3))
        assert copied.options.max_graphs == 3

