"""What a module's code reads besides its parameters: changed after the capture, the next call
is eager's (``on_stale="recapture"``) or raises :class:`StaleGraphError` naming it.

Each test builds a module whose ``forward`` reads a Python value from a place the walk over
modules and functions alone does not reach (a module global, a class attribute, a dataclass
field, a tuple, an Enum, a dtype, a numpy value, a list of tensors), captures, changes the value,
and calls the wrapper beside the plain module.
"""

import dataclasses
import enum

import numpy as np
import pytest
import torch
from torch import nn

from graphmodule import CudaGraphModule, StaleGraphError, UnsupportedError
from tests.test_stale import X, _captured  # (a module captured on X, simulated)

SCALE = 2.0
LEVEL = np.array(2.0)  # a global numpy 0-d array, written in place by the tests


@pytest.fixture(autouse=True)
def _globals_restored():
    """The module globals the tests rebind or write, as they were, after each test."""
    yield
    global SCALE
    SCALE = 2.0
    LEVEL[...] = 2.0


class Mode(enum.Enum):
    PLAIN = 1
    SHIFTED = 2


@dataclasses.dataclass
class Config:
    gain: float = 1.0


@dataclasses.dataclass(frozen=True)
class Frozen:
    gain: float = 1.0


def _stale(g) -> list[tuple[str, str]]:
    with torch.no_grad(), pytest.raises(StaleGraphError) as info:
        g(X)
    return info.value.changes


def _as_eagerly(module, change):
    """Captured with ``on_stale="recapture"``, changed: the next calls are eager's."""
    g = _captured(module, on_stale="recapture")
    change()
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(g(X), module(X), rtol=0, atol=0)
    assert g.stats.recaptures == 1


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(x) * SCALE


class TestModuleGlobals:
    def test_global_rebound(self):
        global SCALE
        net = Scaled()
        g = _captured(net)
        SCALE = 3.0
        assert _stale(g) == [("global 'SCALE' read by Scaled.forward",
                              "2.0 at capture, 3.0 now (the graph uses 2.0)")]

    def test_global_rebound_recaptures(self):
        _as_eagerly(Scaled(), lambda: globals().update(SCALE=3.0))

    def test_global_read_by_a_helper_method(self):
        class Helped(Scaled):
            def forward(self, x):
                return self._scaled(self.lin(x))

            def _scaled(self, y):
                return y * SCALE

        _as_eagerly(Helped(), lambda: globals().update(SCALE=4.0))

    def test_global_numpy_array_written_in_place(self):
        class Leveled(Scaled):
            def forward(self, x):
                return self.lin(x) * float(LEVEL)

        net = Leveled()
        g = _captured(net)
        LEVEL[...] = 3.0
        assert _stale(g) == [("global 'LEVEL' read by TestModuleGlobals.test_global_numpy_array_written_in_place"
                              ".<locals>.Leveled.forward", "array(2.) at capture, array(3.) now (the graph uses "
                              "array(2.))")]
        _as_eagerly(net, lambda: LEVEL.fill(4.0))


CALLS = 0


class TestModuleGlobalsChanged:
    def test_a_forward_that_counts_in_a_global_is_refused_at_capture(self):
        class Counted(Scaled):
            def forward(self, x):
                global CALLS
                CALLS += 1
                return self.lin(x)

        g = CudaGraphModule(Counted(), warmup=1, backend="simulate")
        with torch.no_grad(), pytest.raises(UnsupportedError) as info:
            for _ in range(2):
                g(X)
        assert "global 'CALLS' of TestModuleGlobalsChanged.test_a_forward_that_counts_in_a_global_is_refused_at_" \
               "capture.<locals>.Counted.forward was rebound" in str(info.value)


class Shaped(nn.Module):
    cut = 1.5  # a class attribute

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.shape = (2, 3)
        self._order = (1, 0)
        self.mode = Mode.PLAIN
        self.dtype = torch.float32
        self.gain = np.float32(2.0)
        self.config = Config()
        self.frozen = Frozen()
        self.extra = [torch.zeros(1)]

    def forward(self, x):
        y = self.lin(x).reshape(*self.shape).permute(*self._order)
        y = y.permute(*self._order) * self.cut * float(self.gain) * self.config.gain * self.frozen.gain
        if self.mode is Mode.SHIFTED:
            y = y + 1
        for t in self.extra:
            y = y + t
        return y.to(self.dtype)


class TestAttributes:
    @pytest.mark.parametrize("name, value, shown", [
        ("shape", (3, 2), "(2, 3) at capture, (3, 2) now (the graph uses (2, 3))"),
        ("_order", (0, 1), "(1, 0) at capture, (0, 1) now (the graph uses (1, 0))"),
        ("mode", Mode.SHIFTED, "<Mode.PLAIN: 1> at capture, <Mode.SHIFTED: 2> now (the graph uses <Mode.PLAIN: 1>)"),
        ("dtype", torch.float64, "torch.float32 at capture, torch.float64 now (the graph uses torch.float32)"),
        ("gain", np.float32(3.0), "np.float32(2.0) at capture, np.float32(3.0) now (the graph uses np.float32(2.0))"),
        ("frozen", Frozen(3.0), "another Frozen object"),
    ])
    def test_rebound(self, name, value, shown):
        net = Shaped()
        g = _captured(net)
        setattr(net, name, value)
        assert _stale(g) == [(f"module.{name}", shown)]

    @pytest.mark.parametrize("name, value", [
        ("shape", (3, 2)), ("_order", (0, 1)), ("mode", Mode.SHIFTED), ("dtype", torch.float64),
        ("gain", np.float32(3.0)), ("config", Config(3.0)), ("frozen", Frozen(3.0)),
    ])
    def test_rebound_recaptures(self, name, value):
        net = Shaped()
        _as_eagerly(net, lambda: setattr(net, name, value))

    def test_equal_value_rebound_is_fine(self):
        net = Shaped()
        g = _captured(net)
        net.shape, net.gain, net.dtype = (2, 3), np.float32(2.0), torch.float32
        with torch.no_grad():
            torch.testing.assert_close(g(X), net(X))
        assert g.stats.recaptures == 0

    def test_dataclass_field_set(self):
        net = Shaped()
        g = _captured(net)
        net.config.gain = 3.0
        assert _stale(g) == [("module.config.gain", "1.0 at capture, 3.0 now (the graph uses 1.0)")]
        other = Shaped()
        _as_eagerly(other, lambda: setattr(other.config, "gain", 3.0))

    def test_class_attribute(self):
        net = Shaped()
        g = _captured(net)
        try:
            Shaped.cut = 3.0
            assert _stale(g) == [("module.cut (class attribute of Shaped)",
                                  "1.5 at capture, 3.0 now (the graph uses 1.5)")]
        finally:
            Shaped.cut = 1.5

    def test_class_attribute_shadowed_on_the_instance(self):
        net = Shaped()
        _as_eagerly(net, lambda: setattr(net, "cut", 3.0))

    def test_class_attribute_recaptures(self):
        try:
            _as_eagerly(Shaped(), lambda: setattr(Shaped, "cut", 3.0))
        finally:
            Shaped.cut = 1.5


class TestListsOfTensors:
    def test_entry_replaced(self):
        net = Shaped()
        g = _captured(net)
        net.extra[0] = torch.ones(1)
        assert _stale(g) == [("module.extra[0]", "another tensor (the graph reads the old one's memory)")]

    def test_entry_replaced_recaptures(self):
        net = Shaped()
        _as_eagerly(net, lambda: net.extra.__setitem__(0, torch.ones(1)))

    def test_entry_appended_recaptures(self):
        net = Shaped()
        _as_eagerly(net, lambda: net.extra.append(torch.ones(1)))

    def test_entry_written_in_place_is_fine(self):
        net = Shaped()
        g = _captured(net)
        net.extra[0].fill_(5.0)
        with torch.no_grad():
            torch.testing.assert_close(g(X), net(X))
        assert g.stats.recaptures == 0


class TestCallableObjects:
    def test_call_method_reads_a_global(self):
        class Policy:
            def __init__(self):
                self.net = nn.Linear(3, 3)

            def __call__(self, x):
                return self.net(x) * SCALE

        global SCALE
        policy = Policy()
        g = _captured(policy, on_stale="recapture")
        SCALE = 5.0
        with torch.no_grad():
            torch.testing.assert_close(g(X), policy(X))

    def test_function_reads_a_global_dataclass_field(self):
        config = Config()
        net = nn.Linear(3, 3)

        def step(x):
            return net(x) * config.gain

        g = _captured(step)
        config.gain = 3.0
        assert _stale(g) == [("closure variable 'config' of TestCallableObjects.test_function_reads_a_global_"
                              "dataclass_field.<locals>.step.gain", "1.0 at capture, 3.0 now (the graph uses 1.0)")]

    def test_bound_method_reads_its_object(self):
        class Agent:
            def __init__(self):
                self.net, self.temperature = nn.Linear(3, 3), 1.0

            def act(self, x):
                return self.net(x) / self.temperature

        agent = Agent()
        g = _captured(agent.act)
        agent.temperature = 2.0
        assert _stale(g) == [("the wrapped callable.temperature", "1.0 at capture, 2.0 now (the graph uses 1.0)")]


class TestContainersRead:
    def test_dict_attribute_entry(self):
        class Weighted(Scaled):
            def __init__(self):
                super().__init__()
                self.coefs = {"tau": 0.5}

            def forward(self, x):
                return self.lin(x) * self.coefs["tau"]

        net = Weighted()
        g = _captured(net)
        net.coefs["tau"] = 0.25
        assert _stale(g) == [("module.coefs", "{'tau': 0.5} at capture, {'tau': 0.25} now (the graph uses "
                                              "{'tau': 0.5})")]

    def test_a_tensor_over_the_same_memory_is_fine(self):
        net = Shaped()
        g = _captured(net)
        net.extra[0] = net.extra[0].view(1)  # another object, the same memory and layout
        with torch.no_grad():
            for _ in range(2):
                torch.testing.assert_close(g(X), net(X))
        assert g.stats.recaptures == 0


_CHANGES = {
    "global": lambda net: globals().update(SCALE=3.0),
    "global numpy array in place": lambda net: LEVEL.fill(3.0),
    "tuple": lambda net: setattr(net, "_order", (0, 1)),
    "Enum": lambda net: setattr(net, "mode", Mode.SHIFTED),
    "dtype": lambda net: setattr(net, "dtype", torch.float64),
    "numpy scalar": lambda net: setattr(net, "gain", np.float32(3.0)),
    "dataclass field": lambda net: setattr(net.config, "gain", 3.0),
    "dataclass rebound": lambda net: setattr(net, "config", Config(3.0)),
    "class attribute": lambda net: setattr(type(net), "cut", 3.0),
    "list entry": lambda net: net.extra.__setitem__(0, torch.ones(1)),
}


class Everything(Shaped):
    def forward(self, x):
        return super().forward(x) * SCALE * float(LEVEL)


@pytest.mark.parametrize("change", sorted(_CHANGES))
def test_served_as_eagerly_on_each_backend(change, graph_backend, ones):
    """The same changes on the simulated backend and on real CUDA graphs (where a replay that
    missed them would silently give the capture's values)."""
    net = Everything()
    g = CudaGraphModule(net, warmup=1, backend=graph_backend, on_stale="recapture")
    try:
        with torch.no_grad():
            for _ in range(2):
                g(ones)
            _CHANGES[change](net)
            for _ in range(3):
                torch.testing.assert_close(g(ones), net(ones), rtol=0, atol=0)
        assert g.stats.recaptures == 1
    finally:
        if "cut" in vars(Everything):
            del Everything.cut
