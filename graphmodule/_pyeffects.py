"""The Python state a function changes, which a replay would not redo: closure variables and
the globals its code reads or writes, and the lists, dicts and sets they hold (any dict type),
snapshot before the capture (:class:`PythonEffects`) and compared after it.

A replay runs no Python, so ``nonlocal step; step += 1`` or ``losses.append(...)`` in the
function would happen once, at capture, instead of at every call: the capture is refused,
naming each change (:class:`Change`), and what a refused module hook changed is put back.

    >>> log = []
    >>> def f():
    ...     log.append(1)
    >>> effects = PythonEffects([(f, "f")])
    >>> f()
    >>> effects.changes()
    ["global 'log' of f (list) was modified in place"]
"""

from __future__ import annotations

import functools
import types
from collections import defaultdict
from operator import getitem, is_
from typing import Any, Callable, NamedTuple

from ._discover import _EMPTY, _SCALARS, _Cell, _global_names, containers_in
from ._spec import same_constant

__all__ = ["Change", "PythonEffects", "refill"]


class _Shallow(NamedTuple):
    """What a list, set or dict (of any dict type: ``OrderedDict``, ``defaultdict``, a
    subclass) held at one moment: a dict's keys in order, and the objects held."""

    kind: type
    keys: list | None  # None for a list or set
    items: list

    @classmethod
    def of(cls, value: Any) -> _Shallow | None:
        if isinstance(value, dict):
            return cls(type(value), list(value), list(value.values()))
        if isinstance(value, (list, set)):
            return cls(type(value), None, list(value))
        return None

    def same(self, now: _Shallow) -> bool:
        return (self.kind is now.kind and self.keys == now.keys and len(self.items) == len(now.items)
                and all(map(is_, self.items, now.items)))


def _defaults_inserted(value: Any, before: _Shallow, now: _Shallow) -> bool:
    """Whether ``value`` is a ``defaultdict`` that only gained keys filled by its default (a
    read of a missing key, ``counts[k]`` of a ``defaultdict(float)``). Eagerly the first call
    that reads such a key inserts it and later calls change nothing: the capturing call's
    insertion is that first one, and a replay, like eager, inserts nothing more."""
    if not isinstance(value, defaultdict) or value.default_factory is None or before.keys is None:
        return False
    n = len(before.keys)
    if len(now.keys) == n or now.keys[:n] != before.keys or not all(map(is_, now.items[:n], before.items)):
        return False
    try:
        default = value.default_factory()
    except Exception:  # noqa: BLE001 - a factory that needs more than a call: not a default
        return False
    # (a scalar default only: a new list or tensor could be filled or written afterwards)
    return isinstance(default, _SCALARS) and all(same_constant(v, default) for v in now.items[n:])


class Change(NamedTuple):
    """One change of Python state: where (``place[key]``: a dict and its key, or a closure
    cell), in words, and how to put it back."""

    place: Any  # the dict, or the closure cell
    key: Any
    text: str
    restore: Callable[[], None]


class _Before(NamedTuple):
    container: Any  # a dict, or a _Cell
    key: Any
    label: str
    value: Any
    shallow: Any  # the entries of a list, dict or set (a _Shallow), else None


def _python_places(functions: list[tuple[Callable, str]]) -> list[tuple[Any, Any, str]]:
    places: list[tuple[Any, Any, str]] = []
    for fn, name in functions:
        for var, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            places.append((_Cell(cell), None, f"closure variable {var!r} of {name}"))
        globs = fn.__globals__
        for var in sorted(_global_names(fn.__code__)):
            if not isinstance(globs.get(var), (types.ModuleType, type)):
                places.append((globs, var, f"global {var!r} of {name}"))
    return places


class PythonEffects:
    """Python state the function changes: closure variables and the globals it writes or reads.

    A replay runs no Python, so ``nonlocal step; step += 1`` or ``losses.append(...)`` in
    the function would happen once, at capture, instead of at every call. Snapshot
    before the capture, :meth:`changes` after it. ``places``: those of another snapshot
    (:meth:`again`), not found again. A dict of any type (``OrderedDict``, ``defaultdict``, a
    subclass) counts as changed when its keys or the objects it holds are not those it held;
    a ``defaultdict`` that only gained keys its scalar default filled did what eager's first
    call reading them does, and no later call does more.
    """

    def __init__(self, functions: list[tuple[Callable, str]] = (), places: list | None = None):
        self.places = places if places is not None else _python_places(list(functions))
        self.before = [_Before(c, k, label, value, _Shallow.of(value))
                       for c, k, label in self.places for value in (_read(c, k),)]
        # the containers inside those (``state["metrics"]``): changed in place, the outer one is not
        self.before += [_Before(parent, key, label, child, _Shallow.of(child))
                        for b in list(self.before) if b.shallow is not None
                        for parent, key, child, where in containers_in(b.value, "")
                        for label in (f"{b.label}, entry {where}",)]

    def again(self) -> PythonEffects:
        """A new snapshot of the same places."""
        return PythonEffects(places=self.places)

    def changes(self) -> list[str]:
        return [change.text for change in self.changed()]

    def changed(self) -> list[Change]:
        out = []
        for b in self.before:
            now = _read(b.container, b.key)
            place = b.container.cell if isinstance(b.container, _Cell) else b.container
            if now is not b.value and not (isinstance(now, _SCALARS) and same_constant(now, b.value)):
                out.append(Change(place, b.key, f"{b.label} was rebound ({_show(b.value)} → {_show(now)})",
                                  functools.partial(_put, b.container, b.key, b.value)))
            elif b.shallow is not None:
                after = _Shallow.of(now)
                if not _same_shallow(b.shallow, after) and not _defaults_inserted(now, b.shallow, after):
                    out.append(Change(place, b.key, f"{b.label} ({type(b.value).__name__}) was modified in place",
                                      functools.partial(refill, now, b.shallow)))
        return out

    def undo(self) -> None:
        """Put back what :meth:`changed` finds (the latest change first): a call that failed is
        run again, or refused, as if not made."""
        for change in reversed(self.changed()):
            change.restore()

    def excuse(self, places: set[tuple[int, Any]]) -> None:
        """Take the state at ``places`` (``(id(dict or cell), key)``) as it is now: what a hook
        marked with ``allow_hook`` changed there is not the function's change."""
        for i, b in enumerate(self.before):
            place = b.container.cell if isinstance(b.container, _Cell) else b.container
            if (id(place), b.key) in places:
                now = _read(b.container, b.key)
                self.before[i] = b._replace(value=now, shallow=_Shallow.of(now))


def _read(container: Any, key: Any) -> Any:
    try:
        return getitem(container, key)
    except (KeyError, ValueError):
        return _EMPTY


def _put(container: Any, key: Any, value: Any) -> None:
    if value is _EMPTY and isinstance(container, dict):
        container.pop(key, None)
    else:
        container[key] = value


def refill(obj: Any, shallow: _Shallow) -> None:
    """Put the entries a :class:`_Shallow` snapshot saw back into ``obj`` (a list, dict or set)."""
    if isinstance(obj, list):
        obj[:] = shallow.items
    elif isinstance(obj, dict):
        obj.clear()
        obj.update(zip(shallow.keys, shallow.items))
    else:
        obj.clear()
        obj.update(shallow.items)


def _same_shallow(a: _Shallow, b: _Shallow | None) -> bool:
    return b is not None and a.same(b)
    return True




def _show(value: Any) -> str:
    if value is _EMPTY:
        return "unset"
    if isinstance(value, _SCALARS):
        return repr(value)
    return f"a {type(value).__name__}"
