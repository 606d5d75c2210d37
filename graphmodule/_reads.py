"""What code reads off the objects it names: attribute chains found in its bytecode.

A module's ``forward`` reads ``self.shape``, ``self.config.gain``, ``self.cut`` (a class
attribute), a helper method's globals; a function reads ``CONFIG.gain`` off a global or
``box.scale`` off a closure variable. The walk over modules and functions
(:mod:`._discover`) watches what an object holds by kind; this module adds what the code
names, whatever the kind: :func:`chains` lists the attribute chains a code object loads off
its first argument, its globals and its closure variables (``c = self.config; c.gain`` as
``self.config.gain``), and :class:`ReadsWalk` (a part of
:class:`~graphmodule._discover.Discovery`) resolves them on the objects found, as Python
would (the object's ``__dict__``, a module's parameters and children, then its class), and
watches each place on the way. :func:`global_names`: the globals a code object loads or stores.

Not seen: names built at run time (``getattr(self, name)``), attributes behind properties
or ``__slots__`` (their code is not run at capture), reads through a variable assigned
otherwise than from such a chain, and methods reached through ``super()``.
"""

from __future__ import annotations

import dis
import enum
import functools
import types
from typing import Any, NamedTuple

from torch import nn

from ._places import Attribute

__all__ = ["Chain", "Root", "ReadsWalk", "chains", "global_names", "internal"]

MAX_CHAIN = 4  # attributes followed from a root
_INTERNAL_PACKAGES = frozenset({"torch", "tensordict", "graphmodule", "functools", "typing", "contextlib"})
# what nn.Module.__init__ sets on every module: torch's bookkeeping, watched elsewhere or not read
_MODULE_OWN = frozenset(vars(nn.Module()))
_MISSING = object()


def internal(fn: Any) -> bool:
    """Functions of torch, tensordict and the standard library: not the user's Python state."""
    module = getattr(fn, "__module__", None) or ""
    return module.split(".", 1)[0] in _INTERNAL_PACKAGES


class Root(enum.Enum):
    LOCAL = "local"  # an argument or local variable (``self``)
    GLOBAL = "global"
    FREE = "free"  # a closure variable


class Chain(NamedTuple):
    root: Root
    name: str  # the variable the chain starts from
    attributes: tuple[str, ...]


@functools.lru_cache(maxsize=4096)
def chains(code: types.CodeType) -> frozenset[Chain]:
    """The attribute chains ``code`` loads (``self.a.b``), with those of the code objects nested
    in it (comprehensions, lambdas: their free variables named as the outer function's locals
    are those locals)."""
    out: set[Chain] = set()
    _scan(code, out, frozenset(code.co_varnames) | frozenset(code.co_cellvars), top=True)
    prefixes = {c._replace(attributes=c.attributes[:i]) for c in out for i in range(1, len(c.attributes))}
    return frozenset(out - prefixes)  # (following a chain watches its prefixes' places too)


def _scan(code: types.CodeType, out: set, outer: frozenset, top: bool) -> None:
    aliases: dict[str, Chain] = {}  # local variable -> the chain it was assigned from
    current: Chain | None = None
    for ins in dis.get_instructions(code):
        op = ins.opname
        if op in ("LOAD_ATTR", "LOAD_METHOD") and current is not None:
            current = current._replace(attributes=(*current.attributes, ins.argval))
            if len(current.attributes) <= MAX_CHAIN:
                out.add(current)
            continue
        if op == "EXTENDED_ARG":
            continue
        if op == "STORE_FAST" and current is not None and top:
            aliases[ins.argval] = current
        current = None
        if op.startswith("LOAD_FAST") and top:
            name = ins.argval[-1] if isinstance(ins.argval, tuple) else ins.argval
            current = aliases.get(name, Chain(Root.LOCAL, name, ()))
        elif op == "LOAD_DEREF":
            current = Chain(Root.LOCAL if ins.argval in outer else Root.FREE, ins.argval, ())
        elif op in ("LOAD_GLOBAL", "LOAD_NAME"):
            current = Chain(Root.GLOBAL, ins.argval, ())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _scan(const, out, outer, top=False)


@functools.lru_cache(maxsize=4096)
def global_names(code: types.CodeType) -> frozenset[str]:
    """The global names ``code`` and the code nested in it load or store. Memoized: a code
    object never changes, and every walk of a function reads its bytecode (several a capture)."""
    names = set()
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL"):
            names.add(ins.argval)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= global_names(const)
    return frozenset(names)


def _unwrap(fn: Any) -> Any:
    """The user's function under torch's decorators (``@torch.no_grad()``)."""
    while internal(fn) and getattr(fn, "__wrapped__", None) is not None:
        fn = fn.__wrapped__
    return fn


def _static(cls: type, name: str) -> tuple[Any, type | None]:
    """``name`` as found in the dicts of ``cls``'s MRO, and the class holding it."""
    for klass in cls.__mro__:
        attrs = vars(klass)
        if name in attrs:
            return attrs[name], klass
    return _MISSING, None


def _data_descriptor(value: Any) -> bool:
    kind = type(value)
    return hasattr(kind, "__set__") or hasattr(kind, "__delete__")


class _Found(NamedTuple):
    container: Any  # where the value is watched (None: watched elsewhere, or a method)
    key: Any
    value: Any
    note: str  # for the label


def _lookup(obj: Any, name: str, attributes: dict) -> _Found | None:
    """``obj.name`` as Python finds it, without running code (no property, no ``__getattr__``
    but nn.Module's); ``attributes`` holds the :class:`Attribute` places made so far."""
    if isinstance(obj, (type, types.ModuleType)):
        return None
    static, owner = _static(type(obj), name)
    if static is not _MISSING and _data_descriptor(static):
        return None
    try:
        attrs = object.__getattribute__(obj, "__dict__")
    except Exception:  # noqa: BLE001 - no __dict__ (slots, a builtin)
        attrs = None
    if type(attrs) is dict:
        if name in attrs:
            return _Found(attrs, name, attrs[name], "") if name not in _MODULE_OWN or not isinstance(
                obj, nn.Module) else None
        if isinstance(obj, nn.Module):
            for kind in ("_parameters", "_buffers", "_modules"):
                held = attrs.get(kind) or {}
                if name in held:  # walked with the module
                    return _Found(None, None, held[name], "")
    if static is _MISSING or isinstance(static, (staticmethod, classmethod)):
        return None
    if isinstance(static, types.FunctionType):  # a method
        return _Found(None, None, static, "")
    if hasattr(type(static), "__get__"):
        return None
    place = attributes.setdefault((id(obj), name), Attribute(obj, name))
    return _Found(place, None, static, f" (class attribute of {owner.__name__})")


class ReadsWalk:
    """The part of :class:`~graphmodule._discover.Discovery` that follows what code reads
    (see the module docstring). Uses its ``_bind`` and ``_visit``."""

    def _reads_init(self) -> None:
        self._methods: set[tuple[int, int]] = set()  # (function, object) pairs followed
        self._bound: set[tuple[int, Any]] = set()  # (id(container), key) of every place bound
        self._attributes: dict[tuple[int, str], Attribute] = {}

    def _method(self, fn: Any, obj: Any, label: str, depth: int) -> None:
        """``fn`` called with ``obj`` as its first argument (a module's ``forward``, a
        ``__call__``, a bound method, a helper it calls): what it reads off ``obj``, and
        its globals and closure variables."""
        fn = _unwrap(fn)
        if not isinstance(fn, types.FunctionType) or internal(fn) or (id(fn), id(obj)) in self._methods:
            return
        self._methods.add((id(fn), id(obj)))
        self._visit(fn, label, depth)
        code = fn.__code__
        if not code.co_argcount:
            return
        first = code.co_varnames[0]
        for chain in chains(code):
            if chain.root is Root.LOCAL and chain.name == first and chain.attributes:
                self._follow(obj, chain.attributes, label, depth)

    def _reads_off_names(self, fn: types.FunctionType, name: str, depth: int) -> None:
        """What ``fn`` reads off its globals and closure variables (``CONFIG.gain``)."""
        cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
        for chain in chains(fn.__code__):
            if not chain.attributes or chain.root is Root.LOCAL:
                continue
            if chain.root is Root.GLOBAL:
                value, where = fn.__globals__.get(chain.name, _MISSING), f"global {chain.name!r} read by {name}"
            else:
                try:
                    value = cells[chain.name].cell_contents if chain.name in cells else _MISSING
                except ValueError:  # an empty cell
                    continue
                where = f"closure variable {chain.name!r} of {name}"
            if value is not _MISSING:
                self._follow(value, chain.attributes, where, depth + 1)

    def _follow(self, obj: Any, names: tuple[str, ...], label: str, depth: int) -> None:
        """Watch each place on ``obj.names[0].names[1]...`` (a method found on the way is
        followed as one, with its object)."""
        for name in names:
            found = _lookup(obj, name, self._attributes)
            if found is None:
                return
            if isinstance(found.value, types.FunctionType) and found.container is None:
                self._method(found.value, obj, label, depth)
                return
            label = f"{label}.{name}"
            if found.container is not None and (id(found.container), found.key) not in self._bound:
                self._bind(found.container, found.key, found.value, label + found.note, depth)
            obj = found.value
