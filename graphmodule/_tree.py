"""How a call's inputs become a flat list of leaves, and back: the hot path.

Containers (tuples, lists, dicts, namedtuples, ``None``) are flattened by optree in
graphmodule's own namespace, where dicts keep their insertion order: a function that
iterates a dict sees its order, so a dict whose order changes is another structure.

TensorDicts and tensorclasses are optree leaves; each becomes a *slot*, read by key
(``_slots``). A :class:`Layout`, built once at capture, holds the optree structure and the
slots, and reads a later call's leaves in the captured order. Messages about mismatches are
written by ``_explain``, never here.
"""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

import optree
from tensordict import TensorDictBase, is_tensorclass

from ._errors import UnsupportedError
from ._paths import NestedKey, as_key, format_key, format_path
from ._slots import MISSING, Slot, Unreadable

NAMESPACE = "graphmodule"
NO_TDS: dict = {}  # a call without TensorDicts (shared, never written)


def _insertion_ordered_dicts() -> None:
    setter = getattr(getattr(optree, "_C", None), "set_dict_insertion_ordered", None)
    if setter is not None:
        setter(True, NAMESPACE)
    else:  # pragma: no cover - older optree: the public context manager, entered for good
        contextlib.ExitStack().enter_context(optree.dict_insertion_ordered(True, namespace=NAMESPACE))


_insertion_ordered_dicts()


def flatten(tree: Any) -> tuple[list, Any]:
    return optree.tree_flatten(tree, namespace=NAMESPACE)


def flatten_with_path(tree: Any) -> tuple[list, list, Any]:
    return optree.tree_flatten_with_path(tree, namespace=NAMESPACE)


def is_slot_value(value: Any) -> bool:
    """TensorDicts and tensorclass instances: read by key rather than as constants."""
    return isinstance(value, TensorDictBase) or is_tensorclass(value)


class _Refused(Exception):
    """An :class:`Unreadable` entry, with the optree path of its slot."""


class Layout:
    """The structure of a call's inputs, fixed at capture.

    ``leaves(tree)`` returns the flat leaves of a later call in the captured order and
    its slot values by position, or ``None`` when the structure differs.
    """

    def __init__(self, treespec: Any, slots: tuple[Slot, ...], paths: list[tuple], outer: list):
        self.treespec = treespec
        self.slots = slots
        self.paths = paths
        self.outer = outer  # the captured optree leaves (for messages)
        self.slot_at = {slot.position: slot for slot in slots}

    @classmethod
    def capture(cls, tree: Any, by_key: dict[tuple, list[NestedKey] | None], owner: str = "CudaGraphModule",
                arg_names: Sequence[str] = ()) -> "Layout":
        """The layout of ``tree``. ``by_key`` maps the optree path of a TensorDict to the
        keys read from it (``None``: every key it has now); other TensorDicts are exact.
        Raises :class:`UnsupportedError` (for ``owner``) for an entry a graph cannot take."""
        try:
            return cls._capture(tree, by_key)
        except _Refused as refused:
            err = refused.args[0]
            shapes = " and ".join(map(str, err.shapes)) or "several shapes"
            place = f"{format_path(refused.args[1], arg_names)}[{format_key(err.key)}]"
            raise UnsupportedError(
                owner,
                f"expected one shape per entry, got a LazyStackedTensorDict whose entry {place} has shapes {shapes}: "
                "a graph copies each input into a buffer of one shape.",
                "pass the stacked TensorDicts as a list (td.tensordicts, or list(td.unbind(td.stack_dim))), each "
                "of its own shapes, or pad the entry to one shape (td.get(key, as_padded_tensor=True)); a "
                "TensorDict module reads only its in_keys, which may stack while other entries do not.",
            ) from None

    @classmethod
    def _capture(cls, tree: Any, by_key: dict[tuple, list[NestedKey] | None]) -> "Layout":
        paths, outer, treespec = flatten_with_path(tree)
        slots = []
        for position, (path, leaf) in enumerate(zip(paths, outer)):
            if is_slot_value(leaf):
                path = tuple(path)
                keys = by_key.get(path, MISSING) if not is_tensorclass(leaf) else MISSING
                if keys is MISSING:
                    keys = None
                elif keys is None:
                    keys = [as_key(k) for k in leaf.keys(include_nested=True, leaves_only=True)]
                    keys = keys or []
                try:
                    slots.append(Slot(position, path, leaf, keys))
                except Unreadable as err:
                    raise _Refused(err, path) from None
        return cls(treespec, tuple(slots), [tuple(p) for p in paths], outer)

    def leaves(self, tree: Any) -> tuple[list, dict[int, Any]] | None:
        outer, treespec = flatten(tree)
        if treespec != self.treespec:
            return None
        if not self.slots:
            return outer, NO_TDS
        flat: list = []
        objs: dict[int, Any] = {}
        start = 0
        for slot in self.slots:
            position = slot.position
            flat += outer[start:position]
            start = position + 1
            obj = outer[position]
            values = slot.read(obj)
            if values is None:
                return None
            flat += values
            objs[position] = obj
        flat += outer[start:]
        return flat, objs

    def leaf_paths(self) -> list[tuple]:
        """The path of each flat leaf: the optree path, plus the key inside a slot."""
        out = []
        for position, path in enumerate(self.paths):
            slot = self.slot_at.get(position)
            if slot is None:
                out.append((path, None))
            else:
                out += [(path, key) for key in slot.keys]
        return out


def unflatten(layout: Layout, leaves: list, objs: dict[int, Any]) -> Any:
    """Rebuild a tree from flat leaves, with ``objs[position]`` for each slot."""
    if not layout.slots:
        return optree.tree_unflatten(layout.treespec, leaves)
    outer: list = []
    start = 0
    for slot in layout.slots:
        count = slot.position - len(outer)
        outer += leaves[start : start + count]
        start += count + len(slot.keys)
        outer.append(objs[slot.position])
    outer += leaves[start:]
    return optree.tree_unflatten(layout.treespec, outer)


def slot_ranges(layout: Layout) -> dict[int, range]:
    """For each slot, the range of its leaves in the flat list."""
    ranges, offset, outer_done = {}, 0, 0
    for slot in layout.slots:
        offset += slot.position - outer_done
        ranges[slot.position] = range(offset, offset + len(slot.keys))
        offset += len(slot.keys)
        outer_done = slot.position + 1
    return ranges
