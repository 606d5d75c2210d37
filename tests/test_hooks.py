"""Module hooks: judged at capture by what they do (served, or refused naming the hook), and
watched after it. Each test compares with the plain module run on a twin of the same state."""

import copy
import warnings

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torch.nn.modules.module import register_module_forward_hook
from torch.nn.utils import parametrize, prune

from graphmodule import CaptureError, CudaGraphModule, InputMismatchError, StaleGraphError, UnsupportedError, allow_hook

X = torch.ones(2, 3)

FORWARD_ADVICE = (
    "To fix: keep that state outside the hook (do its work on the results after the call), remove the hook while "
    "the wrapper runs (handle.remove()), or, if running it at the warmup calls and the capture only is what you "
    "want, mark it with graphmodule.allow_hook(hook)."
)


def _net():
    return nn.Sequential(nn.Linear(3, 3), nn.ReLU())


def _calls(g, n=3, x=X):
    with torch.no_grad():
        return [g(x + i) for i in range(n)]


def _refusal(hook: str, where: str, changes: str, register: str = "register_forward_hook",
             kind: str = "forward hook", owner: str = "Sequential", advice: str = FORWARD_ADVICE) -> str:
    return (
        f"CudaGraphModule({owner}) cannot replay this call as a CUDA graph: expected the Python hooks on the modules "
        f"the graph runs to change no Python state, got {kind} {hook!r} ({register}) on {where}, which changes: "
        f"{changes}. A replay runs no Python, so the hook would run once, at capture, and never again.\n{advice}"
    )


def log_activation(module, args, output):
    LOG.append(output.detach().sum())  # kept on the device: `.item()` would be a host sync (refused first)


def log_activation_item(module, args, output):
    LOG.append(output.sum().item())


LOG: list = []


# -- hooks with Python effects, as a user writes them --------------------------------------
def _appends(net):
    seen = []

    def remember(module, args, output):
        seen.append(output.detach())

    net[0].register_forward_hook(remember)
    return seen, ("_appends.<locals>.remember", "closure variable 'seen' of _appends.<locals>.remember (list) was "
                                                "modified in place")


def _sets_an_attribute(net):
    net[0].flipped = False

    def flip(module, args, output):
        module.flipped = not module.flipped

    net[0].register_forward_hook(flip)
    return net[0].__dict__, ("_sets_an_attribute.<locals>.flip", "module.0.flipped was rebound (True → False)")


def _counts(net):
    count = 0

    def tick(module, args, output):
        nonlocal count
        count += 1

    net[0].register_forward_hook(tick)
    return tick.__closure__[0], ("_counts.<locals>.tick", "closure variable 'count' of _counts.<locals>.tick was "
                                                          "rebound (1 → 2)")


def _stores_an_activation(net):
    activations = {}

    def store(module, args, output):
        activations["first"] = output.detach()

    net[0].register_forward_hook(store)
    return activations, ("_stores_an_activation.<locals>.store", "closure variable 'activations' of "
                         "_stores_an_activation.<locals>.store (dict) was modified in place")


class Recorder:
    def __init__(self):
        self.features = []

    def hook(self, module, args, output):
        self.features.append(output.detach())


def _a_method_on_an_object(net):
    recorder = Recorder()
    net[0].register_forward_hook(recorder.hook)
    return recorder.features, ("Recorder.hook", "self.features (list) was modified in place")


class Counter:
    def __init__(self):
        self.count = 0

    def hook(self, module, args, output):
        self.count += 1


def _a_count_on_the_methods_self(net):
    counter = Counter()
    net[0].register_forward_hook(counter.hook)
    return counter.__dict__, ("Counter.hook", "self.count was rebound (1 → 2)")


EFFECTS = [_a_count_on_the_methods_self, _appends, _sets_an_attribute, _counts, _stores_an_activation,
           _a_method_on_an_object]


def _state(found):
    """What a user can observe of a hook's state: a counter's or flag's value, a log's length."""
    if hasattr(found, "cell_contents"):
        return found.cell_contents
    if isinstance(found, dict) and ("flipped" in found or "count" in found):
        return found.get("flipped", found.get("count"))
    return len(found)


class TestRefusedAtCapture:
    """A hook that changes Python state, which a replay would not, is refused at the capture
    naming it, and what it changed there is put back: the wrapper is left as if the call had
    not been made."""

    def test_a_forward_hook_with_a_python_effect(self, graph_backend, ones):
        LOG.clear()
        net = _net()
        handle = net[0].register_forward_hook(log_activation)
        g = CudaGraphModule(net, warmup=1, backend=graph_backend)
        with torch.no_grad():
            g(ones)  # the warmup call, eager: the hook logs
            assert len(LOG) == 1
            with pytest.raises(UnsupportedError) as info:
                g(ones)
        assert str(info.value) == _refusal("log_activation", "module.0",
                                           "global 'LOG' of log_activation (list) was modified in place")
        assert len(LOG) == 1  # the capture's log entry was put back
        handle.remove()  # the wrapper was left as if the call had not been made
        out = _calls(g, x=ones)[-1]
        torch.testing.assert_close(out, net(ones + 2))
        assert g.stats.captures == 1

    def test_a_forward_hook_that_reads_a_value_on_the_host(self, graph_backend, ones):
        # `.item()` makes the host wait for the device, which a CUDA capture refuses: the capture
        # fails naming the hook's line, before the hook could change anything
        LOG.clear()
        net = _net()
        twin = copy.deepcopy(net)
        handle = net[0].register_forward_hook(log_activation_item)
        g = CudaGraphModule(net, warmup=1, backend=graph_backend)
        with torch.no_grad():
            g(ones)  # the warmup call, eager: the hook logs as the plain module's would
            assert LOG == [twin[0](ones).sum().item()]
            with pytest.raises(CaptureError) as info:
                g(ones)
        handle.remove()
        message = str(info.value)
        assert message.startswith(
            "CudaGraphModule(Sequential) failed to capture its CUDA graph at test_hooks.py:"
            f"{log_activation_item.__code__.co_firstlineno + 1} in log_activation_item "
            "`LOG.append(output.sum().item())`: ")
        assert "operation not permitted when stream is capturing" in message
        assert "Likely cause (host-sync): the function reads a value on the host (`.item()`" in message
        assert len(LOG) == 1 and g.stats.captures == 0

    @pytest.mark.parametrize("effect", EFFECTS, ids=[e.__name__.strip("_") for e in EFFECTS])
    def test_each_python_effect_is_refused_naming_the_hook(self, graph_backend, ones, effect):
        net = _net()
        found, (name, change) = effect(net)
        g = CudaGraphModule(net, warmup=1, backend=graph_backend)
        with torch.no_grad():
            g(ones)
            before = _state(found)
            with pytest.raises(UnsupportedError) as info:
                g(ones)
        assert str(info.value) == _refusal(name, "module.0", change)
        assert _state(found) == before  # what the capture's hook call changed was put back
        assert g.stats.captures == 0

    def test_a_forward_pre_hook(self):
        net = _net()
        shapes = []
        net.register_forward_pre_hook(lambda module, args: shapes.append(args[0].shape))
        g = CudaGraphModule(net, warmup=1, backend="simulate")
        with pytest.raises(UnsupportedError) as info:
            _calls(g)
        assert str(info.value) == _refusal(
            "TestRefusedAtCapture.test_a_forward_pre_hook.<locals>.<lambda>", "module",
            "closure variable 'shapes' of TestRefusedAtCapture.test_a_forward_pre_hook.<locals>.<lambda> (list) was "
            "modified in place", register="register_forward_pre_hook", kind="forward pre-hook")
        assert shapes == [X.shape]  # the warmup call's

    def test_a_global_forward_hook(self):
        LOG.clear()
        g = CudaGraphModule(_net(), warmup=1, backend="simulate")
        handle = register_module_forward_hook(log_activation)
        try:
            with pytest.raises(UnsupportedError) as info:
                _calls(g)
        finally:
            handle.remove()
        assert str(info.value) == _refusal("log_activation", "every module (global)",
                                           "global 'LOG' of log_activation (list) was modified in place",
                                           register="register_module_forward_hook")
        assert len(LOG) == 3  # the warmup call's, one per module: the capture's were put back

    def test_a_backward_hook_with_a_python_effect_in_a_train_step(self, graph_backend, ones):
        net = _net()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        norms = []
        net[1].register_full_backward_hook(lambda module, grad_in, grad_out: norms.append(grad_out[0].norm()))

        def step(x):
            opt.zero_grad()
            loss = net(x).sum()
            loss.backward()
            opt.step()
            return loss.detach()

        g = CudaGraphModule(step, warmup=1, backend=graph_backend)
        g(ones)
        with pytest.raises(UnsupportedError) as info:
            g(ones)
        assert str(info.value).startswith(
            "CudaGraphModule(step) cannot replay this call as a CUDA graph: expected the Python hooks on the modules "
            "the graph runs to change no Python state, got backward hook "
            "'TestRefusedAtCapture.test_a_backward_hook_with_a_python_effect_in_a_train_step.<locals>.<lambda>' "
            "(register_full_backward_hook) on closure variable 'net' of ")
        assert "(list) was modified in place. A replay runs no Python" in str(info.value)
        assert "hook the parameters' gradients (p.register_hook)" in str(info.value)
        assert len(norms) == 1  # the warmup call's


class TestServed:
    """A hook that only computes tensors, reads Python state or warns is served: values as
    the plain module's, on a twin with the same hook."""

    @pytest.mark.parametrize("grad", [False, True])
    def test_a_pre_hook_that_scales_the_input(self, graph_backend, grad):
        torch.manual_seed(0)
        net = _net()
        twin = copy.deepcopy(net)
        for m in (net, twin):
            m.register_forward_pre_hook(lambda module, args: (args[0] * 2,))
            m[0].register_forward_hook(lambda module, args, out: out - 1)
        g = CudaGraphModule(net, warmup=1, backend=graph_backend)
        with torch.set_grad_enabled(grad):
            for i in range(4):
                x = torch.full((2, 3), 0.1 * i)
                torch.testing.assert_close(g(x), twin(x))
        assert g.stats.captures == 1 and g.stats.replays == 3

    def test_a_harmless_backward_hook_in_a_train_step(self, graph_backend):
        torch.manual_seed(0)
        net = _net()
        twin = copy.deepcopy(net)

        def make_step(m):
            opt = torch.optim.SGD(m.parameters(), lr=0.1)
            m[1].register_full_backward_hook(lambda module, grad_in, grad_out: (grad_in[0] * 0.5,))

            def step(x):
                opt.zero_grad()
                loss = m(x).pow(2).sum()
                loss.backward()
                opt.step()
                return loss.detach()

            return step

        g = CudaGraphModule(make_step(net), warmup=1, backend=graph_backend)
        plain = make_step(twin)
        for i in range(4):
            x = torch.full((2, 3), 0.1 * i + 0.2)
            torch.testing.assert_close(g(x), plain(x))
            for p, q in zip(net.parameters(), twin.parameters()):
                torch.testing.assert_close(p, q)
        assert g.stats.captures == 1

    def test_a_backward_hook_is_not_run_without_grad(self):
        net = _net()
        net[0].register_full_backward_hook(lambda module, grad_in, grad_out: None)
        g = CudaGraphModule(net, warmup=1, backend="simulate")
        torch.testing.assert_close(_calls(g)[-1], net(X + 2))

    def test_a_hook_setting_an_attribute_to_the_value_it_holds(self, graph_backend, ones):
        # eagerly a no-op after the first call, which a replay may skip
        net = _net()
        net[0].batch = 0.0

        def note_batch(module, args):
            module.batch = float(args[0].shape[0])  # a new float object at each call

        net[0].register_forward_pre_hook(note_batch)
        g = CudaGraphModule(net, warmup=1, backend=graph_backend)
        torch.testing.assert_close(_calls(g, x=ones)[-1], net(ones + 2))
        assert g.stats.captures == 1 and net[0].batch == 2.0

    def test_a_hook_binding_a_tensor_attribute(self, graph_backend):
        # rebinding an attribute to a tensor is an effect every replay redoes, as for the function
        torch.manual_seed(0)
        net = _net()
        twin = copy.deepcopy(net)
        for m in (net, twin):
            m[0].register_forward_hook(lambda module, args, out: setattr(module, "last", out.detach()))
        g = CudaGraphModule(net, warmup=1, backend=graph_backend, outputs="clone")
        with torch.no_grad():
            for i in range(4):
                x = torch.full((2, 3), 0.1 * i)
                torch.testing.assert_close(g(x), twin(x))
                torch.testing.assert_close(net[0].last, twin[0].last)
        assert g.stats.captures == 1


TARGET_NET_WARNING = "No target network updater has been associated with this loss module."


def _updater_check_forward_prehook(module, *args, **kwargs):
    # shaped as TorchRL's LossModule hook: a read of a private dict of flags, and a warning
    if not all(module._has_update_associated.values()):
        warnings.warn(module.TARGET_NET_WARNING, category=UserWarning)


class LossLike(nn.Module):
    TARGET_NET_WARNING = TARGET_NET_WARNING

    def __init__(self):
        super().__init__()
        self.value = nn.Linear(3, 1)
        self._has_update_associated = {"value_network": False}
        self.register_forward_pre_hook(_updater_check_forward_prehook)

    def forward(self, x):
        return self.value(x).pow(2).mean()


def _warned_calls(f, n, x):
    """Each call's result, and how many target-network warnings it raised."""
    out, warned = [], []
    for i in range(n):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            out.append(f(x + i))
        warned.append(sum(TARGET_NET_WARNING in str(w.message) for w in seen))
    return out, warned


def _python_calls(g) -> int:
    """How many calls ran the function: warmup calls and captures of every kind."""
    s = g.stats
    return s.warmup_calls + s.captures + s.twin_captures + s.copy_recaptures + s.lending_captures


class TestAHookThatWarns:
    """TorchRL's losses warn from a forward pre-hook when no target-network updater was attached."""

    def test_served_the_warning_raised_at_the_eager_calls(self, graph_backend, ones):
        torch.manual_seed(0)
        loss = LossLike()
        twin = copy.deepcopy(loss)
        g = CudaGraphModule(loss, warmup=2, backend=graph_backend)
        with torch.no_grad():
            got, warned = _warned_calls(g, 9, ones)
            expected, eager_warned = _warned_calls(twin, 9, ones)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b)
        assert eager_warned == [1] * 9
        # the calls that run the function (warmup, the capture, and, as the caller holds each
        # result, the captures that return them elsewhere) run the hook; a replay runs no Python
        assert warned[:3] == [1, 1, 1]
        assert warned == [1] * _python_calls(g) + [0] * (9 - _python_calls(g)) and warned[-2:] == [0, 0]
        assert g.stats.captures == 1

    def test_an_updater_attached_after_the_capture_makes_it_stale(self, graph_backend, ones):
        loss = LossLike()
        g = CudaGraphModule(loss, warmup=1, backend=graph_backend)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            _calls(g, x=ones)
        loss._has_update_associated["value_network"] = True  # what SoftUpdate(loss) does
        with torch.no_grad(), pytest.raises(StaleGraphError) as info:
            g(ones)
        assert info.value.changes == [(
            "module._has_update_associated (read by module: forward pre-hook '_updater_check_forward_prehook' "
            "(register_forward_pre_hook))",
            "{'value_network': False} at capture, {'value_network': True} now (the graph uses "
            "{'value_network': False})",
        )]

    def test_recaptured_after_the_updater_is_attached(self, graph_backend, ones):
        torch.manual_seed(0)
        loss = LossLike()
        twin = copy.deepcopy(loss)
        g = CudaGraphModule(loss, warmup=1, backend=graph_backend, on_stale="recapture")
        with torch.no_grad():
            _warned_calls(g, 3, ones)
            _warned_calls(twin, 3, ones)
            for m in (loss, twin):
                m._has_update_associated["value_network"] = True
            got, warned = _warned_calls(g, 4, ones)
            expected, eager_warned = _warned_calls(twin, 4, ones)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b)
        assert warned == eager_warned == [0] * 4
        assert g.stats.recaptures == 1 and g.stats.captures == 2

    def test_with_the_updater_attached_before_the_first_call(self, graph_backend, ones):
        # the order of TorchRL's training scripts: loss, updater, then the wrapped update
        torch.manual_seed(0)
        loss = LossLike()
        loss._has_update_associated["value_network"] = True
        twin = copy.deepcopy(loss)
        g = CudaGraphModule(loss, warmup=1, backend=graph_backend)
        for i in range(4):
            x = ones + i
            torch.testing.assert_close(g(x), twin(x))
        assert g.stats.captures == 1 and g.stats.replays == 3

    def test_a_function_that_warns(self, graph_backend, ones):
        def f(x):
            warnings.warn(TARGET_NET_WARNING, category=UserWarning)
            return x * 2

        g = CudaGraphModule(f, warmup=1, backend=graph_backend)
        got, warned = _warned_calls(g, 8, ones)
        for i, out in enumerate(got):
            torch.testing.assert_close(out, (ones + i) * 2)
        assert warned[:2] == [1, 1]
        assert warned == [1] * _python_calls(g) + [0] * (8 - _python_calls(g)) and warned[-2:] == [0, 0]
        assert g.stats.captures == 1


class TestAllowHook:
    """``allow_hook``: the hook runs at the warmup calls and the capture, not at replays."""

    def test_an_effectful_hook_is_served(self, graph_backend, ones):
        torch.manual_seed(0)
        net = _net()
        twin = copy.deepcopy(net)
        seen, eager_seen = [], []
        net[0].register_forward_hook(allow_hook(lambda module, args, out: seen.append(out.shape)))
        twin[0].register_forward_hook(lambda module, args, out: eager_seen.append(out.shape))
        g = CudaGraphModule(net, warmup=2, backend=graph_backend)
        with torch.no_grad():
            for i in range(3):  # two warmup calls and the capture
                torch.testing.assert_close(g(ones + i), twin(ones + i))
            assert seen == eager_seen and g.stats.captures == 1
            for i in range(3):
                torch.testing.assert_close(g(ones - i), twin(ones - i))
        assert g.stats.replays == 4  # (the capturing call's counts)
        if graph_backend == "cuda":
            assert len(seen) == 3  # not at replays

    def test_a_counter_on_the_module(self, graph_backend, ones):
        torch.manual_seed(0)
        net = _net()
        net[0].calls = 0
        twin = copy.deepcopy(net)

        def count(module, args, out):
            module.calls += 1

        twin[0].register_forward_hook(count)
        net[0].register_forward_hook(allow_hook(count))
        g = CudaGraphModule(net, warmup=1, backend=graph_backend)
        with torch.no_grad():
            for i in range(4):
                torch.testing.assert_close(g(ones + i), twin(ones + i))
        assert g.stats.captures == 1
        if graph_backend == "cuda":
            assert net[0].calls == 2  # the warmup call and the capture

    def test_a_method_is_allowed_for_every_object_of_its_class(self, graph_backend, ones):
        class Tally:
            def __init__(self):
                self.shapes = []

            @allow_hook
            def hook(self, module, args, out):
                self.shapes.append(out.shape)

        net = _net()
        tally = Tally()
        net[0].register_forward_hook(tally.hook)
        g = CudaGraphModule(net, warmup=1, backend=graph_backend)
        torch.testing.assert_close(_calls(g, x=ones)[-1], net(ones + 2))
        assert g.stats.captures == 1 and len(tally.shapes) >= 2

    def test_allow_hook_returns_the_hook(self):
        def hook(module, args):
            return None

        assert allow_hook(hook) is hook

    def test_what_it_cannot_mark(self):
        with pytest.raises(TypeError) as info:
            allow_hook(print)
        assert str(info.value) == (
            "allow_hook expected a function, a method or a callable object it can mark, got "
            "builtin_function_or_method <built-in function print>: wrap it in a function (def hook(*args): ...).")


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

    def test_a_harmless_hook_added_with_recapture_is_served(self, graph_backend, ones):
        torch.manual_seed(0)
        net = _net()
        twin = copy.deepcopy(net)
        g = CudaGraphModule(net, warmup=1, backend=graph_backend, on_stale="recapture")
        _calls(g, x=ones)
        for m in (net, twin):
            m.register_forward_pre_hook(lambda module, args: (args[0] + 1,))
        with torch.no_grad():
            for i in range(4):
                torch.testing.assert_close(g(ones + i), twin(ones + i))
        assert g.stats.recaptures == 1 and g.stats.captures == 2

    def test_an_effectful_hook_added_with_recapture_is_refused_at_the_capture(self):
        LOG.clear()
        net = _net()
        g = CudaGraphModule(net, warmup=1, backend="simulate", on_stale="recapture")
        _calls(g)
        net[0].register_forward_hook(log_activation)
        with pytest.raises(UnsupportedError, match="got forward hook 'log_activation'"):
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

    def test_a_python_value_a_hook_reads(self, graph_backend, ones):
        net = _net()
        net[0]._shift = 1.0
        net[0].register_forward_pre_hook(lambda module, args: (args[0] + module._shift,))
        g = CudaGraphModule(net, warmup=1, backend=graph_backend)
        torch.testing.assert_close(_calls(g, x=ones)[-1], net(ones + 2))
        net[0]._shift = 2.0
        with torch.no_grad(), pytest.raises(StaleGraphError) as info:
            g(ones)
        assert info.value.changes == [(
            "module.0._shift (read by module.0: forward pre-hook "
            "'TestWatchedAfterCapture.test_a_python_value_a_hook_reads.<locals>.<lambda>' (register_forward_pre_hook))",
            "1.0 at capture, 2.0 now (the graph uses 1.0)")]

    def test_a_python_value_a_methods_self_holds(self, graph_backend, ones):
        class Shift:
            def __init__(self):
                self.by = 1.0

            def hook(self, module, args):
                return (args[0] + self.by,)

        net, shift = _net(), Shift()
        net[0].register_forward_pre_hook(shift.hook)
        g = CudaGraphModule(net, warmup=1, backend=graph_backend)
        torch.testing.assert_close(_calls(g, x=ones)[-1], net(ones + 2))
        shift.by = 2.0
        with torch.no_grad(), pytest.raises(StaleGraphError) as info:
            g(ones)
        assert info.value.changes == [(
            "self.by of module.0: forward pre-hook "
            "'TestWatchedAfterCapture.test_a_python_value_a_methods_self_holds.<locals>.Shift.hook' "
            "(register_forward_pre_hook)",
            "1.0 at capture, 2.0 now (the graph uses 1.0)")]

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


class QValue(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(6, 1)

    def forward(self, observation, action):
        return self.linear(torch.cat([observation, action], -1))


class TestTorchRL:
    """A real TorchRL loss (its LossModule registers the warning pre-hook), where TorchRL is installed."""

    @pytest.fixture(autouse=True)
    def _capturing_as_on_a_gpu(self, graph_backend, monkeypatch):
        """TorchRL's TanhNormal checks its bounds on the host (``(high > low).all()``, a sync) unless
        ``torch.cuda.is_current_stream_capturing()``, which it asks only where CUDA is available:
        under "simulate" both runs (plain and wrapped) take the branch a capture takes on a GPU."""
        if graph_backend == "simulate":
            continuous = pytest.importorskip("torchrl.modules.distributions.continuous")
            monkeypatch.setattr(continuous, "safe_is_current_stream_capturing", lambda: True)

    def test_sac_loss_served(self, graph_backend):
        objectives = pytest.importorskip("torchrl.objectives")
        modules = pytest.importorskip("torchrl.modules")
        from tensordict.nn import NormalParamExtractor

        def build():
            torch.manual_seed(0)
            actor = modules.ProbabilisticActor(
                TensorDictModule(nn.Sequential(nn.Linear(4, 4), NormalParamExtractor()), in_keys=["observation"],
                                 out_keys=["loc", "scale"]),
                in_keys=["loc", "scale"], distribution_class=modules.TanhNormal, return_log_prob=True,
                # the bounds as tensors on the device, as TorchRL's scripts pass their action spec's:
                # Python numbers would be copied from the host at every call, which a capture refuses
                distribution_kwargs={"low": -torch.ones(2), "high": torch.ones(2)})
            qvalue = modules.ValueOperator(QValue(), in_keys=["observation", "action"])
            loss = objectives.SACLoss(actor, qvalue, num_qvalue_nets=2, target_entropy=-2.0)
            objectives.SoftUpdate(loss, eps=0.99)  # attached before the first call, as in TorchRL's scripts
            return loss

        def batch(i):
            g = torch.Generator(device="cpu").manual_seed(i)
            obs, action, nxt, reward = (torch.randn(8, k, generator=g, device="cpu") for k in (4, 2, 4, 1))
            done = torch.zeros(8, 1, dtype=torch.bool, device="cpu")
            td = TensorDict({"observation": obs, "action": action, ("next", "observation"): nxt,
                             ("next", "reward"): reward, ("next", "done"): done, ("next", "terminated"): done}, [8])
            return td.to(torch.get_default_device())

        loss, twin = build(), build()
        g = CudaGraphModule(loss, warmup=2, backend=graph_backend)
        with torch.no_grad():
            for i in range(5):
                torch.manual_seed(100 + i)
                got = g(batch(i))
                torch.manual_seed(100 + i)
                expected = twin(batch(i))
                assert sorted(got.keys()) == sorted(expected.keys())
                if graph_backend == "simulate":  # (a CUDA graph draws its own random numbers)
                    for key in expected.keys():
                        torch.testing.assert_close(got[key], expected[key], msg=key)
        assert g.stats.captures == 1


class _Symmetric(nn.Module):
    def forward(self, w):
        return (w + w.t()) / 2


def _parametrized():
    torch.manual_seed(0)
    net = nn.Linear(3, 3)
    parametrize.register_parametrization(net, "weight", _Symmetric())
    return net, copy.deepcopy(net)


def _changed(*nets):
    with torch.no_grad():
        for m in nets:
            m.parametrizations.weight.original.mul_(0.5).add_(0.1)


class TestParametrizations:
    """A parametrized weight (``torch.nn.utils.parametrize``) is computed by every eager call
    outside ``parametrize.cached()``, and once per region inside it. A graph records its
    computation, also when captured inside a region: the region's cached weight is another
    call's, which the graph would read after the region ends."""

    def test_captured_outside_the_cache(self, graph_backend, ones):
        net, twin = _parametrized()
        g = CudaGraphModule(net, warmup=1, backend=graph_backend)
        with torch.no_grad():
            for i in range(4):
                torch.testing.assert_close(g(ones + i), twin(ones + i))
                _changed(net, twin)
            with parametrize.cached():  # (the parameters unchanged inside the region, as cached() requires)
                for i in range(2):
                    torch.testing.assert_close(g(ones + i), twin(ones + i))
        assert g.stats.captures == 1

    def test_captured_inside_the_cache_computes_the_weight_after_the_region(self, graph_backend, ones):
        net, twin = _parametrized()
        g = CudaGraphModule(net, warmup=1, backend=graph_backend)
        with torch.no_grad():
            with parametrize.cached():  # a warmup call, the capture and a replay in one region
                for i in range(3):
                    torch.testing.assert_close(g(ones + i), twin(ones + i))
            for i in range(4):
                _changed(net, twin)
                torch.testing.assert_close(g(ones + i), twin(ones + i))
        assert g.stats.captures == 1

    def test_a_layer_called_in_a_region_of_its_own_at_each_call(self, graph_backend, ones):
        # the use cached() is for: the weight computed once per forward, its backward after the region
        net, twin = _parametrized()
        g = CudaGraphModule(net, warmup=1, backend=graph_backend)
        for i in range(5):
            for m in (g, twin):
                with parametrize.cached():
                    out = m(ones + i)
                out.pow(2).sum().backward()
            original, eager = net.parametrizations.weight.original, twin.parametrizations.weight.original
            torch.testing.assert_close(original.grad, eager.grad)
            _changed(net, twin)
        assert g.stats.captures == 1
