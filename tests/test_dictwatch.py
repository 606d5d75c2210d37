"""Dict watchers: every change of a watched dict raises the flags registered for it."""

import gc
import sys

import pytest
from torch import nn

from graphmodule import _dictwatch
from graphmodule._dictwatch import Flag

needs_watchers = pytest.mark.skipif(not _dictwatch.available(), reason="dict watchers need CPython 3.12+")


def test_available_where_cpython_has_dict_watchers():
    expected = sys.implementation.name == "cpython" and sys.version_info >= (3, 12)
    if getattr(sys, "_is_gil_enabled", lambda: True)() is False:
        expected = False
    assert _dictwatch.available() is expected


def test_unavailable_watch_registers_nothing(monkeypatch):
    monkeypatch.setattr(_dictwatch, "_API", [None])
    d, flag = {"a": 1}, Flag()
    assert _dictwatch.watch([d], flag) is False
    assert not _dictwatch.watchable(d, instance_dict=False)
    assert id(d) not in _dictwatch._owners


def _down(d: dict) -> Flag:
    flag = Flag()
    assert _dictwatch.watch([d], flag)
    flag.raised = False
    return flag


@needs_watchers
@pytest.mark.parametrize("change", [
    lambda d: d.__setitem__("a", 2),
    lambda d: d.__setitem__("new", 1),
    lambda d: d.pop("a"),
    lambda d: d.clear(),
    lambda d: d.update(b=3),
    lambda d: d.setdefault("c", 4),
    lambda d: d.popitem(),
], ids=["modify", "add", "pop", "clear", "update", "setdefault", "popitem"])
def test_every_change_raises_the_flag(change):
    d = {"a": 1, "b": 2}
    flag = _down(d)
    change(d)
    assert flag.raised


@needs_watchers
def test_storing_the_same_object_and_reading_do_not():
    value = object()
    d = {"a": value}
    flag = _down(d)
    d["a"] = value
    _ = d["a"], d.get("a"), list(d.items()), "a" in d
    assert not flag.raised


@needs_watchers
def test_only_the_registered_dicts_raise_it():
    d, other = {"a": 1}, {"a": 1}
    flag = _down(d)
    other["a"] = 2
    assert not flag.raised


@needs_watchers
def test_two_flags_on_one_dict_and_release():
    d = {"a": 1}
    first, second = _down(d), _down(d)
    d["a"] = 2
    assert first.raised and second.raised
    del first
    gc.collect()
    second.raised = False
    d["a"] = 3
    assert second.raised  # still watched for the flag left
    del second
    gc.collect()
    assert id(d) not in _dictwatch._owners  # the last flag gone: unwatched


@needs_watchers
def test_module_parameters_and_attributes():
    """The ways a module's state is replaced reach the flag: a parameter assigned, the
    ``_parameters`` dict written directly (tensordict's ``to_module``), an attribute."""
    lin = nn.Linear(2, 2)
    flag = Flag()
    instance = _dictwatch.watchable(lin.__dict__, instance_dict=True)
    assert _dictwatch.watch([lin._parameters] + ([lin.__dict__] if instance else []), flag)
    for change in (lambda: setattr(lin, "weight", nn.Parameter(lin.weight.detach().clone())),
                   lambda: lin._parameters.__setitem__("bias", nn.Parameter(lin.bias.detach().clone())),
                   lambda: lin.load_state_dict(lin.state_dict(), assign=True)):
        flag.raised = False
        change()
        assert flag.raised
    if instance:
        for i in range(20):  # the same store instruction many times (specialized bytecode)
            flag.raised = False
            lin.scale = float(i)
            assert flag.raised
