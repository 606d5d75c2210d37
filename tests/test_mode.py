"""Modes a graph bakes in (grad mode, train/eval, interaction type, autocast), and graphs per signature."""

import contextlib
import threading

import pytest
import torch
from tensordict.nn import InteractionType, set_interaction_type
from torch import nn

from graphmodule import CudaGraphModule, InputMismatchError, UnsupportedError
from graphmodule import _dictwatch
from graphmodule._mode import ModeReader

X = torch.ones(2, 3)


def _make(fn, **options):
    return CudaGraphModule(fn, warmup=1, backend="simulate", **options)


class TestModes:
    """With ``max_graphs=1`` a mode switch is refused, naming the mode (by default it gets a
    graph of its own: ``TestModesServedByDefault``)."""

    def test_grad_mode_is_part_of_the_signature(self):
        net = nn.Linear(3, 3)
        g = _make(net, max_graphs=1)
        with torch.no_grad():
            g(X)
            g(X)
        with pytest.raises(InputMismatchError) as info:
            g(X)
        assert [m.describe() for m in info.value.mismatches] == [
            "torch.is_grad_enabled(): expected grad_mode disabled (torch.no_grad()), got enabled"
        ]

    def test_a_submodule_switched_to_eval(self):
        net = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))
        g = _make(net, max_graphs=1)
        with torch.no_grad():
            g(X)
            g(X)
            net[1].eval()  # only the dropout: the root is still in train mode
            with pytest.raises(InputMismatchError) as info:
                g(X)
        assert [m.describe() for m in info.value.mismatches] == [
            "module.1.training: expected mode train mode, got eval mode"
        ]

    def test_interaction_type(self):
        g = _make(lambda x: x * 2, max_graphs=1)
        with set_interaction_type(InteractionType.RANDOM):
            g(X)
            g(X)
        with set_interaction_type(InteractionType.DETERMINISTIC), pytest.raises(InputMismatchError) as info:
            g(X)
        assert info.value.mismatches[0].kind == "interaction_type"

    def test_one_graph_per_mode_with_max_graphs(self):
        net = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))
        g = _make(net, max_graphs=2)
        with torch.no_grad():
            for training in (True, True, False, False, True, False):
                net.train(training)
                out = g(X)
                if not training:
                    torch.testing.assert_close(out, net(X))
        assert g.stats.captures == 2 and g.stats.graphs == 2


class TestModesServedByDefault:
    """By default (``max_graphs=None``) a call under another mode gets a graph of its own, as
    eagerly each mode runs its own branch; the modes alternate from the first call."""

    def _check(self, graph_backend, enter, fn, expected_graphs=2, steps=10):
        g = CudaGraphModule(fn, warmup=2, backend=graph_backend)
        for step in range(steps):
            x = torch.full((2, 3), float(step))
            with enter(step % 2):
                out = g(x)
                want = fn(x)
            assert out.dtype == want.dtype and out.requires_grad == want.requires_grad
            assert out.is_inference() == want.is_inference()
            torch.testing.assert_close(out.detach(), want.detach())
        stats = g.stats
        assert (stats.graphs, stats.captures, stats.input_mismatches) == (expected_graphs, expected_graphs, 0)
        assert stats.warmup_calls == 2 * expected_graphs  # each mode warmed up on its own calls
        return g

    def test_grad_mode(self, graph_backend):
        net = nn.Linear(3, 3)
        self._check(graph_backend, lambda odd: torch.no_grad() if odd else contextlib.nullcontext(), net)

    def test_inference_mode(self, graph_backend):
        net = nn.Linear(3, 3)
        self._check(graph_backend, lambda odd: torch.inference_mode() if odd else torch.no_grad(), net)

    def test_train_and_eval(self, graph_backend):
        net = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))

        @contextlib.contextmanager
        def mode(odd):
            net.train(not odd)
            with torch.no_grad():
                yield

        torch.manual_seed(0)
        g = CudaGraphModule(net, warmup=2, backend=graph_backend)
        for step in range(10):
            x = torch.full((2, 3), float(step))
            with mode(step % 2):
                out = g(x)
                if step % 2:  # eval: deterministic, the eager value
                    torch.testing.assert_close(out, net(x))
                else:  # train: dropout's zeros, scaled by 2 elsewhere
                    kept = out != 0
                    torch.testing.assert_close(out[kept], (net[0](x) * 2)[kept])
        assert (g.stats.graphs, g.stats.captures, g.stats.warmup_calls) == (2, 2, 4)

    def test_interaction_type(self, graph_backend):
        def fn(x):
            return x * 2 if str(InteractionType.RANDOM) == str(_current_interaction()) else x - 1

        types = (InteractionType.RANDOM, InteractionType.DETERMINISTIC)
        self._check(graph_backend, lambda odd: set_interaction_type(types[odd]), fn)

    def test_autocast(self, graph_backend):
        net = nn.Linear(3, 3)

        def enter(odd):
            stack = contextlib.ExitStack()
            stack.enter_context(torch.no_grad())
            if odd:
                stack.enter_context(_autocast(cache_enabled=False))
            return stack

        self._check(graph_backend, enter, net)


def _current_interaction():
    from tensordict.nn.probabilistic import interaction_type

    return interaction_type()


def _net():
    return nn.Sequential(nn.Linear(3, 3), nn.Sequential(nn.Dropout(0.5), nn.ReLU()))


# every way a module's mode changes, and changes that leave it as it was
MODE_CHANGES = {
    "eval()": lambda net: net.eval(),
    "train()": lambda net: net.train(),
    "train(False) on a child": lambda net: net[1].train(False),
    "attribute": lambda net: setattr(net[1][0], "training", False),
    "object.__setattr__": lambda net: object.__setattr__(net[0], "training", False),
    "__dict__ item": lambda net: vars(net[1][1]).__setitem__("training", False),
    "__dict__.update": lambda net: vars(net).update(training=False),
    "another attribute": lambda net: setattr(net[0], "note", 1),
    "nothing": lambda net: None,
}


class TestModeReader:
    @pytest.mark.parametrize("change", list(MODE_CHANGES))
    def test_reads_what_every_module_holds_now(self, change):
        """With dict watchers (CPython 3.12+) the modes are cached until a module's __dict__
        changes; without, read every call: either way, what every module holds now."""
        net = _net()
        modules = list(net.modules())
        reader = ModeReader(modules, [str(i) for i in range(len(modules))])
        for _ in range(2):  # the first read fills the cache, the second uses it
            assert reader.read()[2] == tuple(m.training for m in modules)
        for step in (MODE_CHANGES[change], lambda n: n.train(), MODE_CHANGES[change]):
            step(net)
            assert reader.read()[2] == tuple(m.training for m in modules)
            assert reader.read()[2] == tuple(m.training for m in modules)

    def test_cached_where_dict_watchers_see_instance_dicts(self):
        net = _net()
        reader = ModeReader(list(net.modules()), ["m"] * 4)
        watched = _dictwatch.available() and _dictwatch.watchable({}, instance_dict=True)
        assert (reader._flag is not None) == watched
        if watched:
            reader.read()
            vars(net[0])["training"] = "sentinel"  # raises the flag: read again
            assert reader.read()[2][1] == "sentinel"
            reader._modes = ("cached",)  # nothing changed since: the cache is what read returns
            assert reader.read()[2] == ("cached",)

    def test_a_mode_switch_between_replays_is_refused(self):
        net = _net()
        g = _make(net, max_graphs=1)
        with torch.no_grad():
            for _ in range(3):
                g(X)
            net[1][0].training = False  # a plain attribute store, as eval() makes
            with pytest.raises(InputMismatchError, match=r"module\.1\.0\.training: expected mode train mode, got eval mode"):
                g(X)
            net[1][0].training = True
            replays = g.stats.replays
            assert g(X).shape == (2, 3) and g.stats.replays == replays + 1


class TestGraphsPerSignature:
    def test_new_shapes_warm_up_then_capture(self):
        g = _make(lambda x: x * 2, max_graphs=3)
        for n in (2, 2, 3, 3, 3, 2, 4, 4):
            torch.testing.assert_close(g(torch.ones(n)), torch.full((n,), 2.0))
        assert g.stats.captures == 3 and g.stats.warmup_calls == 3

    def test_past_the_limit_a_new_signature_raises(self):
        g = _make(lambda x: x * 2, max_graphs=1)
        g(torch.ones(2))
        g(torch.ones(2))
        with pytest.raises(InputMismatchError, match=r"args\[0\]: expected shape \(2,\), got \(3,\)"):
            g(torch.ones(3))

    def test_eviction_drops_the_least_recently_used(self):
        g = _make(lambda x: x + 1, max_graphs=2, on_graph_limit="evict")
        for n in (2, 2, 3, 3, 2, 4, 4):  # 2 is used after 3, so 3 is evicted for 4
            g(torch.ones(n))
        assert g.stats.evictions == 1 and g.stats.graphs == 2
        replays = g.stats.replays
        g(torch.ones(2))  # still held: a replay
        assert g.stats.replays == replays + 1
        g(torch.ones(3))  # evicted: warms up again
        assert g.stats.replays == replays + 1

    def test_bad_max_graphs(self):
        for bad in (0, True, 2.0):
            with pytest.raises(ValueError) as info:
                _make(lambda x: x, max_graphs=bad)
            assert str(info.value) == (
                f"max_graphs must be None (a graph per Python value and mode, up to 8) or an int >= 1 (got {bad!r}).")


class TestThreads:
    def test_calls_from_two_threads_are_one_at_a_time(self):
        # replays write shared buffers: interleaved calls would mix
        g = _make(lambda x: (x * 3).sum(-1))
        g(torch.ones(4, 8))
        g(torch.ones(4, 8))
        errors = []

        def worker(value: float):
            for _ in range(300):
                x = torch.full((4, 8), value)
                if not torch.equal(g(x), torch.full((4,), value * 24)):
                    errors.append(value)

        threads = [threading.Thread(target=worker, args=(v,)) for v in (1.0, 2.0, 3.0)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []


def _autocast(cache_enabled=True):
    """torch.autocast on the device tensors land on (CUDA under graph_backend="cuda")."""
    device = torch.get_default_device().type
    dtype = torch.float16 if device == "cuda" else torch.bfloat16
    return torch.autocast(device, dtype=dtype, cache_enabled=cache_enabled)


def _autocast_text(cache_enabled):
    device = torch.get_default_device().type
    dtype = torch.float16 if device == "cuda" else torch.bfloat16
    return f"torch.autocast({device!r}, dtype={dtype}, cache_enabled={cache_enabled})"


class TestAutocast:
    """torch.autocast decides each op's dtype when the op is recorded: part of the mode."""

    def _captured(self, fn, backend, ones, autocast=None, **options):
        g = CudaGraphModule(fn, warmup=1, backend=backend, **options)
        with torch.no_grad(), (autocast if autocast is not None else contextlib.nullcontext()):
            for _ in range(3):
                g(ones)
        return g

    def test_called_under_autocast_after_a_capture_without(self, graph_backend, ones):
        net = nn.Linear(3, 3)
        g = self._captured(net, graph_backend, ones, max_graphs=1)
        with torch.no_grad(), _autocast(cache_enabled=False), pytest.raises(InputMismatchError) as info:
            g(ones)
        assert str(info.value) == (
            "CudaGraphModule(Linear) was captured with other inputs than this call's (1 mismatch):\n"
            f"  torch.autocast: expected autocast off, got {_autocast_text(False)}\n"
            "To fix: autocast decides each op's dtype when the graph is captured, so the graph replays the "
            "dtypes it captured: call it under the captured autocast state (the same torch.autocast(...) "
            "around every call), or pass max_graphs=2 to keep one graph per state."
        )

    def test_called_without_autocast_after_a_capture_under_it(self, graph_backend, ones):
        net = nn.Linear(3, 3)
        g = self._captured(net, graph_backend, ones, _autocast(cache_enabled=False), max_graphs=1)
        with torch.no_grad(), pytest.raises(InputMismatchError) as info:
            g(ones)
        assert [m.describe() for m in info.value.mismatches] == [
            f"torch.autocast: expected autocast {_autocast_text(False)}, got off"
        ]

    def test_one_graph_per_autocast_state_with_max_graphs(self, graph_backend):
        net = nn.Linear(3, 3)
        g = CudaGraphModule(net, warmup=1, backend=graph_backend, max_graphs=2)
        with torch.no_grad():
            for step in range(8):
                autocast = _autocast(cache_enabled=False) if step % 4 < 2 else contextlib.nullcontext()
                x = torch.full((2, 3), float(step))
                with autocast:
                    out, expected = g(x), net(x)
                assert out.dtype == expected.dtype
                torch.testing.assert_close(out, expected)
        assert g.stats.captures == 2 and g.stats.graphs == 2

    def test_the_cast_cache_on_is_refused_at_capture(self, graph_backend, ones):
        net = nn.Linear(3, 3)
        g = CudaGraphModule(net, warmup=1, backend=graph_backend)
        with torch.no_grad(), _autocast(cache_enabled=True):
            g(ones)
            with pytest.raises(UnsupportedError) as info:
                g(ones)
        assert str(info.value) == (
            "CudaGraphModule(Linear) cannot replay this call as a CUDA graph: expected autocast's cast cache "
            f"off around a captured call, got {_autocast_text(True)} at module.weight: autocast casts "
            "module.weight at its first use in the autocast region and reuses that cast until the region ends, "
            "even after it changes, while a replay casts it at every call.\n"
            "To fix: pass cache_enabled=False to torch.autocast (as torch.cuda.make_graphed_callables requires), "
            "or enter torch.autocast inside the wrapped function."
        )
        with torch.no_grad(), _autocast(cache_enabled=False):  # left as if the call had not been made
            for _ in range(2):  # (its own signature: a warmup call, then its capture)
                torch.testing.assert_close(g(ones), net(ones))
        assert g.stats.captures == 1

    def test_the_cast_cache_is_harmless_where_it_holds_nothing_the_graph_reads(self, graph_backend, ones):
        w = torch.randn(3, 3)  # not a leaf that requires grad: autocast does not cache its cast
        g = self._captured(lambda x: x @ w, graph_backend, ones, _autocast(cache_enabled=True))
        with torch.no_grad(), _autocast(cache_enabled=True):
            out = g(ones)
            assert out.dtype == (ones @ w).dtype and torch.equal(out, ones @ w)
        assert g.stats.captures == 1

    def test_autocast_inside_the_function_is_captured(self, graph_backend, ones):
        net = nn.Linear(3, 3)

        def fn(x):
            with _autocast(cache_enabled=True):
                return net(x)

        g = self._captured(fn, graph_backend, ones)
        with torch.no_grad():
            torch.testing.assert_close(g(ones + 1), fn(ones + 1))
            assert g(ones).dtype == fn(ones).dtype != torch.float32


class TestInferenceMode:
    """torch.inference_mode() makes inference tensors, which only inference mode may write:
    part of the mode, as grad mode is."""

    @pytest.mark.parametrize("hold", [False, True])
    def test_captured_under_inference_mode_called_under_no_grad(self, graph_backend, hold, ones):
        net = nn.Linear(3, 3)
        g = CudaGraphModule(net, warmup=1, backend=graph_backend, max_graphs=1)
        with torch.inference_mode():
            held = [g(ones) for _ in range(3)]
        if not hold:
            held.clear()
        with torch.no_grad(), pytest.raises(InputMismatchError) as info:
            g(ones)
        assert str(info.value) == (
            "CudaGraphModule(Linear) was captured with other inputs than this call's (1 mismatch):\n"
            "  torch.is_inference_mode_enabled(): expected grad_mode inference_mode (torch.inference_mode()), "
            "got disabled (torch.no_grad())\n"
            "To fix: the graph was captured under another grad mode, which decides whether its outputs track "
            "gradients (and under torch.inference_mode(), whether they are inference tensors): call it the same "
            "way (e.g. always under torch.no_grad()), or pass max_graphs=2 to keep one graph per mode."
        )

    def test_captured_under_no_grad_called_under_inference_mode_with_a_result_held(self, graph_backend, ones):
        net = nn.Linear(3, 3)
        g = CudaGraphModule(net, warmup=1, backend=graph_backend, max_graphs=1)
        with torch.no_grad():
            held = [g(ones) for _ in range(3)]
        with torch.inference_mode(), pytest.raises(InputMismatchError) as info:
            g(ones)
        assert [m.describe() for m in info.value.mismatches] == [
            "torch.is_inference_mode_enabled(): expected grad_mode disabled (torch.no_grad()), got inference_mode "
            "(torch.inference_mode())"
        ]
        torch.testing.assert_close(held[-1], net(ones))

    def test_one_graph_per_mode_with_results_held(self, graph_backend):
        net = nn.Linear(3, 3)
        g = CudaGraphModule(net, warmup=1, backend=graph_backend, max_graphs=2)
        held, expected = [], []
        for step in range(10):
            mode = torch.inference_mode if step % 4 < 2 else torch.no_grad
            x = torch.full((2, 3), float(step))
            with mode():
                out = g(x)
                assert out.is_inference() == net(x).is_inference()
            held.append(out)
            with torch.no_grad():
                expected.append(net(x))
        for out, want in zip(held, expected):
            torch.testing.assert_close(out, want)
        assert g.stats.captures == 2 and g.stats.graphs == 2

    def test_an_inference_tensor_the_function_writes_into(self, graph_backend):
        def f(x):
            x.add_(1)
            return x * 2

        g = CudaGraphModule(f, warmup=1, backend=graph_backend)
        with torch.no_grad():
            for _ in range(3):
                g(torch.ones(2))
            with torch.inference_mode():
                x = torch.ones(2)
            replays = g.stats.replays
            with pytest.raises(InputMismatchError) as info:
                g(x)
        assert str(info.value) == (
            "CudaGraphModule(f) was captured with other inputs than this call's (1 mismatch):\n"
            "  args[0]: expected a normal tensor (the function writes into it), got an inference tensor (made "
            "under torch.inference_mode())\n"
            "To fix: torch lets only inference mode write an inference tensor (one made under "
            "torch.inference_mode()), and autograd refuses to save one for backward: pass a normal tensor "
            "(x.clone() outside inference mode, or make it under torch.no_grad()), or call the wrapper under "
            "torch.inference_mode() (with max_graphs=2, a graph of its own)."
        )
        assert g.stats.replays == replays and torch.equal(x, torch.ones(2))

    def test_an_inference_tensor_given_to_a_layer(self, graph_backend, ones):
        net = nn.Linear(3, 3)
        g = CudaGraphModule(net, warmup=1, backend=graph_backend)
        for _ in range(3):
            g(ones).sum().backward()
        with torch.inference_mode():
            x = ones.clone()
        with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
            net(x)  # eagerly
        with pytest.raises(InputMismatchError) as info:
            g(x)
        assert [m.describe() for m in info.value.mismatches] == [
            "args[0]: expected a normal tensor (autograd may save it for backward), got an inference tensor "
            "(made under torch.inference_mode())"
        ]

    def test_an_inference_tensor_given_to_a_capture_in_grad_mode(self, graph_backend, ones):
        net = nn.Linear(3, 3)
        g = CudaGraphModule(net, warmup=1, backend=graph_backend)
        g(ones)
        with torch.inference_mode():
            x = ones.clone()
        with pytest.raises(UnsupportedError) as info:
            g(x)
        assert str(info.value) == (
            "CudaGraphModule(Linear) cannot replay this call as a CUDA graph: expected a normal tensor at args[0] "
            "(grad mode: autograd may save it for backward), got an inference tensor (made under "
            "torch.inference_mode()), which autograd refuses to save; the graph's buffer would be a normal tensor, "
            "and the replay would not refuse it.\n"
            "To fix: pass a normal tensor (x.clone() outside inference mode, or make it under torch.no_grad()), or "
            "call the wrapper under torch.no_grad() or torch.inference_mode()."
        )
        for _ in range(2):  # left as if the call had not been made (its own warmup call, then its capture)
            torch.testing.assert_close(g(ones), net(ones))
        assert g.stats.captures == 1

    def test_an_input_read_in_inference_mode_is_not_written_back(self, graph_backend, ones):
        # a buffer made in inference mode has no version counter: only its bytes tell a write
        net = nn.Linear(3, 3)
        g = CudaGraphModule(net, warmup=1, backend=graph_backend)
        x = ones.clone()
        with torch.inference_mode():
            for _ in range(4):
                torch.testing.assert_close(g(x), net(x))
        assert x._version == 0  # eagerly nothing writes into it
