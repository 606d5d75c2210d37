"""What the graph reads from outside its inputs: replaced, it is named before any replay.

Every test captures, replaces something the graph read, and checks the next call raises
:class:`StaleGraphError` naming it (``on_stale="raise"``), or re-captures and matches eager
(``on_stale="recapture"``).
"""

import warnings
from collections import OrderedDict, defaultdict

import pytest
import torch
from tensordict import TensorDict
from torch import nn

from graphmodule import CudaGraphModule, StaleGraphError, UnsupportedError
from graphmodule._stale import Watch

X = torch.ones(2, 3)


def _captured(module, **options):
    g = CudaGraphModule(module, warmup=1, backend="simulate", **options)
    with torch.no_grad():
        g(X)
        g(X)
    return g


def _stale_message(g) -> list[str]:
    with torch.no_grad(), pytest.raises(StaleGraphError) as info:
        g(X)
    return str(info.value).splitlines()


class TestModules:
    def test_parameter_reassigned(self):
        net = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
        g = _captured(net)
        net[0].weight = nn.Parameter(torch.zeros(3, 3))
        lines = _stale_message(g)
        assert lines[0] == "CudaGraphModule(Sequential) was captured reading state that has changed since:"
        assert lines[1] == "  module.0.weight: another tensor (the graph reads the old one's memory)"
        assert lines[2].startswith("To fix: update tensors in place (p.copy_(new)")

    def test_load_state_dict_with_assign(self):
        net = nn.Linear(3, 3)
        g = _captured(net)
        net.load_state_dict({"weight": torch.eye(3), "bias": torch.zeros(3)}, assign=True)
        assert _stale_message(g)[1:3] == [
            "  module.weight: another tensor (the graph reads the old one's memory)",
            "  module.bias: another tensor (the graph reads the old one's memory)",
        ]

    def test_load_state_dict_in_place_is_fine(self):
        net = nn.Linear(3, 3)
        g = _captured(net)
        net.load_state_dict({"weight": torch.eye(3), "bias": torch.zeros(3)})
        with torch.no_grad():
            torch.testing.assert_close(g(X), X)

    def test_data_assignment_moves_the_memory(self):
        net = nn.Linear(3, 3)
        g = _captured(net)
        net.weight.data = torch.zeros(3, 3)
        assert _stale_message(g)[1] == "  module.weight: another tensor (the graph reads the old one's memory)"

    def test_same_memory_under_a_new_parameter_object_is_fine(self):
        net = nn.Linear(3, 3)
        g = _captured(net)
        net.weight = nn.Parameter(net.weight.detach())  # a new object over the same memory
        with torch.no_grad():
            for _ in range(2):  # the second call takes the fast path over the adopted object
                torch.testing.assert_close(g(X), net(X))
                net.weight.mul_(2)  # written in place: the graph reads it

    def test_same_memory_seen_through_another_view(self):
        # a transposed view of the same memory: the data pointer alone did not tell it apart
        net = nn.Linear(3, 3)
        g = _captured(net)
        net.weight = nn.Parameter(net.weight.detach().t())
        assert _stale_message(g)[1] == (
            "  module.weight: another view of the same memory (shape [3, 3], stride (1, 3); "
            "the graph reads it as shape [3, 3], stride (3, 1))")

    def test_tensordict_to_module_swap(self):
        net = nn.Linear(3, 3)
        g = _captured(net)
        TensorDict.from_module(net).data.clone().to_module(net)
        assert "  module.weight: another tensor (the graph reads the old one's memory)" in _stale_message(g)

    def test_submodule_replaced(self):
        net = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
        g = _captured(net)
        net[1] = nn.Tanh()
        assert _stale_message(g)[1] == "  module.1: another Tanh object"

    def test_public_float_attribute(self):
        drop = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.0))
        g = _captured(drop)
        drop[1].p = 0.5
        assert _stale_message(g)[1] == "  module.1.p: 0.0 at capture, 0.5 now (the graph uses 0.0)"

    def test_attributes_linear_never_reads_are_not_watched(self):
        lin = nn.Linear(3, 3)
        g = _captured(lin)
        lin.in_features = 7  # eagerly too, F.linear reads only the weight and bias
        with torch.no_grad():
            torch.testing.assert_close(g(X), lin(X))

    def test_a_linear_subclass_reading_them_is_still_watched(self):
        class Scaled(nn.Linear):
            def forward(self, x):
                return super().forward(x) * self.out_features

        lin = Scaled(3, 3)
        g = _captured(lin)
        lin.out_features = 2
        assert _stale_message(g)[1] == "  module.out_features: 3 at capture, 2 now (the graph uses 3)"

    def test_recapture_follows_the_new_parameter(self):
        net = nn.Linear(3, 3)
        g = _captured(net, on_stale="recapture")
        net.weight = nn.Parameter(torch.eye(3))
        with torch.no_grad():
            nn.init.zeros_(net.bias)
            outs = [g(X) for _ in range(3)]
        torch.testing.assert_close(outs[-1], X)
        assert g.stats.recaptures == 1 and g.stats.captures == 2


class TestOptimizers:
    def _step(self, lr):
        net = nn.Linear(3, 1)
        # fused: the step count stays a tensor (a CPU's capturable Adam; the plain one reads it on
        # the host, which a capture refuses)
        opt = torch.optim.Adam(net.parameters(), lr=lr, fused=True)

        def step(x):
            opt.zero_grad(set_to_none=False)
            net(x).sum().backward()
            opt.step()

        return net, opt, step

    def test_float_learning_rate_changed_by_a_scheduler(self):
        net, opt, step = self._step(1e-2)
        g = CudaGraphModule(step, warmup=1, backend="simulate")
        g(X)
        g(X)
        with warnings.catch_warnings():  # "scheduler.step() before optimizer.step()": a replay runs no Python
            warnings.simplefilter("ignore")
            torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5).step()
        with pytest.raises(StaleGraphError) as info:
            g(X)
        assert ("  closure variable 'opt' of TestOptimizers._step.<locals>.step (Adam).param_groups[0]['lr']: "
                "0.01 at capture, 0.005 now (the graph uses 0.01)") in str(info.value).splitlines()

    def test_tensor_learning_rate_changed_in_place_is_fine(self):
        lr = torch.tensor(1e-2)
        net, opt, step = self._step(lr)
        g = CudaGraphModule(step, warmup=1, backend="simulate")
        g(X)
        g(X)
        lr.fill_(5e-3)
        g(X)  # read by address: no staleness
        assert g.stats.replays == 2

    def test_optimizer_state_reloaded(self):
        net, opt, step = self._step(1e-2)
        g = CudaGraphModule(step, warmup=1, backend="simulate")
        g(X)
        g(X)
        opt.load_state_dict(opt.state_dict())  # new state tensors
        with pytest.raises(StaleGraphError, match=r"\(Adam\)\.state"):
            g(X)


class TestFunctions:
    def test_rebound_global_scalar(self):
        g = CudaGraphModule(_scaled, warmup=1, backend="simulate")
        g(X)
        g(X)
        global SCALE
        SCALE = 3.0
        try:
            with pytest.raises(StaleGraphError) as info:
                g(X)
        finally:
            SCALE = 2.0
        assert "  global 'SCALE' read by _scaled: 2.0 at capture, 3.0 now (the graph uses 2.0)" in str(info.value)

    def test_an_ordered_dict_read_not_changed_is_served(self):
        # a dict subclass's entries were compared as fresh (key, value) tuples: always "modified"
        from collections import OrderedDict

        cfg = OrderedDict(scale=2.0)

        def f(x):
            return x * cfg["scale"]

        g = CudaGraphModule(f, warmup=1, backend="simulate")
        for i in range(3):
            torch.testing.assert_close(g(X + i), (X + i) * 2.0)
        assert g.stats.captures == 1

    def test_equal_scalar_in_a_new_object_is_fine(self):
        alpha = 0.5

        def f(x):
            return x * alpha

        g = CudaGraphModule(f, warmup=1, backend="simulate")
        g(X)
        g(X)
        alpha = float("0.5")  # noqa: F841 - another object, the same value
        torch.testing.assert_close(g(X), X * 0.5)

    def test_an_equal_value_adopted_is_still_watched_after(self):
        # the check compares by identity, adopts an equal object, and must still see the
        # next change (closure cells are read apart from dict places)
        alpha = 0.0

        def f(x):
            return x * alpha + 1

        g = CudaGraphModule(f, warmup=1, backend="simulate", on_stale="raise")
        g(X)
        g(X)
        alpha = float("0.0")  # another object, the same value: adopted
        torch.testing.assert_close(g(X), X * 0.0 + 1)
        torch.testing.assert_close(g(X), X * 0.0 + 1)  # the fast path over the adopted object
        alpha = -0.0  # equal under ==, not the same constant
        with pytest.raises(StaleGraphError, match=r"closure variable 'alpha' of .*: 0.0 at capture, -0.0 now"):
            g(X)
        alpha = 0.0  # noqa: F841 - back: usable again
        torch.testing.assert_close(g(X), X * 0.0 + 1)

    def test_an_adopted_tensor_is_still_watched_after(self):
        net = nn.Linear(3, 3)
        g = _captured(net)
        net.weight = nn.Parameter(net.weight.detach())  # adopted: the same memory
        with torch.no_grad():
            torch.testing.assert_close(g(X), net(X))
        net.weight.data = torch.zeros(3, 3)  # the adopted object now reads other memory
        assert _stale_message(g)[1] == "  module.weight: another tensor (the graph reads the old one's memory)"

    def test_a_tensor_in_two_places_adopted_in_one_is_still_watched_in_the_other(self):
        # The address check reads each distinct tensor once (a parameter is also in its
        # optimizer's list). Adopting a new object at one place must not stop the check of
        # the old object, which the other place still holds. (The Watch itself.)
        net = nn.Linear(3, 3)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)

        def step(x):
            opt.zero_grad(set_to_none=False)
            net(x).sum().backward()
            opt.step()

        watch = Watch(step)
        assert watch.check()
        old = net.weight
        opt.param_groups[0]["params"][0] = nn.Parameter(old.detach())  # adopted: the same memory
        assert watch.check()
        assert watch.check()  # the fast path over the adopted object
        old.data = torch.zeros(3, 3)  # the module still holds the old object: other memory now
        assert not watch.check()
        assert [what for _, what in watch.changes()] == ["another tensor (the graph reads the old one's memory)"]

    def test_closure_tensor_replaced(self):
        w = torch.ones(3)
        ref = {"w": w}

        def f(x):
            return x * ref["w"]

        g = CudaGraphModule(f, warmup=1, backend="simulate")
        g(X)
        g(X)
        ref["w"] = torch.zeros(3)
        with pytest.raises(StaleGraphError, match=r"closure variable 'ref' of .*\['w'\]: another tensor"):
            g(X)


SCALE = 2.0


def _scaled(x):
    return x * SCALE


class _Holder:
    pass


def _program():
    """A closure over a module, its optimizer (with state), a TensorDict and an object."""
    net = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    net.scale = 1.0
    opt = torch.optim.Adam(net.parameters(), lr=0.1)
    net(X).sum().backward()
    opt.step()
    td = TensorDict({"x": torch.ones(3)}, [])
    holder = _Holder()
    holder.w = torch.ones(3)
    holder.unread = 0

    def step():
        return net(X) * net.scale + td["x"] + holder.w, opt

    return step, net, opt, td, holder


def _param(opt):
    return opt.param_groups[0]["params"][0]


_CHANGES = {
    "parameter assigned": (lambda s, net, opt, td, h: setattr(net[0], "weight", nn.Parameter(torch.zeros(3, 3))), False),
    "_parameters written": (lambda s, net, opt, td, h: net[0]._parameters.__setitem__("bias", torch.zeros(3)), False),
    "load_state_dict(assign=True)": (lambda s, net, opt, td, h: net.load_state_dict(
        {k: v.clone() for k, v in net.state_dict().items()}, assign=True), False),
    ".data assigned": (lambda s, net, opt, td, h: setattr(net[0].weight, "data", torch.zeros(3, 3)), False),
    "submodule replaced": (lambda s, net, opt, td, h: net.__setitem__(1, nn.Tanh()), False),
    "float attribute": (lambda s, net, opt, td, h: setattr(net, "scale", 2.0), False),
    "learning rate": (lambda s, net, opt, td, h: opt.param_groups[0].__setitem__("lr", 0.5), False),
    "optimizer state tensor": (lambda s, net, opt, td, h: opt.state[_param(opt)].__setitem__(
        "exp_avg", torch.zeros(3, 3)), False),
    "optimizer reloaded": (lambda s, net, opt, td, h: opt.load_state_dict(opt.state_dict()), False),
    "param list entry": (lambda s, net, opt, td, h: opt.param_groups[0]["params"].__setitem__(
        0, nn.Parameter(torch.zeros(3, 3))), False),
    "TensorDict entry": (lambda s, net, opt, td, h: td.set("x", torch.zeros(3)), False),
    "object attribute": (lambda s, net, opt, td, h: setattr(h, "w", torch.zeros(3)), False),
    "in-place write": (lambda s, net, opt, td, h: net[0].weight.data.mul_(2), True),
    "unread attribute added": (lambda s, net, opt, td, h: setattr(net, "note", "hello"), True),
    "unread scalar changed": (lambda s, net, opt, td, h: setattr(h, "unread", 5), True),
    "equal float rebound": (lambda s, net, opt, td, h: setattr(net, "scale", float("1.0")), True),
    "same memory, new parameter": (lambda s, net, opt, td, h: setattr(
        net[0], "weight", nn.Parameter(net[0].weight.detach())), False),
}


class TestDictWatchers:
    """With dict watchers (CPython 3.12+) a check reads dict places only after a dict
    changed: its verdict must be the full read's, for every way a program changes state."""

    @pytest.mark.parametrize("name", sorted(_CHANGES))
    def test_same_verdict_as_reading_every_place(self, name, monkeypatch):
        from graphmodule import _dictwatch

        change, fine = _CHANGES[name]
        verdicts = []
        for watchers in (True, False):
            if not watchers:
                monkeypatch.setattr(_dictwatch, "watchable", lambda d, instance_dict: False)
            step, *state = _program()
            w = Watch(step)
            assert w.check() and w.check()  # the second: the fast path, where watchers exist
            if watchers and _dictwatch.available():
                assert w._flag is not None and not w._flag.raised
            change(step, *state)
            verdicts.append((w.check(), w.check()))  # (a failed check stays failed)
        assert verdicts[0] == verdicts[1]
        if name == "same memory, new parameter":  # only the object changed: adopted
            fine = True
        assert verdicts[0] == (fine, fine), name

    def test_the_watched_dicts_are_not_read_while_unchanged(self):
        from graphmodule import _dictwatch

        if not _dictwatch.available():
            pytest.skip("dict watchers need CPython 3.12+")
        step, net, *_ = _program()
        w = Watch(step)
        assert w.check()
        assert len(w._u_containers) < len(w._containers) / 4  # most places are dict entries
        # what the check compares for the dict places, made wrong behind the watcher's back:
        # unseen while no dict changes, seen once one does
        n = len(w._u_containers)
        w._place_objects[n:] = [object()] * (len(w._place_objects) - n)
        assert w.check()
        net.note = "a change to a watched dict"
        assert not w.check()


CFG = {"tau": 0.5, "explore": True, "optim": {"lr": 0.1}}
SCALES = [2.0]


def _uses_cfg(x):
    y = x * CFG["tau"] + CFG["optim"]["lr"]
    return y + 1 if CFG["explore"] else y - 1


def _uses_last(x):
    return x * SCALES[-1]


class TestContainers:
    """Python scalars inside lists and dicts a function reads are baked into the graph."""

    @pytest.fixture(autouse=True)
    def _restore(self):
        saved_cfg, saved_scales = {**CFG, "optim": dict(CFG["optim"])}, list(SCALES)
        yield
        CFG.clear()
        CFG.update(saved_cfg)
        SCALES[:] = saved_scales

    def _captured(self, fn, backend="simulate", x=X, **options):
        g = CudaGraphModule(fn, warmup=1, backend=backend, **options)
        for _ in range(3):
            g(x)
        return g

    def test_a_scalar_in_a_dict(self, graph_backend, ones):
        g = self._captured(_uses_cfg, graph_backend, ones)
        CFG["tau"] = 0.7
        with pytest.raises(StaleGraphError) as info:
            g(ones)
        assert str(info.value).splitlines()[:2] == [
            "CudaGraphModule(_uses_cfg) was captured reading state that has changed since:",
            "  global 'CFG' read by _uses_cfg: {'explore': True, 'tau': 0.5} at capture, {'explore': True, 'tau': "
            "0.7} now (the graph uses {'explore': True, 'tau': 0.5})",
        ]

    def test_a_scalar_in_a_list(self, graph_backend, ones):
        g = self._captured(_uses_last, graph_backend, ones)
        SCALES[0] = 3.0
        with pytest.raises(StaleGraphError) as info:
            g(ones)
        assert str(info.value).splitlines()[1] == (
            "  global 'SCALES' read by _uses_last: [2.0] at capture, [3.0] now (the graph uses [2.0])")

    def test_a_list_that_grew(self):
        g = self._captured(_uses_last)
        SCALES.append(5.0)  # the function reads SCALES[-1]
        with pytest.raises(StaleGraphError) as info:
            g(X)
        assert str(info.value).splitlines()[1] == (
            "  global 'SCALES' read by _uses_last: [2.0] at capture, [2.0, 5.0] now (the graph uses [2.0])")

    def test_a_scalar_in_a_nested_dict(self):
        g = self._captured(_uses_cfg)
        CFG["optim"]["lr"] = 0.2
        with pytest.raises(StaleGraphError) as info:
            g(X)
        assert str(info.value).splitlines()[1] == (
            "  global 'CFG' read by _uses_cfg['optim']: {'lr': 0.1} at capture, {'lr': 0.2} now (the graph uses "
            "{'lr': 0.1})")

    def test_a_branch_on_a_flag_changed_every_step_is_recaptured(self, graph_backend, ones):
        g = self._captured(_uses_cfg, graph_backend, ones, on_stale="recapture")
        for step in range(6):
            CFG["explore"] = step % 2 == 0
            torch.testing.assert_close(g(ones), _uses_cfg(ones))
        assert g.stats.recaptures > 0

    def test_an_equal_value_rebound_is_fine(self):
        g = self._captured(_uses_cfg)
        CFG["tau"] = float("0.5")  # another object, the same value
        SCALES[0] = float("2.0")
        replays = g.stats.replays
        torch.testing.assert_close(g(X), _uses_cfg(X))
        assert g.stats.replays == replays + 1

    def test_a_log_on_an_object_the_function_mentions_is_not_watched(self):
        class Agent:
            def __init__(self):
                self.net = nn.Linear(3, 3)
                self.stats = {"calls": 0}  # written by the training loop, never read by act

            def act(self, x):
                return self.net(x)

        agent = Agent()
        g = CudaGraphModule(agent.act, warmup=1, backend="simulate")
        with torch.no_grad():
            for step in range(5):
                agent.stats["calls"] = step
                torch.testing.assert_close(g(X), agent.net(X))
        assert g.stats.captures == 1 and g.stats.recaptures == 0


class Cfg(dict):
    """A user's dict subclass, as configs often are."""


# each a fresh config holding {"scale": 2.0}: a plain dict, and the dict types users hold
# configs in, which the function reads as it reads a plain dict
DICT_TYPES = {
    "dict": lambda: {"scale": 2.0},
    "OrderedDict": lambda: OrderedDict(scale=2.0),
    "defaultdict": lambda: defaultdict(float, scale=2.0),
    "subclass": lambda: Cfg(scale=2.0),
}


def _scaled_by(cfg):
    def f(x):
        return x * cfg["scale"] + 1

    return f


def _logs_into(cfg):
    def f(x):
        y = x * cfg["scale"]
        cfg["last"] = y.sum()  # a new tensor at every call: a replay would not bind it
        return y

    return f


def _reads_missing(cfg, key):
    def f(x):
        return x * (2.0 + cfg[key[0]])  # a defaultdict inserts the key it misses

    return f


@pytest.mark.parametrize("kind", list(DICT_TYPES))
class TestDictTypes:
    """A config held in any dict type (``OrderedDict``, ``defaultdict``, a subclass) and read
    by the function is served and watched as a plain dict is; its writes refused as a plain
    dict's. Each case runs the plain function on a twin config beside the wrapper."""

    def _pair(self, kind, make_fn=_scaled_by, **options):
        cfg, twin = DICT_TYPES[kind](), DICT_TYPES[kind]()
        g = CudaGraphModule(make_fn(cfg), warmup=2, backend=options.pop("backend"), **options)
        return cfg, twin, g, make_fn(twin)

    def test_a_read_is_served(self, kind, graph_backend):
        cfg, twin, g, plain = self._pair(kind, backend=graph_backend)
        for i in range(6):
            x = torch.randn(2, 3)
            torch.testing.assert_close(g(x), plain(x))
        assert g.state == "captured" and g.stats.captures == 1
        assert type(cfg) is type(twin) and list(cfg.items()) == list(twin.items())

    def test_a_changed_value_makes_the_graph_stale(self, kind, graph_backend):
        cfg, twin, g, plain = self._pair(kind, backend=graph_backend)
        x = torch.ones(2, 3)
        for _ in range(4):
            g(x)
        cfg["scale"] = 3.0
        with pytest.raises(StaleGraphError) as info:
            g(x)
        assert str(info.value).splitlines()[:2] == [
            "CudaGraphModule(f) was captured reading state that has changed since:",
            "  closure variable 'cfg' of _scaled_by.<locals>.f: {'scale': 2.0} at capture, {'scale': 3.0} now "
            "(the graph uses {'scale': 2.0})",
        ]

    def test_a_changed_value_is_recaptured(self, kind, graph_backend):
        cfg, twin, g, plain = self._pair(kind, backend=graph_backend, on_stale="recapture")
        for step in range(8):
            if step >= 3:  # after the capture: a new value at every call
                cfg["scale"] = twin["scale"] = float(step)
            x = torch.randn(2, 3)
            torch.testing.assert_close(g(x), plain(x))
        assert g.stats.recaptures > 0

    def test_a_replaced_tensor_makes_the_graph_stale(self, kind, graph_backend):
        # a tensor entry is read by address; its dict may be watched (dict watchers) or read
        cfg = DICT_TYPES[kind]()
        cfg["w"] = torch.ones(3)

        def f(x):
            return x * cfg["w"]

        g = CudaGraphModule(f, warmup=1, backend=graph_backend)
        for _ in range(3):
            x = torch.randn(2, 3)
            torch.testing.assert_close(g(x), x * cfg["w"])
        cfg["w"] = torch.full((3,), 2.0)
        with pytest.raises(StaleGraphError) as info:
            g(torch.ones(2, 3))
        assert str(info.value).splitlines()[1] == (
            "  closure variable 'cfg' of TestDictTypes.test_a_replaced_tensor_makes_the_graph_stale.<locals>.f"
            "['w']: another tensor (the graph reads the old one's memory)")

    def test_a_write_is_refused_as_for_a_plain_dict(self, kind, graph_backend):
        cfg, twin, g, plain = self._pair(kind, make_fn=_logs_into, backend=graph_backend)
        x = torch.ones(2, 3)
        for _ in range(2):
            torch.testing.assert_close(g(x), plain(x))
        with pytest.raises(UnsupportedError) as info:
            g(x)
        assert str(info.value).splitlines()[0] == (
            "CudaGraphModule(f) cannot replay this call as a CUDA graph: the function changes Python state, which "
            "a replay (GPU work only) would not: closure variable 'cfg' of _logs_into.<locals>.f "
            f"({type(cfg).__name__}) was modified in place.")


OD_CFG, DD_CFG, SUB_CFG = OrderedDict(scale=2.0), defaultdict(float, scale=2.0), Cfg(scale=2.0)


def _uses_od_cfg(x):
    return x * OD_CFG["scale"]


def _uses_dd_cfg(x):
    return x * DD_CFG["scale"]


def _uses_sub_cfg(x):
    return x * SUB_CFG["scale"]


@pytest.mark.parametrize("fn, cfg", [(_uses_od_cfg, OD_CFG), (_uses_dd_cfg, DD_CFG), (_uses_sub_cfg, SUB_CFG)],
                         ids=["OrderedDict", "defaultdict", "subclass"])
def test_a_global_config_of_a_dict_type(fn, cfg, graph_backend):
    g = CudaGraphModule(fn, warmup=2, backend=graph_backend)
    try:
        for _ in range(4):
            x = torch.randn(2, 3)
            torch.testing.assert_close(g(x), fn(x))
        assert g.stats.captures == 1
        cfg["scale"] = 3.0
        with pytest.raises(StaleGraphError) as info:
            g(x)
        assert str(info.value).splitlines()[1] == (
            f"  global '{fn.__code__.co_names[0]}' read by {fn.__name__}: {{'scale': 2.0}} at capture, "
            "{'scale': 3.0} now (the graph uses {'scale': 2.0})")
    finally:
        cfg["scale"] = 2.0

class TestDefaultdictMissingKeys:
    """A ``defaultdict`` read at a key it lacks inserts it: eagerly at the first call that reads
    it, then never again. The wrapper inserts it at the same call (a warmup call, or the
    capturing one), and its replays, like eager's later calls, insert nothing."""

    def _pair(self, backend, factory=float, **options):
        made = []
        for _ in range(2):
            cfg, key = defaultdict(factory, a=1.0), ["a"]
            made.append((cfg, key, _reads_missing(cfg, key)))
        (cfg, key, f), (twin, twin_key, plain) = made
        return cfg, key, CudaGraphModule(f, warmup=1, backend=backend, **options), twin, twin_key, plain

    def test_a_key_first_read_by_a_warmup_call(self, graph_backend):
        cfg, key, g, twin, twin_key, plain = self._pair(graph_backend)
        key[0] = twin_key[0] = "b"
        for _ in range(5):
            x = torch.randn(2, 3)
            torch.testing.assert_close(g(x), plain(x))
            assert list(cfg.items()) == list(twin.items())
        assert list(cfg.items()) == [("a", 1.0), ("b", 0.0)] and g.stats.captures == 1

    def test_a_key_first_read_by_the_capturing_call(self, graph_backend):
        cfg, key, g, twin, twin_key, plain = self._pair(graph_backend)
        for step in range(6):
            if step == 1:  # the capturing call is the first to read "b"
                key[0] = twin_key[0] = "b"
            x = torch.randn(2, 3)
            torch.testing.assert_close(g(x), plain(x))
            assert list(cfg.items()) == list(twin.items())
        assert list(cfg.items()) == [("a", 1.0), ("b", 0.0)]
        assert g.state == "captured" and g.stats.captures == 1 and g.stats.replays == 5

    def test_a_deleted_key_makes_the_graph_stale(self, graph_backend):
        cfg, key, g, twin, twin_key, plain = self._pair(graph_backend)
        key[0] = twin_key[0] = "b"
        x = torch.ones(2, 3)
        for _ in range(3):
            g(x)
        del cfg["b"]
        with pytest.raises(StaleGraphError) as info:
            g(x)
        assert str(info.value).splitlines()[1] == (
            "  closure variable 'cfg' of _reads_missing.<locals>.f: {'a': 1.0, 'b': 0.0} at capture, {'a': 1.0} "
            "now (the graph uses {'a': 1.0, 'b': 0.0})")

    def test_a_deleted_key_is_recaptured(self, graph_backend):
        cfg, key, g, twin, twin_key, plain = self._pair(graph_backend, on_stale="recapture")
        key[0] = twin_key[0] = "b"
        for step in range(8):
            if step in (3, 5):
                del cfg["b"], twin["b"]
            x = torch.randn(2, 3)
            torch.testing.assert_close(g(x), plain(x))
            assert list(cfg.items()) == list(twin.items())
        assert g.stats.recaptures == 2

    def test_a_container_default_inserted_by_the_capture_is_refused(self, graph_backend):
        # a new list may be filled by the function afterwards, which a replay would not do
        cfg, key = defaultdict(list), ["a"]

        def f(x):
            return x * (len(cfg[key[0]]) + 1)

        g = CudaGraphModule(f, warmup=1, backend=graph_backend)
        x = torch.ones(2, 3)
        g(x)
        key[0] = "b"
        with pytest.raises(UnsupportedError) as info:
            g(x)
        assert str(info.value).splitlines()[0].endswith(
            "closure variable 'cfg' of TestDefaultdictMissingKeys.test_a_container_default_inserted_by_the_capture"
            "_is_refused.<locals>.f (defaultdict) was modified in place.")


class TestNestedWrappers:
    """A wrapper called inside another's capture runs inline: the outer graph reads what the
    inner function reads, not the inner wrapper's own graphs and counters."""

    def _rollout(self, backend):
        net = nn.Linear(3, 3)
        policy = CudaGraphModule(net, max_graphs=3, on_graph_limit="evict", backend=backend)

        def rollout(obs):
            for _ in range(4):
                obs = obs * 0.5 + policy(obs).tanh()
            return obs

        def plain(obs):
            for _ in range(4):
                obs = obs * 0.5 + net(obs).tanh()
            return obs

        return net, policy, rollout, plain

    def test_the_readme_example(self, graph_backend):
        net, policy, rollout, plain = self._rollout(graph_backend)
        graphed = CudaGraphModule(rollout, backend=graph_backend)
        with torch.no_grad():
            for step in range(6):
                obs = torch.full((8, 3), 0.1 * step)
                torch.testing.assert_close(graphed(obs), plain(obs))
                small = torch.full((2, 3), -0.1 * step)  # the policy alone, another batch size
                torch.testing.assert_close(policy(small), net(small))
        assert graphed.stats.captures == 1 and graphed.stats.recaptures == 0
        assert policy.stats.inline_calls >= 4 and policy.stats.graphs == 2

    def test_what_the_inner_function_reads_is_still_watched(self):
        net, policy, rollout, _ = self._rollout("simulate")
        graphed = CudaGraphModule(rollout, backend="simulate")
        with torch.no_grad():
            for _ in range(3):
                graphed(X)
            net.weight = nn.Parameter(torch.zeros(3, 3))
            with pytest.raises(StaleGraphError) as info:
                graphed(X)
        assert str(info.value).splitlines()[1] == (
            "  closure variable 'policy' of TestNestedWrappers._rollout.<locals>.rollout.module.weight: another "
            "tensor (the graph reads the old one's memory)")

    def test_the_inner_wrapper_rebound(self):
        inner = CudaGraphModule(lambda x: x * 2, backend="simulate")
        holder = {"f": inner}
        graphed = CudaGraphModule(lambda x: holder["f"](x) + 1, backend="simulate")
        for _ in range(3):
            graphed(X)
        holder["f"] = CudaGraphModule(lambda x: x * 3, backend="simulate")
        with pytest.raises(StaleGraphError, match=r"closure variable 'holder' of .*\['f'\]: another CudaGraphModule"):
            graphed(X)


def test_a_watch_goes_with_its_graph_without_the_collector():
    """The watch holds no reference to itself (a per-call check bound to it and kept on it
    would): a deleted wrapper's watch, and the tensors it reads, go at once, not when the
    collector runs."""
    import gc
    import weakref

    g = CudaGraphModule(lambda x: x * 2 + 1, warmup=1, backend="simulate")
    for _ in range(3):
        g(torch.ones(3))
    watch = weakref.ref(g._graphs.entries[0].watch)
    gc.disable()
    try:
        del g
        assert watch() is None
    finally:
        gc.enable()
