"""What a graph reads from outside its inputs, and the per-call check that it is unchanged.

A graph reads tensors by address and Python values as they were at capture. Found at
capture, by walking from the wrapped callable:

- modules: every parameter, buffer and tensor attribute (by address) and submodule
  (by identity), and public Python scalars (``self.scale``, dropout's ``p``) by value;
- optimizers: param groups' hyperparameters (a scheduler's float ``lr``) by value,
  tensor hyperparameters and state (``exp_avg``...) by address;
- functions: closure variables and the globals their code reads, by identity for
  objects and by value for Python scalars; and everything those lead to, as above;
- the lists and dicts reached from a function (``scale[0]``, ``cfg["tau"]``): their entries,
  and their Python scalars by value, with their length (one place per container).

The hooks of the modules found (see :mod:`._hooks`) are watched too: one added or removed
since the capture makes the graph stale.

Each replay checks these with a few C-level passes (``map`` over getters); the slow
walk that names what changed runs only when that check fails. Where Python has dict
watchers (CPython 3.12+, see :mod:`._dictwatch`), places in dicts (nearly all of them:
``_parameters``, ``__dict__``, optimizer state) are read only after one of those dicts
changed; lists, closure cells and globals are read at every check, and so are the
addresses of the tensors (``p.data = ...`` changes no dict).

Not seen: Python values read from objects the walk does not reach (deeper than
:data:`MAX_DEPTH`, or behind properties), Python scalars held by plain objects (as
attributes, or in their lists and dicts: a counter or a log on an object the function
merely mentions would make every call stale), changes that compare equal (``0.0`` to
``-0.0`` inside a list or dict), and tensors rebound inside containers the walk does not
enter. Python state the function *changes* is refused at capture, see
:class:`PythonEffects`.
"""

from __future__ import annotations

import dis
import functools
import reprlib
import types
from operator import attrgetter, getitem, is_
from typing import Any, Callable

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from . import _dictwatch
from ._hooks import HookWatch, describe_hook
from ._spec import same_constant
from ._surface import WrapperSurface

__all__ = ["Watch", "PythonEffects", "MAX_DEPTH"]

MAX_DEPTH = 4
_SCALARS = (int, float, bool, str, complex, type(None))
_data_ptr = torch.Tensor.data_ptr
_WORTH = (torch.Tensor, nn.Module, torch.optim.Optimizer, TensorDictBase, types.FunctionType,
          types.MethodType, functools.partial, list, tuple, dict)


# Python attributes that a torch module's forward never reads (exact types only: a subclass
# may read them): watching them would cost every call and protect nothing.
_UNREAD = {nn.Linear: frozenset({"in_features", "out_features"})}

_INTERNAL_PACKAGES = frozenset({"torch", "tensordict", "graphmodule", "functools", "typing", "contextlib"})


def _internal(fn: Any) -> bool:
    """Functions of torch, tensordict and the standard library: not the user's Python state."""
    module = getattr(fn, "__module__", None) or ""
    return module.split(".", 1)[0] in _INTERNAL_PACKAGES


class _Scalars:
    """The Python scalars of a list or dict a function names (``scale[0]``, ``cfg["tau"]``),
    watched as one place: ``self[None]`` is ``self`` while the container holds the captured
    keys, in order, and entries equal to the captured ones (C-level comparisons, where an
    entry still the captured object costs no ``==``), else a :class:`_Now` showing its
    scalars. A graph bakes in the values it read; a container that grew may be read
    otherwise (``lst[-1]``, a loop over a dict). Entries that are not scalars are watched
    by identity besides, as elsewhere."""

    __slots__ = ("obj", "keys", "values", "scalar_keys", "scalar_values")

    def __init__(self, obj: list | dict):
        self.obj = obj
        self.keys = list(obj) if isinstance(obj, dict) else None
        self.values = list(obj.values()) if isinstance(obj, dict) else list(obj)
        keys = self.keys if self.keys is not None else range(len(obj))
        pairs = [(k, v) for k, v in zip(keys, self.values) if isinstance(v, _SCALARS)]
        self.scalar_keys, self.scalar_values = [k for k, _ in pairs], [v for _, v in pairs]

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
        return _Now(self)

    def __repr__(self) -> str:
        return _show_scalars(self.keys is None and len(self.scalar_keys) == len(self.values), self.scalar_keys,
                             self.scalar_values)


class _Now:
    """What a watched container holds now, for the message (see :class:`_Scalars`)."""

    __slots__ = ("text",)

    def __init__(self, place: _Scalars):
        obj = place.obj
        keys = list(obj) if isinstance(obj, dict) else list(range(len(obj)))
        pairs = [(k, obj[k]) for k in keys if isinstance(obj[k], _SCALARS)]
        self.text = _show_scalars(isinstance(obj, list) and len(pairs) == len(obj), [k for k, _ in pairs],
                                  [v for _, v in pairs])

    def __repr__(self) -> str:
        return self.text


def _show_scalars(whole: bool, keys: list, values: list) -> str:
    """``[2.0]`` for a list of scalars only (``whole``), ``{key: value}`` for the scalars of
    anything else."""
    shown = reprlib.Repr()
    shown.maxlist = shown.maxdict = 8
    text = shown.repr(list(values) if whole else dict(zip(keys, values)))
    return f"{text} ({len(keys)} scalars)" if len(keys) > 8 else text


class _Cell:
    """A closure cell as a container: ``cell[None]`` is its content."""

    __slots__ = ("cell",)

    def __init__(self, cell: Any):
        self.cell = cell

    def __getitem__(self, _: Any) -> Any:
        return self.cell.cell_contents


def _global_names(code: types.CodeType) -> set[str]:
    names = set()
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL"):
            names.add(ins.argval)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


class Watch:
    """Everything the graph reads from outside its inputs, found from ``fn``.

    Attributes:
        externals: ``id(t) -> t`` for every tensor found (parameters, state...).
    """

    def __init__(self, fn: Any, backward_hooks: bool = False):
        self.externals: dict[int, torch.Tensor] = {}
        self._t: tuple[list, list, list, list] = ([], [], [], [])  # containers, keys, ptrs, labels
        self._o: tuple[list, list, list, list] = ([], [], [], [])  # containers, keys, objects, labels
        self._v: tuple[list, list, list, list] = ([], [], [], [])  # containers, keys, values, labels
        self._tensors: list[torch.Tensor] = []  # the tensor at each watched place, at capture
        self._seen: set[int] = set()
        self._instance_dicts: set[int] = set()  # objects' __dict__s (watchable where probed so)
        self._globals: set[int] = set()  # modules' globals: scripts rebind them all the time
        self._flag: _dictwatch.Flag | None = None  # dict places verified since the flag went down
        self.functions: list[tuple[Callable, str]] = []
        self.modules: list[tuple[nn.Module, str]] = []
        self._visit(fn, "module" if isinstance(fn, nn.Module) else "the wrapped callable", 0)
        self.known = frozenset(self._seen)  # objects that exist outside the call
        # the modules' hooks (backward ones where a backward inside the graph runs them): the
        # hooks present (pure ones, see _hooks) by identity, and one place that moves when any
        # hook is registered
        self.backward_hooks = backward_hooks
        self.hooks = HookWatch(self.modules, backward_hooks)
        for d, captured in zip(self.hooks.dicts, self.hooks.captured):
            for key, hook in captured.items():
                for lst, item in zip(self._o, (d.hooks, key, hook, f"{d.where}: {describe_hook(d, hook)}")):
                    lst.append(item)
        self._h = ([self.hooks.place[0]], [self.hooks.place[1]], [getitem(*self.hooks.place)], ["hooks"])
        self.freeze()

    # -- discovery (at capture) ------------------------------------------------------------
    def _bind(self, container: Any, key: Any, value: Any, label: str, depth: int, scalars: bool = True) -> None:
        """Watch ``container[key]`` (now ``value``), then what ``value`` leads to (``scalars``:
        with the Python scalars of the lists and dicts found there)."""
        if isinstance(value, torch.Tensor):
            self.externals[id(value)] = value
            for lst, item in zip(self._t, (container, key, _data_ptr(value), label)):
                lst.append(item)
            self._tensors.append(value)
        elif isinstance(value, _SCALARS):
            for lst, item in zip(self._v, (container, key, value, label)):
                lst.append(item)
        else:
            for lst, item in zip(self._o, (container, key, value, label)):
                lst.append(item)
            self._visit(value, label, depth + 1, scalars)

    def _visit(self, obj: Any, label: str, depth: int, scalars: bool = True) -> None:
        if depth > MAX_DEPTH or id(obj) in self._seen or isinstance(obj, (type, types.ModuleType)):
            return
        self._seen.add(id(obj))
        if isinstance(obj, nn.Module):
            self._module(obj, label, depth)
        elif isinstance(obj, torch.optim.Optimizer):
            self._optimizer(obj, label, depth)
        elif isinstance(obj, TensorDictBase):
            self._tensordict(obj, label, depth)
        elif isinstance(obj, functools.partial):
            self._visit(obj.func, label, depth)
            for i, arg in enumerate(obj.args):
                self._bind(obj.args, i, arg, f"{label} argument {i}", depth)
            for name, arg in obj.keywords.items():
                self._bind(obj.keywords, name, arg, f"{label} argument {name!r}", depth)
        elif isinstance(obj, types.MethodType):
            self._visit(obj.__self__, label, depth)
            self._visit(obj.__func__, label, depth)
        elif isinstance(obj, types.FunctionType):
            self._function(obj, depth)
        elif isinstance(obj, (list, tuple, dict)):
            items = list(obj.items()) if isinstance(obj, dict) else list(enumerate(obj))
            for key, item in items:
                if not isinstance(item, _SCALARS):
                    self._bind(obj, key, item, f"{label}[{key!r}]", depth, scalars)
            if scalars and not isinstance(obj, tuple) and any(isinstance(item, _SCALARS) for _, item in items):
                place = _Scalars(obj)
                for lst, item in zip(self._v, (place, None, place, label)):
                    lst.append(item)
        elif isinstance(obj, WrapperSurface):
            # another wrapper, called inside this graph's capture, ran its function inline: the
            # graph reads what that function reads, not the wrapper's own bookkeeping (its graphs,
            # counters, index), which its calls elsewhere change
            self._visit(obj.module, f"{label}.module", depth)
        elif hasattr(obj, "__dict__") and not callable(getattr(obj, "__get__", None)):
            inner = getattr(obj, "_torchdynamo_orig_callable", None) or getattr(obj, "__wrapped__", None)
            if inner is not None:
                self._visit(inner, label, depth)
            # Python scalars of arbitrary objects are not watched: counters on an object the
            # function merely mentions would make every call stale.
            attrs = vars(obj)
            self._instance_dicts.add(id(attrs))
            for name, value in list(attrs.items()):
                if not name.startswith("__") and isinstance(value, _WORTH):
                    self._bind(attrs, name, value, f"{label}.{name}", depth, scalars=False)

    def _function(self, fn: types.FunctionType, depth: int) -> None:
        wrapped = getattr(fn, "__wrapped__", None) or getattr(fn, "_torchdynamo_orig_callable", None)
        if _internal(fn):  # torch's own wrappers (torch.compile's): only what they wrap is user code
            if wrapped is not None:
                self._visit(wrapped, getattr(wrapped, "__qualname__", "the wrapped function"), depth)
            return
        name = getattr(fn, "__qualname__", fn.__name__)
        self.functions.append((fn, name))
        for var, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell (a name assigned later)
                continue
            self._bind(_Cell(cell), None, value, f"closure variable {var!r} of {name}", depth)
        globs = fn.__globals__
        self._globals.add(id(globs))
        for var in sorted(_global_names(fn.__code__)):
            if var in globs and not isinstance(globs[var], (types.ModuleType, type)):
                self._bind(globs, var, globs[var], f"global {var!r} read by {name}", depth)
        for i, value in enumerate(fn.__defaults__ or ()):
            if not isinstance(value, _SCALARS):
                self._visit(value, f"default argument {i} of {name}", depth + 1)
        if wrapped is not None:
            self._visit(wrapped, name, depth)

    def _module(self, module: nn.Module, label: str, depth: int) -> None:
        for path, m in module.named_modules(remove_duplicate=True):
            where = f"{label}.{path}" if path else label
            if id(m) in self._seen and m is not module:
                continue
            self.modules.append((m, where))
            for kind in ("_parameters", "_buffers"):
                for name, t in m.__dict__[kind].items():
                    if t is not None:
                        self._bind(m.__dict__[kind], name, t, f"{where}.{name}", depth)
            for name, child in m.__dict__["_modules"].items():
                for lst, item in zip(self._o, (m.__dict__["_modules"], name, child, f"{where}.{name}")):
                    lst.append(item)
            attrs = m.__dict__
            self._instance_dicts.add(id(attrs))
            unread = _UNREAD.get(type(m), ())
            for name, value in list(attrs.items()):
                if name.startswith("_") or name == "training" or name in unread:
                    continue
                if isinstance(value, (torch.Tensor, *_SCALARS)):
                    self._bind(attrs, name, value, f"{where}.{name}", depth)
                elif callable(value) or isinstance(value, (torch.optim.Optimizer, TensorDictBase)):
                    self._bind(attrs, name, value, f"{where}.{name}", depth)
            self._seen.add(id(m))

    def _optimizer(self, opt: torch.optim.Optimizer, label: str, depth: int) -> None:
        label = f"{label} ({type(opt).__name__})"
        attrs = opt.__dict__
        self._instance_dicts.add(id(attrs))
        for lst, item in zip(self._o, (attrs, "param_groups", opt.param_groups, f"{label}.param_groups")):
            lst.append(item)
        for lst, item in zip(self._o, (attrs, "state", opt.state, f"{label}.state")):
            lst.append(item)
        for g, group in enumerate(opt.param_groups):
            for lst, item in zip(self._o, (opt.param_groups, g, group, f"{label}.param_groups[{g}]")):
                lst.append(item)
            for key, value in group.items():
                where = f"{label}.param_groups[{g}][{key!r}]"
                if key == "params":
                    for i, p in enumerate(value):
                        self._bind(value, i, p, f"{where}[{i}]", depth)
                        state = opt.state.get(p)
                        if state is not None:
                            # (opt.state is watched by identity: load_state_dict replaces it)
                            for skey, svalue in state.items():
                                if isinstance(svalue, torch.Tensor):
                                    self._bind(state, skey, svalue, f"{label}.state[param {i}][{skey!r}]", depth)
                elif isinstance(value, (torch.Tensor, *_SCALARS)):
                    self._bind(group, key, value, where, depth)
                elif isinstance(value, tuple) and all(isinstance(v, _SCALARS) for v in value):
                    for lst, item in zip(self._v, (group, key, value, where)):
                        lst.append(item)

    def _tensordict(self, td: TensorDictBase, label: str, depth: int) -> None:
        if type(td) is not TensorDict:
            return
        for name, value in td._tensordict.items():
            if isinstance(value, (torch.Tensor, TensorDictBase)):
                self._bind(td._tensordict, name, value, f"{label}[{name!r}]", depth)

    def tensors(self) -> list[tuple[str, torch.Tensor]]:
        """``(place, tensor)`` of every tensor found (a parameter also under its optimizer)."""
        return list(zip(self._t[3], self._tensors))

    # -- the per-call check ----------------------------------------------------------------
    def check(self) -> bool:
        """Whether everything found at capture is still what the graph reads. Cheap: one
        C-level pass reads the watched places and compares them by identity with what was
        there at capture (no list built): all of them after a dict that holds some changed
        (a dict watcher's flag), else only those no watcher covers; one more compares the
        addresses of the distinct tensors (``p.data = ...`` keeps the object, not its memory).
        Only a place holding another object (an equal float rebound, a new tensor over the
        same memory) takes the slower comparison."""
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
        return _same_addresses(self._tobjs, self._tptrs, self._tindex)

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
                if not same_constant(now[i], objects[i]):
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
        return out + self.hooks.changes()


_contents = attrgetter("cell_contents")


def _facts(t: torch.Tensor) -> tuple:
    """How a graph reads a tensor: where, and with which layout."""
    return (_data_ptr(t), t.shape, t.stride(), t.dtype)


def _data_ptrs_equal(tensors: list, ptrs: list, index: list) -> bool:
    return list(map(_data_ptr, tensors)) == ptrs


# torch's C++ loop over data pointers (what cudagraph trees check static inputs with) on
# CUDA builds; the Python pass, some 150 ns a tensor, elsewhere
_same_addresses = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None) or _data_ptrs_equal


def _tensor_change(now: Any, ptr: int, facts: tuple) -> str | None:
    if not isinstance(now, torch.Tensor) or _data_ptr(now) != ptr:
        return "another tensor (the graph reads the old one's memory)"
    if _facts(now) != facts:
        return (f"another view of the same memory (shape {list(now.shape)}, stride {now.stride()}; the graph "
                f"reads it as shape {list(facts[1])}, stride {facts[2]})")
    return None


def _object_change(now: Any, obj: Any) -> str | None:
    return None if now is obj else f"another {type(now).__name__} object"


def _value_change(now: Any, value: Any) -> str | None:
    return None if same_constant(now, value) else f"{value!r} at capture, {now!r} now (the graph uses {value!r})"


def _shallow(value: Any) -> Any:
    if isinstance(value, (list, dict, set)):
        return (type(value), list(value.items()) if isinstance(value, dict) else list(value))
    return None


class PythonEffects:
    """Python state the function changes: closure variables and the globals it writes or reads.

    A replay runs no Python, so ``nonlocal step; step += 1`` or ``losses.append(...)`` in
    the function would happen once, at capture, instead of at every call. Snapshot
    before the capture, :meth:`changes` after it.
    """

    def __init__(self, functions: list[tuple[Callable, str]]):
        self.before: list[tuple[Any, Any, str, Any, Any]] = []
        for fn, name in functions:
            for var, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
                value = cell.cell_contents if _filled(cell) else _EMPTY
                self.before.append((_Cell(cell), None, f"closure variable {var!r} of {name}", value, _shallow(value)))
            globs = fn.__globals__
            for var in _global_names(fn.__code__):
                value = globs.get(var, _EMPTY)
                if not isinstance(value, (types.ModuleType, type)):
                    self.before.append((globs, var, f"global {var!r} of {name}", value, _shallow(value)))

    def changes(self) -> list[str]:
        out = []
        for container, key, label, value, shallow in self.before:
            try:
                now = getitem(container, key)
            except (KeyError, ValueError):
                now = _EMPTY
            if now is not value and not (isinstance(now, _SCALARS) and same_constant(now, value)):
                out.append(f"{label} was rebound ({_show(value)} → {_show(now)})")
            elif shallow is not None and _shallow(now) is not None and not _same_shallow(shallow, _shallow(now)):
                out.append(f"{label} ({type(value).__name__}) was modified in place")
        return out


def _same_shallow(a: Any, b: Any) -> bool:
    (ta, ia), (tb, ib) = a, b
    if ta is not tb or len(ia) != len(ib):
        return False
    for x, y in zip(ia, ib):
        if isinstance(x, tuple) and isinstance(y, tuple) and len(x) == 2 and ta is dict:
            if x[0] != y[0] or x[1] is not y[1]:
                return False
        elif x is not y:
            return False
    return True


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


_EMPTY = object()


def _show(value: Any) -> str:
    if value is _EMPTY:
        return "unset"
    if isinstance(value, _SCALARS):
        return repr(value)
    return f"a {type(value).__name__}"
