"""Watched places that are not one container entry, and the Python values watched by value.

The staleness check (:class:`~graphmodule._stale.Watch`) reads each watched place as
``container[key]`` and compares what it finds with what the capture found, by identity first.
The places here answer ``place[None]`` with ``place`` itself while what they stand for is as at
capture, and with a :class:`Shown` (text for the message) once it is not:

- :class:`Contents`: a list or dict the code reads, whole (its keys in order and its entries);
- :class:`Structure`: what an optimizer's step reads besides values;
- :class:`ArrayContent`: a numpy array's bytes (written in place, it is the same object);
- :class:`Attribute`: an attribute found on an object's class (``self.cut`` of ``class M: cut = 1.5``),
  read as Python reads it, so that one set on the object since is seen too.

Python values are watched by value (:func:`is_value`, :func:`same_value`): scalars, and the
immutable values a graph bakes in as constants: tuples of values, Enum members, dtypes, devices,
numpy scalars.
"""

from __future__ import annotations

import enum
import reprlib
import sys
from itertools import repeat
from operator import attrgetter, getitem
from typing import Any

import torch

from ._spec import same_constant

__all__ = ["SCALARS", "ArrayContent", "Attribute", "Contents", "Shown", "Structure", "is_array", "is_value",
           "same_value"]

SCALARS = (int, float, bool, str, complex, type(None))
_IMMUTABLE = (*SCALARS, torch.dtype, torch.device, torch.layout, torch.memory_format, enum.Enum, range, slice, bytes)
MAX_ARRAY_BYTES = 1 << 16  # numpy arrays compared by content at every call, up to this size


def _numpy() -> Any:
    return sys.modules.get("numpy")  # (no array exists where numpy was never imported)


def is_value(value: Any, depth: int = 3) -> bool:
    """Whether ``value`` is a Python value a graph bakes in, watched by value: a scalar, an
    immutable value (dtype, device, Enum member, numpy scalar), or a tuple or frozenset of them."""
    if isinstance(value, _IMMUTABLE):
        return True
    np = _numpy()
    if np is not None and isinstance(value, np.generic):
        return True
    if isinstance(value, (tuple, frozenset)) and depth > 0:
        return all(is_value(v, depth - 1) for v in value)
    return False


def is_array(value: Any) -> bool:
    np = _numpy()
    return np is not None and isinstance(value, np.ndarray)


def same_value(a: Any, b: Any) -> bool:
    """Whether value ``a`` is captured value ``b`` as a graph reads it (exactly: ``-0.0`` is not
    ``0.0``, a numpy ``float32`` not a ``float64``)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    np = _numpy()
    if np is not None and isinstance(a, np.generic):
        return a.tobytes() == b.tobytes()
    if isinstance(a, tuple):
        return len(a) == len(b) and all(map(same_value, a, b))
    return same_constant(a, b)


class Shown:
    """A watched place's content now, as text for the message."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


class Contents:
    """A list or dict the code reads (``scale[0]``, ``cfg["tau"]``, ``for t in self.extra``),
    watched whole: ``self[None]`` is ``self`` while the container holds the captured keys, in
    order, and entries equal to the captured ones (C-level comparisons, where an entry still the
    captured object costs no ``==``), else a :class:`Shown`. A graph bakes in the values it read;
    a container that grew may be read otherwise (``lst[-1]``, a loop). Entries that are not
    scalars are watched besides, as elsewhere (tensors by address)."""

    __slots__ = ("obj", "keys", "values")

    def __init__(self, obj: list | dict):
        self.obj = obj
        self.keys = list(obj) if isinstance(obj, dict) else None
        self.values = list(obj.values()) if isinstance(obj, dict) else list(obj)

    def __getitem__(self, _: Any) -> Any:
        obj = self.obj
        try:
            if self.keys is None:
                if obj == self.values:
                    return self
            elif list(obj) == self.keys and list(obj.values()) == self.values:
                return self
        except Exception:  # noqa: BLE001 - an entry whose == is not a truth value (a new tensor)
            pass
        keys = list(obj) if isinstance(obj, dict) else None
        values = list(obj.values()) if isinstance(obj, dict) else list(obj)
        if (keys == self.keys and len(values) == len(self.values)
                and all(same_value(a, b) for a, b in zip(values, self.values)
                        if isinstance(a, SCALARS) or isinstance(b, SCALARS))):
            self.values = values  # (other entries are watched at their own places: kept, for the fast check)
            return self
        return Shown(_show(keys, values))

    def __repr__(self) -> str:
        return _show(self.keys, self.values)


def _show(keys: list | None, values: list) -> str:
    """``[2.0]`` for a list of scalars only, ``{key: value}`` for the scalars of anything else,
    ``3 entries`` where there are none."""
    indices = keys if keys is not None else range(len(values))
    pairs = [(k, v) for k, v in zip(indices, values) if isinstance(v, SCALARS)]
    if not pairs:
        return f"{len(values)} {'entry' if len(values) == 1 else 'entries'}"
    shown = reprlib.Repr()
    shown.maxlist = shown.maxdict = 8
    whole = keys is None and len(pairs) == len(values)
    text = shown.repr([v for _, v in pairs] if whole else dict(pairs))
    return f"{text} ({len(pairs)} scalars)" if len(pairs) > 8 else text


_requires_grad = attrgetter("requires_grad")


class Structure:
    """What an optimizer's step reads besides values, watched as one place: the number of its
    param groups and of each group's parameters, which parameters have state, and which
    require grad (a frozen one gets no gradient eagerly, and its step skips it).
    ``self[None]`` is ``self`` while all is as at capture, else a :class:`Shown`."""

    __slots__ = ("opt", "params", "counts", "state", "grads")

    def __init__(self, opt: torch.optim.Optimizer):
        self.opt = opt
        self.params = [p for group in opt.param_groups for p in group["params"]]
        self.counts = [len(group["params"]) for group in opt.param_groups]
        self.state = len(opt.state)
        self.grads = list(map(_requires_grad, self.params))

    def __getitem__(self, _: Any) -> Any:
        opt = self.opt
        groups = opt.param_groups
        if (len(opt.state) == self.state and len(groups) == len(self.counts)  # (C-level passes)
                and list(map(len, map(getitem, groups, repeat("params")))) == self.counts
                and list(map(_requires_grad, self.params)) == self.grads):
            return self
        return Shown(_show_structure(opt))

    def __repr__(self) -> str:
        return _show_structure(self.opt, self.counts, self.state, self.params, self.grads)


def _show_structure(opt: Any, counts: list | None = None, state: int | None = None, params: list | None = None,
                    grads: list | None = None) -> str:
    if counts is None:
        counts = [len(group["params"]) for group in opt.param_groups]
        state = len(opt.state)
        params = [p for group in opt.param_groups for p in group["params"]]
        grads = list(map(_requires_grad, params))
    frozen = sum(not g for g in grads)
    return (f"{len(counts)} param groups of {counts} parameters, {state} with state, "
            f"{frozen} not requiring grad")


class ArrayContent:
    """A numpy array the code reads (a global ``np.array(2.0)``): a graph bakes in its values, and
    an array written in place (``a[...] = 3``, ``a.fill(3)``) is still the same object, so its
    bytes are compared at every call (arrays of up to :data:`MAX_ARRAY_BYTES`)."""

    __slots__ = ("array", "layout", "data", "text")

    def __init__(self, array: Any):
        self.array = array
        self.layout = (array.shape, array.dtype)
        self.data = array.tobytes()
        self.text = repr(array)

    def __getitem__(self, _: Any) -> Any:
        array = self.array
        if (array.shape, array.dtype) == self.layout and array.tobytes() == self.data:
            return self
        return Shown(repr(array))

    def __repr__(self) -> str:
        return self.text


class Attribute:
    """``obj.name`` where the capture found it on ``obj``'s class (a class attribute): read as
    Python reads it (``getattr``), so that the class's value changed, and one set on ``obj``
    itself since, are both seen."""

    __slots__ = ("obj", "name")

    def __init__(self, obj: Any, name: str):
        self.obj, self.name = obj, name

    def __getitem__(self, _: Any) -> Any:
        return getattr(self.obj, self.name)
