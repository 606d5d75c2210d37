"""The input tree handed to the function at capture, and where each object in it sits.

The function is handed the input tree over the static input buffers (``_inputs``) with fresh
containers (dicts, lists, TensorDicts); :class:`Materialized` remembers where each of those
objects sits in the call (a :class:`Ref`), so that effects on them and returned ones can be
mapped back onto the caller's own objects: :func:`resolve` finds the caller's object at a
``Ref`` at every call (the hot path of effects and of results that are inputs).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from tensordict import TensorDict, TensorDictBase, is_tensorclass

from ._inputs import StaticInputs
from ._slots import _is_node, build_td, nested_entries, node_td
from ._tree import unflatten

__all__ = ["Materialized", "Outside", "Ref", "RefKind", "resolve"]

_CONTAINERS = (dict, list, tuple)


class Mirror(NamedTuple):
    """A nested TensorDict of the caller's, mirrored empty in what the function is handed."""

    batch_size: Any
    device: Any


class RefKind(enum.Enum):
    """Where an object of a call sits."""

    TREE = "a container at a path into (args, kwargs)"
    SLOT = "a TensorDict at a nested key (() for its root) of the TensorDict argument at a slot"
    SLOT_OBJ = "the TensorDict or tensorclass argument at a slot itself"
    SLOT_TC = "a tensorclass at a nested key of the TensorDict argument at a slot"
    OUTSIDE = "an object outside the call: a tensor whose .grad, or a dict whose entry, the function rebinds"


TREE, SLOT, SLOT_OBJ, SLOT_TC = RefKind.TREE, RefKind.SLOT, RefKind.SLOT_OBJ, RefKind.SLOT_TC  # (read without the class: faster)
OUTSIDE = RefKind.OUTSIDE


@dataclass(frozen=True, slots=True)  # (read at every call: as fast as a tuple)
class Ref:
    """The place of an object in a call: found again in a later call by :func:`resolve`."""

    kind: RefKind
    position: int | None  # the slot's position (None for TREE)
    path: tuple  # TREE: the path into (args, kwargs); SLOT, SLOT_TC: the nested key; SLOT_OBJ: ()

    @classmethod
    def tree(cls, path: tuple) -> "Ref":
        return cls(TREE, None, path)

    @classmethod
    def slot(cls, position: int, key: tuple = ()) -> "Ref":
        return cls(SLOT, position, key)

    @classmethod
    def slot_tc(cls, position: int, key: tuple) -> "Ref":
        return cls(SLOT_TC, position, key)

    @classmethod
    def slot_obj(cls, position: int) -> "Ref":
        return cls(SLOT_OBJ, position, ())


@dataclass(frozen=True, slots=True, eq=False)
class Outside:
    """An object outside the call that its effects change (``_rebind``): the same at every call."""

    obj: Any
    kind: ClassVar[RefKind] = OUTSIDE


class Materialized:
    """The input tree handed to the function at capture, and where each object in it sits.

    ``refs`` maps ``id(obj)`` of every container, TensorDict (nested ones too) and
    tensorclass handed to the function to its place in the call (a :class:`Ref`). The
    objects are kept alive here, so ids stay valid.
    """

    def __init__(self, inputs: StaticInputs, callers: dict[int, Any] | None = None):
        layout = inputs.layout
        self.slot_objs: dict[int, Any] = {}
        # (position, key) -> (batch size, device) of the caller's nested TensorDicts that a
        # TensorDict read by key (a TensorDictModule's input) holds but does not read:
        # mirrored empty, so that a write below one lands in it (and merges into the
        # caller's, as eagerly). Found from the ``callers`` at capture.
        self.mirrors: dict[tuple, tuple] = {}
        self.by_key = {slot.position for slot in layout.slots if not slot.exact}
        self.slot_paths = {slot.position: tuple(slot.path) for slot in layout.slots}
        # the nested TensorDicts of the caller's by-key TensorDicts at capture, read or not
        self.nested = {position: nested_paths(callers[position]) for position in self.by_key
                       if callers is not None and position in callers}
        for slot in layout.slots:
            values = [inputs.leaves[i] for i in inputs.ranges[slot.position]]
            td = build_td(slot.root, values)
            if slot.position in self.by_key and not slot.is_tc and callers is not None and slot.position in callers:
                self._mirror(td, callers[slot.position], slot.position, ())
            if slot.locked:  # the stand-in locked as the caller's was
                td.lock_()
            obj = slot.cls._from_tensordict(td, non_tensordict=dict(slot.tc_extra)) if slot.is_tc else td
            self.slot_objs[slot.position] = obj
        self.tree = unflatten(layout, inputs.leaves, self.slot_objs)
        self.refs: dict[int, Ref] = {}
        self.objects: list[Any] = []  # keeps every referenced object alive
        self._walk(self.tree, ())
        for slot in layout.slots:
            obj = self.slot_objs[slot.position]
            self._register(obj, Ref.slot_obj(slot.position))
            td = slot.td_of(obj)
            self._register(td, Ref.slot(slot.position))
            self._walk_td(td, slot.position, ())

    def _mirror(self, td: TensorDictBase, caller: Any, position: int, prefix: tuple) -> None:
        if not isinstance(caller, TensorDictBase):
            return
        for name, value in nested_entries(caller):
            if not _is_node(value):
                continue
            key = prefix + (name,)
            if name not in td.keys():
                if type(td) is not TensorDict:
                    continue
                td._tensordict[name] = TensorDict(batch_size=value.batch_size, device=value.device)
                self.mirrors[(position, key)] = Mirror(value.batch_size, value.device)
            mine = td._tensordict.get(name) if type(td) is TensorDict else None
            if _is_node(mine):
                self._mirror(mine, value, position, key)

    def _register(self, obj: Any, ref: Ref) -> None:
        if id(obj) not in self.refs:
            self.refs[id(obj)] = ref
            self.objects.append(obj)

    def _walk(self, node: Any, path: tuple) -> None:
        if isinstance(node, _CONTAINERS) and not isinstance(node, TensorDictBase):
            if len(path) > 1:  # not the (args, kwargs) pair nor its two halves: Python's own
                self._register(node, Ref.tree(path))
            items = node.items() if isinstance(node, dict) else enumerate(node)
            for key, child in items:
                self._walk(child, path + (key,))

    def _walk_td(self, td: TensorDictBase, position: int, prefix: tuple) -> None:
        for name, value in td.items():
            inner = node_td(value)
            if inner is not None:
                key = prefix + (name,)
                if inner is not value:  # a tensorclass: itself, and its TensorDict (what writes change)
                    self._register(value, Ref.slot_tc(position, key))
                self._register(inner, Ref.slot(position, key))
                self._walk_td(inner, position, key)


def nested_paths(td: Any) -> tuple:
    """The key paths of the nested TensorDicts in ``td``, depth first (its layout, no leaves)."""
    if not _is_node(td):
        return ()
    out = []
    stack = [((), td)]
    while stack:
        prefix, node = stack.pop()
        for name, value in nested_entries(node):
            if _is_node(value):
                out.append(prefix + (name,))
                stack.append((prefix + (name,), value))
    return tuple(out)


def resolve(ref: Ref, tree: Any, slot_objs: dict[int, Any]) -> Any:
    """The caller's object at ``ref`` (see :class:`Materialized`)."""
    kind = ref.kind
    if kind is TREE:
        node = tree
        for part in ref.path:
            node = node[part]
        return node
    if kind is OUTSIDE:
        return ref.obj
    obj = slot_objs[ref.position]
    if kind is SLOT_OBJ:
        return obj
    td = obj._tensordict if is_tensorclass(obj) else obj
    if not ref.path:
        return td
    value = td.get(ref.path)
    return node_td(value) if kind is SLOT else value  # (a tensorclass's TensorDict, for SLOT)
