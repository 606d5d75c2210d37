"""What a graph reads from outside its inputs, found at capture by walking from the wrapped
callable (what the function changes of that Python state: ``_pyeffects``).

A graph reads tensors by address and Python values as they were at capture. The walk finds:

- modules: every parameter, buffer and tensor attribute (by address) and submodule
  (by identity), and public Python scalars (``self.scale``, dropout's ``p``) by value;
- optimizers: param groups' hyperparameters (a scheduler's float ``lr``) by value,
  tensor hyperparameters and state (``exp_avg``...) by address;
- functions: closure variables and the globals their code reads, by identity for
  objects and by value for Python scalars; and everything those lead to, as above;
- the lists and dicts reached from a function (``scale[0]``, ``cfg["tau"]``): their entries,
  and their Python scalars by value, with their length (one place per container);
- another wrapper reached so: what its function reads (it runs inline in this capture);
- the Python hooks of the modules found (see :mod:`._hooks`): as functions (their closures,
  globals and bound ``self``), and the attributes their code reads off the module they are
  given and off their ``self`` (``module._has_update_associated``), Python scalars by value.

Not found: Python values read from objects the walk does not reach (deeper than
:data:`MAX_DEPTH`, or behind properties), Python scalars held by plain objects (as
attributes, or in their lists and dicts: a counter or a log on an object the function
merely mentions would make every call stale), and tensors rebound inside containers the
walk does not enter. :class:`~graphmodule._stale.Watch` checks what was found at every
call; Python state the function *changes* is refused at capture (``_pyeffects``).
"""

from __future__ import annotations

import functools
import types
from typing import Any, Callable

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from ._hookdicts import HookDict, describe_hook, hook_dicts
from ._hooks import attributes_read, pure
from ._places import MAX_ARRAY_BYTES, SCALARS, ArrayContent, Contents, Structure, is_array, is_value
from ._reads import ReadsWalk, internal
from ._reads import global_names as _global_names  # (the name _pyeffects imports)
from ._surface import WrapperSurface

__all__ = ["Discovery", "MAX_DEPTH"]

MAX_DEPTH = 4
_SCALARS = SCALARS
_data_ptr = torch.Tensor.data_ptr
_WORTH = (torch.Tensor, nn.Module, torch.optim.Optimizer, TensorDictBase, types.FunctionType,
          types.MethodType, functools.partial, list, tuple, dict)


# Python attributes that a torch module's forward never reads (exact types only: a subclass
# may read them): watching them would cost every call and protect nothing.
_UNREAD = {nn.Linear: frozenset({"in_features", "out_features"})}

def containers_in(value: Any, label: str, depth: int = 3) -> list[tuple[Any, Any, Any, str]]:
    """``(container, key, child, place)`` of the lists, dicts and sets held inside ``value`` (a
    list or dict), ``depth`` levels down: ``self.logs["train"]``, changed in place where the
    outer one is not."""
    out: list[tuple[Any, Any, Any, str]] = []
    if depth == 0 or not isinstance(value, (list, dict)):
        return out
    for key, child in (value.items() if isinstance(value, dict) else enumerate(value)):
        if isinstance(child, (list, dict, set)):
            where = f"{label}[{key!r}]"
            out.append((value, key, child, where))
            out += containers_in(child, where, depth - 1)
    return out


class _Cell:
    """A closure cell as a container: ``cell[None]`` is its content."""

    __slots__ = ("cell",)

    def __init__(self, cell: Any):
        self.cell = cell

    def __getitem__(self, _: Any) -> Any:
        return self.cell.cell_contents

    def __setitem__(self, _: Any, value: Any) -> None:
        if value is _EMPTY:
            del self.cell.cell_contents
        else:
            self.cell.cell_contents = value


class Discovery(ReadsWalk):
    """Everything the graph reads from outside its inputs, found from ``fn``: the watched
    places, each as ``(container, key, what it held, label)`` in three lists by kind
    (tensors by address, objects by identity, Python values by value).

    Attributes:
        externals: ``id(t) -> t`` for every tensor found (parameters, state...).
        functions: ``(function, name)`` of the user functions found.
        modules: ``(module, place)`` of the modules found.
        known: the ids of every object found.
        dicts: ``(dict, place)`` of the modules' ``__dict__`` and ``_buffers`` and the plain
            objects' ``__dict__`` found: attributes a function may rebind (``_rebind``).
        optimizers: the optimizers found; ``optimizer_places``: where each was found.
        compiled: whether ``torch.compile``'d code was found.

    ``skip``: places ``(id(container), key)`` not to watch (what the function rebinds at
    every call: ``_rebind`` binds them after each replay).
    """

    def __init__(self, fn: Any, skip: frozenset = frozenset(), backward_hooks: bool = False,
                 label: str | None = None):
        self._skip = skip
        self._backward_hooks = backward_hooks  # walk the modules' backward hooks too
        self.dicts: list[tuple[dict, str]] = []
        # (dict, key, value, label) of the lists, sets and dict subclasses held as attributes
        self.held: list[tuple[dict, str, Any, str]] = []
        self.entry_dicts: set[int] = set()  # those of self.dicts that are dicts held as attributes
        self.optimizers: list[torch.optim.Optimizer] = []
        self.optimizer_places: list[str] = []
        self.compiled = False
        self.externals: dict[int, torch.Tensor] = {}
        self._t: tuple[list, list, list, list] = ([], [], [], [])  # containers, keys, ptrs, labels
        self._o: tuple[list, list, list, list] = ([], [], [], [])  # containers, keys, objects, labels
        self._v: tuple[list, list, list, list] = ([], [], [], [])  # containers, keys, values, labels
        self._tensors: list[torch.Tensor] = []  # the tensor at each watched place, at capture
        self._seen: set[int] = set()
        self._instance_dicts: set[int] = set()  # objects' __dict__s (watchable where probed so)
        self._globals: set[int] = set()  # modules' globals: scripts rebind them all the time
        self.functions: list[tuple[Callable, str]] = []
        self.modules: list[tuple[nn.Module, str]] = []
        self.leaves: list[tuple[torch.Tensor, str]] = []  # (backward_hooks) leaves requiring grad: their hooks
        self._reads_init()
        self._visit(fn, label or ("module" if isinstance(fn, nn.Module) else "the wrapped callable"), 0)
        if backward_hooks:
            self._leaf_hooks()
        self.known = frozenset(self._seen)  # objects that exist outside the call

    def hook_dicts(self) -> list[HookDict]:
        """The hook dicts a call runs (``_hookdicts``): those of the modules, optimizers and,
        with ``backward_hooks``, of the leaves that require grad."""
        return hook_dicts(self.modules, self._backward_hooks, self.leaves,
                          list(zip(self.optimizers, self.optimizer_places)))

    def _bind(self, container: Any, key: Any, value: Any, label: str, depth: int, scalars: bool = True) -> None:
        """Watch ``container[key]`` (now ``value``), then what ``value`` leads to (``scalars``:
        with the Python scalars of the lists and dicts found there)."""
        if self._skip and (id(container), key) in self._skip:
            return
        self._bound.add((id(container), key))
        if isinstance(value, torch.Tensor):
            self.externals[id(value)] = value
            for lst, item in zip(self._t, (container, key, _data_ptr(value), label)):
                lst.append(item)
            self._tensors.append(value)
        elif is_value(value):
            for lst, item in zip(self._v, (container, key, value, label)):
                lst.append(item)
        elif is_array(value):  # by identity, and its bytes (written in place, it is the same object)
            for lst, item in zip(self._o, (container, key, value, label)):
                lst.append(item)
            if value.nbytes <= MAX_ARRAY_BYTES:
                place = ArrayContent(value)
                for lst, item in zip(self._v, (place, None, place, label)):
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
            self._method(obj.__func__, obj.__self__, label, depth)  # what it reads off its self
        elif isinstance(obj, types.FunctionType):
            self._function(obj, depth)
        elif isinstance(obj, (list, tuple, dict)):
            items = list(obj.items()) if isinstance(obj, dict) else list(enumerate(obj))
            for key, item in items:
                if not isinstance(item, _SCALARS):
                    self._bind(obj, key, item, f"{label}[{key!r}]", depth, scalars)
            # read whole (its length, keys and entries), but where the function rebinds entries
            if scalars and not isinstance(obj, tuple) and not any((id(obj), key) in self._skip for key, _ in items):
                place = Contents(obj)
                for lst, item in zip(self._v, (place, None, place, label)):
                    lst.append(item)
        elif isinstance(obj, WrapperSurface):
            # another wrapper, called inside this graph's capture, ran its function inline: the
            # graph reads what that function reads, not the wrapper's own bookkeeping (its graphs,
            # counters, index), which its calls elsewhere change
            self._visit(obj.module, f"{label}.module", depth)
        elif hasattr(obj, "__dict__") and not callable(getattr(obj, "__get__", None)):
            compiled = getattr(obj, "_torchdynamo_orig_callable", None)
            self.compiled = self.compiled or compiled is not None
            inner = compiled or getattr(obj, "__wrapped__", None)
            if inner is not None:
                self._visit(inner, label, depth)
            self._method(getattr(type(obj), "__call__", None), obj, label, depth)  # (a class of the user's)
            # Python scalars of arbitrary objects are not watched: counters on an object the
            # function merely mentions would make every call stale.
            attrs = vars(obj)
            self._instance_dicts.add(id(attrs))
            self.dicts.append((attrs, label))
            for name, value in list(attrs.items()):
                if not name.startswith("__") and isinstance(value, _WORTH):
                    self._bind(attrs, name, value, f"{label}.{name}", depth, scalars=False)
                if not name.startswith("__"):
                    self._held(attrs, name, value, f"{label}.{name}")

    def _held(self, attrs: dict, name: str, value: Any, label: str) -> None:
        """A list, dict or set held as an attribute (``self.metrics``, ``self.history``): a
        plain dict's entries are attributes a function may rebind (``_rebind``: bound after
        each replay); the others are snapshot around the capture, and changed in place refused."""
        if type(value) is dict:
            self.dicts.append((value, label))
            self.entry_dicts.add(id(value))
        elif isinstance(value, (list, set, dict)):
            self.held.append((attrs, name, value, label))
        else:
            return
        self.held += containers_in(value, label)

    def _function(self, fn: types.FunctionType, depth: int) -> None:
        compiled = getattr(fn, "_torchdynamo_orig_callable", None)
        self.compiled = self.compiled or compiled is not None
        wrapped = getattr(fn, "__wrapped__", None) or compiled
        if internal(fn):  # torch's own wrappers (torch.compile's): only what they wrap is user code
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
        self._reads_off_names(fn, name, depth)
        if wrapped is not None:
            self._visit(wrapped, name, depth)

    def _module(self, module: nn.Module, label: str, depth: int) -> None:
        for path, m in module.named_modules(remove_duplicate=True):
            where = f"{label}.{path}" if path else label
            if id(m) in self._seen and m is not module:
                continue
            self.modules.append((m, where))
            self.dicts += [(m.__dict__, where), (m.__dict__["_buffers"], where)]
            self.compiled = self.compiled or "_orig_mod" in m.__dict__["_modules"]  # (an OptimizedModule)
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
                if isinstance(value, torch.Tensor) or is_value(value) or is_array(value):
                    self._bind(attrs, name, value, f"{where}.{name}", depth)
                elif callable(value) or isinstance(value, (torch.optim.Optimizer, TensorDictBase)):
                    self._bind(attrs, name, value, f"{where}.{name}", depth)
                else:
                    self._held(attrs, name, value, f"{where}.{name}")
            self._seen.add(id(m))
            self._hooks(hook_dicts([(m, where)], self._backward_hooks), depth)
            for klass in type(m).__mro__:  # the forwards of the user's classes: what their code reads
                if "forward" in vars(klass):
                    self._method(vars(klass)["forward"], m, where, depth)

    def _hooks(self, dicts: list[HookDict], depth: int) -> None:
        """The Python hooks a call runs (a module's and the global ones, an optimizer's, a
        parameter's), walked as the function is: a replay baked in what they read, as what the
        function reads. Besides, the attributes their code reads off the module or optimizer
        they are given and off their ``self`` (found in their bytecode), Python scalars by
        value: a hook's branch on a flag it reads there (``if not
        all(module._has_update_associated.values()): warn``) changes with it."""
        for d in dicts:
            for hook in list(d.hooks.values()):
                if pure(hook):
                    continue
                label = f"{d.where}: {describe_hook(d, hook)}"
                reads = attributes_read(hook)
                if not d.is_global and isinstance(d.owner, (nn.Module, torch.optim.Optimizer)):
                    attrs = vars(d.owner)
                    for name in sorted(reads.module):
                        if name in attrs and name != "training":
                            self._bind(attrs, name, attrs[name], f"{d.where}.{name} (read by {label})", depth)
                if reads.bound is not None:
                    attrs = vars(reads.bound)
                    for name in sorted(reads.bound_names):
                        if name in attrs:
                            self._bind(attrs, name, attrs[name], f"self.{name} of {label}", depth)
                self._visit(hook, label, depth + 1)  # (after: what it reads is named after the hook)

    def _leaf_hooks(self) -> None:
        """The leaves that require grad (parameters), whose hooks a backward inside the graph
        runs: kept, their hooks walked."""
        labels = self.labels()
        self.leaves = [(t, labels[id(t)]) for t in list(self.externals.values()) if t.is_leaf and t.requires_grad]
        self._hooks(hook_dicts([], True, self.leaves), 0)

    def _optimizer(self, opt: torch.optim.Optimizer, label: str, depth: int) -> None:
        self.optimizers.append(opt)
        self.optimizer_places.append(label)
        label = f"{label} ({type(opt).__name__})"
        attrs = opt.__dict__
        self._instance_dicts.add(id(attrs))
        for lst, item in zip(self._o, (attrs, "param_groups", opt.param_groups, f"{label}.param_groups")):
            lst.append(item)
        for lst, item in zip(self._o, (attrs, "state", opt.state, f"{label}.state")):
            lst.append(item)
        self._hooks(hook_dicts([], False, optimizers=[(opt, label)]), depth)  # its step hooks, torch's global ones
        place = Structure(opt)  # groups, their parameters, which have state and require grad
        for lst, item in zip(self._v, (place, None, place, f"{label}'s structure")):
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

    def labels(self) -> dict[int, str]:
        """``id(t) -> place``: how each tensor found is named in messages (its first place)."""
        out: dict[int, str] = {}
        for t, label in zip(self._tensors, self._t[3]):
            out.setdefault(id(t), label)
        return out

    def places(self) -> dict[int, tuple[Any, Any]]:
        """``id(t) -> (container, key)``: where each tensor found is read from (the first place)."""
        out: dict[int, tuple[Any, Any]] = {}
        for container, key, t in zip(self._t[0], self._t[1], self._tensors):
            out.setdefault(id(t), (container, key))
        return out

    def tensors(self) -> list[tuple[str, torch.Tensor]]:
        """``(place, tensor)`` of every tensor found (a parameter also under its optimizer)."""
        return list(zip(self._t[3], self._tensors))


_EMPTY = object()
