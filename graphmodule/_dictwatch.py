"""Dict watchers: a flag raised when a dict changes, so a check can skip what did not.

The staleness check (:class:`~graphmodule._stale.Watch`) reads, at every replay, every
place a graph's parameters, buffers, optimizer state and module attributes are held in.
Almost all of those places are dict entries (``module._parameters``, ``module.__dict__``,
``optimizer.state[p]``, a param group): on CPython 3.12 and later (PEP 699's dict watchers,
``PyDict_AddWatcher``), graphmodule registers one watcher whose callback raises the flags
of the checks that read a dict when it changes. A check whose flag is down reads only the
places no watcher covers (lists, closure cells, a module's globals); the cost of the rest
no longer grows with the number of places.

The callback runs on every change of a watched dict (some 1 µs each: ``model.train()``
every step costs that, then one full check); a dict nobody's check reads any more is
unwatched when the last check that read it goes.

Where watchers are missing (older Python, another implementation, all eight watcher slots
taken) or do not see every change (an instance ``__dict__`` written through inline values:
probed once, at first use), :func:`watchable` says so and the check reads every place, as
without this module.

    >>> from graphmodule._dictwatch import Flag, watch
    >>> d, flag = {"w": 1}, Flag()
    >>> watch([d], flag)  # False where dict watchers are unavailable
    ... # doctest: +SKIP
    >>> d["w"] = 2; flag.raised  # doctest: +SKIP
    True
"""

from __future__ import annotations

import atexit
import ctypes
import sys
import weakref
from typing import Any

__all__ = ["Flag", "available", "watch", "watchable"]

_DEALLOCATED = 5  # PyDict_WatchEvent


class Flag:
    """Raised (``raised = True``) when a dict it was registered for changes."""

    __slots__ = ("raised", "__weakref__")

    def __init__(self) -> None:
        self.raised = True  # a new flag: nothing verified yet


_owners: dict[int, weakref.WeakSet] = {}  # id of a watched dict -> the flags it raises


def _callback(event: int, address: int, key: int, value: int) -> int:
    # (addresses only: taking a reference to a dict being deallocated would resurrect it)
    try:
        flags = _owners.pop(address, None) if event == _DEALLOCATED else _owners.get(address)
        if flags:
            for flag in flags:
                flag.raised = True
    except BaseException:  # noqa: BLE001 - a watcher callback must not raise
        pass
    return 0


class _Api:
    """The C functions, bound once; ``None`` where unavailable."""

    def __init__(self) -> None:
        api = ctypes.pythonapi
        self.callback_type = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                               ctypes.c_void_p)
        self.callback = self.callback_type(_callback)  # kept alive: the interpreter holds its address
        add, self._watch, self._unwatch, clear = (api.PyDict_AddWatcher, api.PyDict_Watch, api.PyDict_Unwatch,
                                                  api.PyDict_ClearWatcher)
        add.argtypes, add.restype = [self.callback_type], ctypes.c_int
        for fn in (self._watch, self._unwatch):
            fn.argtypes, fn.restype = [ctypes.c_int, ctypes.py_object], ctypes.c_int
        clear.argtypes, clear.restype = [ctypes.c_int], ctypes.c_int
        self.id = add(self.callback)
        if self.id < 0:  # all eight watcher slots taken
            ctypes.pythonapi.PyErr_Clear()
            raise RuntimeError("no dict watcher slot left")
        # before the interpreter tears down ctypes: dicts freed at exit must not call back
        atexit.register(clear, self.id)
        self.instance_dicts = _probe_instance_dicts(self)

    def watch(self, d: dict) -> None:
        if self._watch(self.id, d) < 0:
            raise RuntimeError("PyDict_Watch failed")

    def unwatch(self, d: dict) -> None:
        self._unwatch(self.id, d)


def _probe_instance_dicts(api: _Api) -> bool:
    """Whether a change to an object's attribute, by each way Python and torch make one,
    reaches the watcher of its (materialized) ``__dict__``. CPython 3.13 writes inline
    values without telling watchers in some of these ways: instance dicts are then read at
    every check."""

    class Plain:
        pass

    class Custom:  # as nn.Module: a __setattr__ that ends in object.__setattr__
        def __setattr__(self, name: str, value: Any) -> None:
            super().__setattr__(name, value)

    def store(obj: Any, n: int) -> int:  # the same instruction many times: specialized
        seen = 0
        for i in range(n):
            flag.raised = False
            obj.a = i + 1
            seen += flag.raised
        return seen

    flag = Flag()
    for cls in (Plain, Custom):
        obj = cls()
        obj.a = 0
        d = vars(obj)
        _owners[id(d)] = weakref.WeakSet([flag])
        try:
            api.watch(d)
            if store(obj, 64) != 64:
                return False
            for change in (lambda: setattr(obj, "a", -1), lambda: object.__setattr__(obj, "a", -2),
                           lambda: d.__setitem__("a", -3), lambda: setattr(obj, "b", 1)):
                flag.raised = False
                change()
                if not flag.raised:
                    return False
        finally:
            _owners.pop(id(d), None)
            api.unwatch(d)
    return True


_API: list[Any] = []  # [] not tried yet; [None] unavailable; [_Api]


def _api() -> _Api | None:
    if not _API:
        api = None
        if sys.implementation.name == "cpython" and sys.version_info >= (3, 12) and _gil_enabled():
            try:
                api = _Api()
            except (AttributeError, RuntimeError, OSError):
                api = None
        _API.append(api)
    return _API[0]


def _gil_enabled() -> bool:
    check = getattr(sys, "_is_gil_enabled", None)
    return check() if check is not None else True


def available() -> bool:
    """Whether dict watchers work in this interpreter."""
    return _api() is not None


def watchable(d: Any, instance_dict: bool) -> bool:
    """Whether changes to ``d`` reach a watcher (``instance_dict``: it is an object's
    ``__dict__``, which some interpreters change without telling watchers)."""
    api = _api()
    return api is not None and isinstance(d, dict) and (api.instance_dicts or not instance_dict)


def watch(dicts: list[dict], flag: Flag) -> bool:
    """Raise ``flag`` whenever one of ``dicts`` changes, for as long as ``flag`` lives; the
    flag is left as it was. False (nothing registered) where watchers are unavailable."""
    api = _api()
    if api is None:
        return False
    distinct = list({id(d): d for d in dicts}.values())
    for d in distinct:
        owners = _owners.get(id(d))
        if owners is None:
            api.watch(d)
            owners = _owners[id(d)] = weakref.WeakSet()
        owners.add(flag)
    weakref.finalize(flag, _release, api, distinct).atexit = False
    return True


def _release(api: _Api, dicts: list[dict]) -> None:
    """The last flag of a dict went: the dict is unwatched (its changes cost nothing again)."""
    for d in dicts:
        owners = _owners.get(id(d))
        if owners is not None and not any(True for _ in owners):  # (live flags only)
            del _owners[id(d)]
            try:
                api.unwatch(d)
            except Exception:  # noqa: BLE001 - the watcher already cleared (at exit)
                pass
