"""``InputSpec``: what a graph was captured with, and the check every replay runs.

Built once at capture. ``match()`` is the replay's fast path: one optree flatten (or
none, for positional tensors and for a lone TensorDict), one C++ comparison of every
tensor's shape, dtype, device, layout and requires_grad (dynamo's ``TensorGuards``, where
this torch has it, with the Python comparison as the definition) and a tuple comparison of
the non-tensor constants. It returns ``None`` on any difference; ``_explain`` then walks
the call again to say what differs. Where the guard passes, ``facts`` is not read: a fact
added there must be one the guard compares too, or calls differing in it would replay
(``tests/test_spec.py::TestTheGuardShortCut`` checks that a call is served exactly when its
facts match).

Strides are no part of the signature: ``copy_`` writes a tensor of any layout (transposed,
sliced, expanded, at another offset) into the captured buffer, which is dense (``_inputs``),
so the graph computes eager's values; its results keep the capture's layout. What does
depend on a call's exact strides is checked where the graph has it (``Entry.extra_ok``): an
input the function returns a view of, and inputs sharing memory, copied as one block.
"""

from __future__ import annotations

import math
from operator import attrgetter
from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

import torch
from tensordict import TensorDict

from ._slots import Slot
from ._tree import NO_TDS, Layout, flatten, is_slot_value

try:  # dynamo's C++ tensor check; optional, the Python comparison is the reference
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:  # pragma: no cover - depends on the torch build
    _TensorGuards = None

__all__ = ["Held", "InputSpec", "TensorFacts", "captured", "facts", "held", "same_constant"]

Tensor = torch.Tensor
_shape = attrgetter("shape")


@dataclass(frozen=True, slots=True)  # (read at every call: as fast as a tuple)
class FlatCall:
    """A call whose arguments are each one leaf: positional ones, then keywords in this order."""

    n_args: int
    names: tuple


class TensorFacts(NamedTuple):
    """What a replay needs to be unchanged about a tensor leaf (read by name; a tuple, so
    that the per-call comparison of ``_now`` with it is a tuple comparison)."""

    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool
    layout: torch.layout


def facts(t: Tensor) -> TensorFacts:
    """The :class:`TensorFacts` of a tensor leaf."""
    return TensorFacts(t.shape, t.dtype, t.device, t.requires_grad, t.layout)


def _now(t: Tensor) -> tuple:
    """:func:`facts` as a plain tuple, in :class:`TensorFacts`' order (the per-call path:
    no NamedTuple to build; equal to the captured facts when they match)."""
    return (t.shape, t.dtype, t.device, t.requires_grad, t.layout)


class Held:
    """A mutable container passed whole, as one constant (a ``dict`` subclass optree does not
    flatten): the object, and the entries it held at capture. The same object changed in place
    since then is another constant (compared by its entries, not by identity), as an equal copy
    is the same one.

        >>> class Cfg(dict): ...
        >>> cfg = Cfg(scale=2.0)
        >>> held = Held(cfg)
        >>> same_constant(cfg, held), same_constant(Cfg(scale=2.0), held)
        (True, True)
        >>> cfg["scale"] = 3.0
        >>> same_constant(cfg, held), held
        (False, {'scale': 2.0})
    """

    __slots__ = ("obj", "entries")

    def __init__(self, obj: Any) -> None:
        self.obj, self.entries = obj, _entries(obj)

    def same(self, other: Any) -> bool:
        if type(other) is not type(self.obj):
            return False
        now = _entries(other)
        return len(now) == len(self.entries) and all(map(_same_entry, now, self.entries))

    def __repr__(self) -> str:  # (as the object's own repr read at capture)
        if isinstance(self.obj, dict):
            return "{" + ", ".join(f"{k!r}: {v!r}" for k, v in self.entries) + "}"
        return repr(set(self.entries) if isinstance(self.obj, set) else self.entries)


def _entries(obj: Any) -> list:
    if isinstance(obj, dict):
        return list(obj.items())
    return sorted(obj, key=repr) if isinstance(obj, set) else list(obj)


def _same_entry(a: Any, b: Any) -> bool:
    if type(a) is tuple and type(b) is tuple and len(a) == 2 == len(b):  # (a dict's key and value)
        return same_constant(a[0], b[0]) and _same_entry(a[1], b[1])
    return a is b or (not isinstance(a, Tensor) and same_constant(a, b))


_MUTABLE = (dict, list, set)


def held(value: Any) -> Any:
    """``value`` as a signature keeps it: a mutable container as a :class:`Held` snapshot."""
    return Held(value) if isinstance(value, _MUTABLE) else value


def captured(constant: Any) -> Any:
    """The object a signature's constant stands for."""
    return constant.obj if type(constant) is Held else constant


def same_constant(a: Any, b: Any) -> bool:
    """Whether a non-tensor argument is the captured one, as far as a graph can tell.

    ``-0.0`` and ``0.0`` compare equal in Python but not to a graph that divides by
    them; ``nan`` is the captured ``nan``; a container passed whole is compared with the
    entries it held at capture (``b`` a :class:`Held`).
    """
    if a is b:
        return True
    if type(b) is Held:
        return b.same(a)
    if type(a) is not type(b):
        return False
    if type(a) is float:
        if a != a:
            return b != b
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if type(a) is complex:
        return same_constant(a.real, b.real) and same_constant(a.imag, b.imag)
    try:
        return bool(a == b)
    except Exception:  # an object whose == is not a truth value (e.g. an array)
        return False


def _const_key(value: Any) -> Any:
    if type(value) is Held:
        return ("id", id(value.obj))
    if type(value) is float:
        return (float, "nan") if value != value else (float, value, math.copysign(1.0, value))
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))
    return (type(value), value)


def _slot_key(slot: Slot) -> tuple:
    def node_key(node):
        if node is None:
            return None
        children = tuple(
            (name, child if type(child) is int else node_key(child)) for name, child in node.entries
        )
        return (node.cls, node.tc, tuple(node.batch_size), node.names, str(node.device), node.exact, children)

    return (slot.position, slot.cls, slot.exact, node_key(slot.root))


class InputSpec:
    """The captured inputs: their layout, tensor facts, constants and mode.

    Args:
        layout: the captured :class:`~graphmodule._tree.Layout`.
        leaves: the captured flat leaves.
        mode: what the call's outcome depends on besides its inputs (grad mode,
            train/eval, interaction type), as read by ``_mode``.
    """

    def __init__(self, layout: Layout, leaves: Sequence[Any], mode: tuple = ()):
        self.layout = layout
        self.mode = mode
        self.tensor_index = tuple(i for i, leaf in enumerate(leaves) if isinstance(leaf, Tensor))
        self.const_index = tuple(i for i, leaf in enumerate(leaves) if not isinstance(leaf, Tensor))
        self.facts = tuple(facts(leaves[i]) for i in self.tensor_index)
        self.shapes = [f.shape for f in self.facts]
        self.constants = tuple(held(leaves[i]) for i in self.const_index)
        self.all_tensors = not self.const_index
        n = len(leaves)
        flat_positional = flatten((tuple(range(n)), {}))[1]
        # captured with positional tensors only (no containers, no kwargs): no flatten at all
        self.n_positional = (
            n if self.all_tensors and not layout.slots and layout.treespec == flat_positional else -1
        )
        # captured with arguments that are each one leaf (tensors, scalars), some passed by
        # keyword (``policy(obs=obs)``): the leaves are the arguments, in the captured order
        self.flat_call = None
        if not layout.slots and n and all(len(p) == 2 for p in layout.paths):
            n_args = sum(1 for p in layout.paths if p[0] == 0)
            names = tuple(p[1] for p in layout.paths if p[0] == 1)
            if names and len(layout.paths) == n_args + len(names) and layout.treespec == flatten(
                    (tuple(range(n_args)), dict.fromkeys(names, 0)))[1]:
                self.flat_call = FlatCall(n_args, names)
        # captured with one TensorDict as the only argument (a TensorDict module's call)
        self.lone_slot = (
            layout.slots[0]
            if self.all_tensors and len(layout.slots) == 1 and layout.treespec == flatten(((0,), {}))[1]
            else None
        )
        self._guard = self._make_guard([leaves[i] for i in self.tensor_index])
        # what the call's TensorDicts and tensors are, without its Python values and modes (_variants)
        self.tensor_key = (
            tuple(_slot_key(slot) for slot in layout.slots),
            tuple(f._replace(device=str(f.device)) for f in self.facts),
        )
        self.key = (layout.treespec, *self.tensor_key, tuple(_const_key(c) for c in self.constants), mode)

    @staticmethod
    def _make_guard(tensors: list[Tensor]):
        if _TensorGuards is None or not tensors:
            return None
        try:  # the captured sizes exactly; no stride (any layout is copied into the buffer)
            strides = [[None] * t.dim() for t in tensors]
            guard = _TensorGuards(*tensors, dynamic_dims_sizes=None, dynamic_dims_strides=strides)
            if guard.check(*tensors):
                return guard
        except Exception:  # a private API: any surprise means the Python path
            pass
        return None

    # -- the fast path -------------------------------------------------------------------
    def match(self, args: tuple, kwargs: dict) -> tuple[Any, dict] | None:
        """The call's leaves and slot values if they match the capture, else ``None``."""
        if self.n_positional == len(args) and not kwargs:
            # positional tensors only, as captured: the arguments are the leaves; a
            # non-tensor among them fails the tensor check (matches(), inlined: the commonest call)
            guard = self._guard
            if guard is not None:
                try:
                    if guard.check(*args):
                        return args, NO_TDS
                except TypeError:  # a non-tensor where a tensor was captured
                    return None
            return (args, NO_TDS) if self._decide(args) else None
        if self.lone_slot is not None and len(args) == 1 and not kwargs:
            obj = args[0]
            leaves = self.lone_slot.read(obj) if type(obj) is TensorDict or is_slot_value(obj) else None
            if leaves is None:
                return None
            guard = self._guard  # (matches(), inlined: every leaf is a tensor)
            if guard is not None:
                try:
                    if guard.check(*leaves):
                        return leaves, {0: obj}
                except TypeError:
                    return None
            return (leaves, {0: obj}) if self._decide(leaves) else None
        flat_call = self.flat_call
        if flat_call is not None and len(args) == flat_call.n_args and tuple(kwargs) == flat_call.names:
            # each argument one leaf, keywords in the captured order: no flatten; a
            # container where a leaf was captured fails the leaf checks
            leaves = (*args, *kwargs.values())
            if self.matches(leaves):
                return leaves, NO_TDS
            return None
        split = self.layout.leaves((args, kwargs))
        if split is not None and self.matches(split[0]):
            return split
        return None

    def matches(self, leaves: Sequence[Any]) -> bool:
        if self.all_tensors:
            tensors = leaves
        else:
            tensors = [leaves[i] for i in self.tensor_index]
            consts = [leaves[i] for i in self.const_index]
            if not all(map(same_constant, consts, self.constants)):
                return False
        guard = self._guard
        if guard is not None:
            try:
                if guard.check(*tensors):
                    return True
            except TypeError:  # a non-tensor where a tensor was captured
                return False
        return self._decide(tensors)

    def _decide(self, tensors: Sequence[Any]) -> bool:
        """After the guard said no: it also compares dispatch keys (e.g. inference-mode
        tensors), so decide with the comparison that defines a match; another shape (the
        usual reason: another signature's call) answers first, without the facts."""
        try:
            if list(map(_shape, tensors)) != self.shapes:
                return False
            return all(_now(t) == f for t, f in zip(tensors, self.facts))
        except AttributeError:
            return False
