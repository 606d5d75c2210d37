"""The per-call check that what a graph reads from outside its inputs is unchanged.

What a graph reads is found at capture (:mod:`._discover`); the hooks a call runs (of the
modules and optimizers found and, in a train step, of the parameters: see :mod:`._hookdicts`)
are watched too: one added or removed since the capture makes the graph stale. Each replay checks these with a few C-level passes (``map`` over getters); the slow
walk that names what changed runs only when that check fails. Where Python has dict
watchers (CPython 3.12+, see :mod:`._dictwatch`), places in dicts (nearly all of them:
``_parameters``, ``__dict__``, optimizer state) are read only after one of those dicts
changed; lists, closure cells and globals are read at every check, and so are the
addresses of the tensors (``p.data = ...`` changes no dict).

Not seen, besides what discovery does not find: changes that compare equal (``0.0`` to
``-0.0`` inside a list or dict).
"""

from __future__ import annotations

from operator import attrgetter, getitem, is_
from typing import Any, NamedTuple

import torch

from . import _dictwatch
from ._discover import MAX_DEPTH, Discovery, _Cell
from ._pyeffects import PythonEffects
from ._hookdicts import HookWatch, describe_hook
from ._places import same_value

__all__ = ["Watch", "PythonEffects", "MAX_DEPTH"]

_data_ptr = torch.Tensor.data_ptr


class Watch(Discovery):
    """Everything the graph reads from outside its inputs, found from ``fn`` (see
    :class:`~graphmodule._discover.Discovery`), and the per-call check that it is unchanged.
    ``backward_hooks``: watch the modules' backward hooks too (a graph that runs a backward
    itself). ``rebound``: what the function rebinds outside the call (``_rebind``): those
    places are not watched, and the ``.grad`` the graph accumulates into or reads must be
    bound at every call as at capture."""

    def __init__(self, fn: Any, backward_hooks: bool = False, rebound: Any = None):
        super().__init__(fn, rebound.places if rebound is not None else frozenset(), backward_hooks=backward_hooks)
        self._fn, self.rebound = fn, rebound
        # what each .grad must be: over the memory the graph accumulates into or reads, or None
        # (the step's backward binds a new one, or its optimizer skips it): _gradwatch.Required
        self._grads = rebound.required if rebound is not None and rebound.required else None
        self._flag: _dictwatch.Flag | None = None  # dict places verified since the flag went down
        # the hooks a call runs (modules', optimizers'; backward ones and the parameters' where a
        # backward inside the graph runs them): the hooks present by identity (what they read is
        # found by the walk), and one place that moves when any hook is registered
        self.backward_hooks = backward_hooks
        self.hooks = HookWatch(self.hook_dicts())
        for d, captured in zip(self.hooks.dicts, self.hooks.captured):
            for key, hook in captured.items():
                for lst, item in zip(self._o, (d.hooks, key, hook, f"{d.where}: {describe_hook(d, hook)}")):
                    lst.append(item)
        self._h = ([self.hooks.place[0]], [self.hooks.place[1]], [getitem(*self.hooks.place)], ["hooks"])
        self.freeze()
        # every place read at every call (no dict watcher covers one, no closure cell, no .grad
        # to find): check() reads them in its own frame first
        self._flat = not self._watched_dicts and not self._cells and self._grads is None

    # -- the per-call check ----------------------------------------------------------------
    def check(self) -> bool:
        """Whether everything found at capture is still what the graph reads. Cheap: one
        C-level pass reads the watched places and compares them by identity with what was
        there at capture (no list built): all of them after a dict that holds some changed
        (a dict watcher's flag), else only those no watcher covers; one more compares the
        addresses of the distinct tensors (``p.data = ...`` keeps the object, not its memory).
        Only a place holding another object (an equal float rebound, a new tensor over the
        same memory) takes the slower comparison."""
        if self._flat:  # one pass and the addresses here; any difference to the general check below
            try:
                if all(map(is_, map(getitem, self._containers, self._keys), self._place_objects)):
                    return _same_addresses(self._tobjs, self._tptrs, self._tindex)
            except (KeyError, IndexError, AttributeError, TypeError, ValueError):
                pass
        flag = self._flag
        # (every place in a dict that a watcher covers, none changed: nothing to read there)
        if (flag is None or flag.raised or not self._dicts_only) and not self._places_same():
            return False
        grads = self._grads
        if grads is not None:
            return _same_addresses(self._tobjs, self._tptrs, self._tindex) and grads.same()
        return _same_addresses(self._tobjs, self._tptrs, self._tindex)

    def other_grads(self) -> bool:
        """Whether the call is another graph's because a ``.grad`` the graph reads is ``None``
        where the capture found a tensor, or the reverse (everything else unchanged)."""
        grads = self._grads
        return (grads is not None and grads.other_state() and self._places_same()
                and _same_addresses(self._tobjs, self._tptrs, self._tindex))

    def grads_moved(self) -> bool:
        """Whether the call finds everything as at capture but a ``.grad`` the graph reads, over
        other memory (``_gradwatch.Required.moved``): captured again, not refused."""
        grads = self._grads
        return (grads is not None and grads.moved() and self._places_same()
                and _same_addresses(self._tobjs, self._tptrs, self._tindex))

    def _places_same(self) -> bool:
        """The first part of :meth:`check` (and of the cold path's questions): every watched place."""
        flag = self._flag
        try:
            if flag is not None and not flag.raised:  # no watched dict changed: the others only
                same = all(map(is_, map(getitem, self._u_containers, self._u_keys), self._u_objects))
            else:
                same = self._read_all()
            if same and self._cells:
                same = all(map(is_, map(_contents, self._cells), self._cell_objects))
            if not same and not self._adopt(self._now()):
                self._raise()
                return False
        except (KeyError, IndexError, AttributeError, TypeError, ValueError):
            self._raise()
            return False
        return True

    def _read_all(self) -> bool:
        """Every place, read by identity; the dict watchers registered first (at the first
        check) and the flag lowered before reading: a change from here on raises it again."""
        if self._flag is None and self._watched_dicts:
            flag = _dictwatch.Flag()
            if _dictwatch.watch(self._watched_dicts, flag):
                self._flag = flag
            else:
                self._watched_dicts = []
        if self._flag is not None:
            self._flag.raised = False
        return all(map(is_, map(getitem, self._containers, self._keys), self._place_objects))

    def _raise(self) -> None:
        if self._flag is not None:
            self._flag.raised = True

    def _now(self) -> list:
        """What every watched place holds now (places, then cells)."""
        return [*map(getitem, self._containers, self._keys), *map(_contents, self._cells)]

    def _adopt(self, now: list) -> bool:
        """Some places hold other objects: still what the graph reads if each is a tensor
        with the same memory and layout, or an equal Python value (exactly: -0.0 is not
        0.0). Then the new objects are kept, so that the next check is the fast one."""
        objects, kinds, facts = self._place_objects + self._cell_objects, self._kinds, self._facts
        changed = [i for i, (a, b) in enumerate(zip(now, objects)) if a is not b]
        for i in changed:
            kind = kinds[i]
            if kind is None:  # an object: identity is what the graph depends on
                return False
            if kind == "value":
                if not same_value(now[i], objects[i]):
                    return False
            elif kind == "hooks":  # a hook registered somewhere: on these modules?
                if not self.hooks.same():
                    return False
            elif not isinstance(now[i], torch.Tensor) or _facts(now[i]) != facts[kind]:
                return False
        for i in changed:
            objects[i] = now[i]
            if kinds[i] not in (None, "value", "hooks"):
                self._adopt_tensor(kinds[i], now[i])
        n = len(self._containers)
        self._place_objects, self._cell_objects = objects[:n], objects[n:]
        self._u_objects = self._place_objects[:len(self._u_containers)]
        return True

    def _adopt_tensor(self, index: int, tensor: torch.Tensor) -> None:
        """Watch the address of ``tensor``, now at the place of captured tensor ``index``. A
        slot that other places share keeps its tensor (they still hold it); this place gets
        a slot of its own."""
        slot = self._slot[index]
        if self._slot.count(slot) == 1:
            self._tobjs[slot] = tensor
        else:
            self._slot[index] = len(self._tobjs)
            self._tobjs.append(tensor)
            self._tptrs.append(_data_ptr(tensor))
            self._tindex.append(len(self._tindex))

    def freeze(self) -> None:
        """Lay the watched places out for :meth:`check` (after discovery): every place in
        one list (closure cells apart, read by attribute), with what it held at capture and
        its kind (the tensor's index, ``None`` for an object, ``"value"``); the distinct
        tensors once each for the address check (a parameter is also in its optimizer)."""
        tensors = [(c, k, obj, i) for i, (c, k, obj) in enumerate(zip(self._t[0], self._t[1], self._tensors))]
        objects = [(c, k, obj, None) for c, k, obj in zip(*self._o[:3])]
        values = [(c, k, value, "value") for c, k, value in zip(*self._v[:3])]
        values += [(c, k, value, "hooks") for c, k, value in zip(*self._h[:3])]
        places = [p for p in tensors + objects + values if not isinstance(p[0], _Cell)]
        cells = [p for p in tensors + objects + values if isinstance(p[0], _Cell)]
        # the places the check reads at every call first (lists, globals, ...); then those it
        # reads only after a watched dict changed, and tuples' (which never change)
        kind = [2 if isinstance(p[0], tuple) else 1 if self._watchable(p[0]) else 0 for p in places]
        unwatched = [p for p, k in zip(places, kind) if k == 0]
        watched = [p for p, k in zip(places, kind) if k == 1]
        places = unwatched + watched + [p for p, k in zip(places, kind) if k == 2]
        self._watched_dicts = [p[0] for p in watched]
        self._containers = [p[0] for p in places]
        self._keys = [p[1] for p in places]
        self._cells = [p[0].cell for p in cells]
        self._place_objects = [p[2] for p in places]
        self._cell_objects = [p[2] for p in cells]
        self._u_containers = [p[0] for p in unwatched]
        self._u_keys = [p[1] for p in unwatched]
        self._u_objects = self._place_objects[:len(unwatched)]
        self._dicts_only = not unwatched and not cells
        self._kinds = [p[3] for p in places + cells]
        slots: dict[int, int] = {}
        self._slot = [slots.setdefault(id(t), len(slots)) for t in self._tensors]
        self._tobjs = list({id(t): t for t in self._tensors}.values())
        self._tptrs = list(map(_data_ptr, self._tobjs))
        self._facts = list(map(_facts, self._tensors))
        self._tindex = list(range(len(self._tobjs)))

    def _watchable(self, container: Any) -> bool:
        return id(container) not in self._globals and _dictwatch.watchable(
            container, instance_dict=id(container) in self._instance_dicts)

    def changes(self) -> list[tuple[str, str]]:
        """What changed, for the message (the slow path)."""
        out = []
        facts = iter(self._facts)  # as at capture (a `.data =` since changed the object's own)
        for places, what_changed in ((self._t, _tensor_change), (self._o, _object_change), (self._v, _value_change)):
            for container, key, captured, label in zip(*places):
                extra = (next(facts),) if places is self._t else ()
                try:
                    now = getitem(container, key)
                except (KeyError, IndexError, ValueError):
                    out.append((label, "removed"))
                    continue
                what = what_changed(now, captured, *extra)
                if what:
                    out.append((label, what))
        if self._grads is not None:
            out += self._grads.changes()
        return out + self.hooks.changes()


_contents = attrgetter("cell_contents")


class ReadAs(NamedTuple):
    """How a graph reads a tensor: where, and with which layout."""

    ptr: int
    shape: torch.Size
    stride: tuple
    dtype: torch.dtype


def _facts(t: torch.Tensor) -> ReadAs:
    return ReadAs(_data_ptr(t), t.shape, t.stride(), t.dtype)


def _data_ptrs_equal(tensors: list, ptrs: list, index: list) -> bool:
    return list(map(_data_ptr, tensors)) == ptrs


# torch's C++ loop over data pointers (what cudagraph trees check static inputs with) on
# CUDA builds; the Python pass, some 150 ns a tensor, elsewhere
_same_addresses = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None) or _data_ptrs_equal


def _tensor_change(now: Any, ptr: int, facts: ReadAs) -> str | None:
    if not isinstance(now, torch.Tensor) or _data_ptr(now) != ptr:
        return "another tensor (the graph reads the old one's memory)"
    if _facts(now) != facts:
        return (f"another view of the same memory (shape {list(now.shape)}, stride {now.stride()}; the graph "
                f"reads it as shape {list(facts.shape)}, stride {facts.stride})")
    return None


def _object_change(now: Any, obj: Any) -> str | None:
    return None if now is obj else f"another {type(now).__name__} object"


def _value_change(now: Any, value: Any) -> str | None:
    return None if same_value(now, value) else f"{value!r} at capture, {now!r} now (the graph uses {value!r})"
