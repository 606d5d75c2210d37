"""How a call's inputs become a flat list of leaves, and back.

Containers (tuples, lists, dicts, namedtuples, ``None``) are flattened by optree, a
C++ pytree library: about a microsecond for a small call. TensorDicts are leaves
for optree and are flattened here, by key, so that their keys and batch size are
part of the structure and their leaves are checked and copied like any tensor.

A TensorDict is read in one of two ways:

- exactly (an argument of a plain function): its keys must be the captured keys;
- by key (the input of a TensorDict module): the captured keys must be present,
  other keys are ignored, as the module does not read them.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Sequence

import optree
import torch
from tensordict import TensorDict, TensorDictBase, is_non_tensor

from ._errors import Mismatch

NestedKey = tuple  # a TensorDict key as a tuple of strings
MISSING = object()  # a key absent from a TensorDict


def as_key(key: Any) -> NestedKey:
    """``"a"`` and ``("a", "b")`` as tuples of strings."""
    return (key,) if isinstance(key, str) else tuple(key)


def format_key(key: NestedKey) -> str:
    return ", ".join(repr(part) for part in key)


def format_path(path: Sequence[Any], arg_names: Sequence[str] = ()) -> str:
    """``(0, 1, 'obs')`` → ``args[1]['obs']``; ``(1, 'x')`` → ``kwargs['x']``."""
    if not path:
        return "inputs"
    head, rest = path[0], list(path[1:])
    if head == 0 and rest:
        index = rest.pop(0)
        text = arg_names[index] if index < len(arg_names) else f"args[{index}]"
    elif head == 1 and rest:
        text = f"kwargs[{rest.pop(0)!r}]"
    else:
        text = "inputs"
    return text + "".join(f"[{part!r}]" for part in rest)


def describe(value: Any) -> str:
    """A short description of a value for messages; never prints tensor data."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}, {value.dtype} on {value.device}"
    if isinstance(value, TensorDictBase):
        return f"a {type(value).__name__} with batch size {tuple(value.batch_size)}"
    text = repr(value)
    return text if len(text) <= 60 else f"a {type(value).__name__}"


def _key_order(key: NestedKey) -> tuple:
    # sorted by parent, then name: the leaves of one nested TensorDict are contiguous,
    # so the fast reader takes them with one itemgetter call
    return (key[:-1], key[-1])


def _is_leaf_class(cls: type) -> bool:
    # tensors and non-tensor entries (NonTensorData) are leaves; TensorDicts are nodes
    return not issubclass(cls, TensorDictBase) or bool(getattr(cls, "_is_non_tensor", False))


def leaf_keys(td: TensorDictBase) -> list[NestedKey]:
    """The keys of every leaf of ``td``, non-tensor entries included, as tuples."""
    return [as_key(k) for k in td.keys(include_nested=True, leaves_only=True, is_leaf=_is_leaf_class)]


def _td_leaf_keys(td: TensorDictBase) -> tuple[NestedKey, ...]:
    return tuple(sorted(leaf_keys(td), key=_key_order))


def _read_slow(td: TensorDictBase, key: NestedKey) -> Any:
    value = td.get(key, MISSING)
    if value is not MISSING and is_non_tensor(value):
        value = td[key]  # the Python object, as the function reads it
    return value


def raw_node(td: TensorDict, path: tuple) -> dict:
    """The ``_tensordict`` dict of the nested TensorDict at ``path`` (``()``: ``td``'s own).

    Raises ``KeyError`` or ``AttributeError`` where the path does not lead to a dense
    TensorDict; callers take the general path then.
    """
    node = td._tensordict
    for part in path:
        node = node[part]._tensordict
    return node


class _FastReader:
    """Reads a dense TensorDict's leaves straight from its nested ``_tensordict`` dicts.

    ``td.get`` costs about half a microsecond per key; this costs one dict lookup per
    nested level and one ``itemgetter`` call per group of siblings. Built only for
    plain ``TensorDict`` slots whose captured leaves are all tensors; any surprise
    (a missing key, another TensorDict type inside) returns ``None`` and the caller
    takes the general path.
    """

    def __init__(self, keys: tuple[NestedKey, ...], exact: bool, node_names: dict[tuple, frozenset]):
        groups: list[tuple[tuple, list[str]]] = []
        for key in keys:
            parent, name = key[:-1], key[-1]
            if groups and groups[-1][0] == parent:
                groups[-1][1].append(name)
            else:
                groups.append((parent, [name]))
        self.groups = [(parent, operator.itemgetter(*names), len(names) == 1) for parent, names in groups]
        self.exact_nodes = tuple(node_names.items()) if exact else ()

    def read(self, td: TensorDict) -> list | None:
        try:
            out: list = []
            for parent, getter, single in self.groups:
                node = raw_node(td, parent)
                if single:
                    out.append(getter(node))
                else:
                    out += getter(node)
            for parent, names in self.exact_nodes:
                if raw_node(td, parent).keys() != names:
                    return None
            return out
        except (KeyError, AttributeError):
            return None


def _node_names(td: TensorDictBase) -> dict[tuple, frozenset]:
    """Every nested TensorDict's path mapped to the names it holds."""
    out = {(): frozenset(td.keys())}
    for key in td.keys(include_nested=True):
        key = as_key(key)
        value = td.get(key)
        if isinstance(value, TensorDictBase):
            out[key] = frozenset(value.keys())
    return out


@dataclass(frozen=True)
class TensorDictSlot:
    """One TensorDict among the optree leaves, and the keys read from it."""

    position: int  # index among the optree leaves
    td_type: type
    batch_size: torch.Size
    keys: tuple[NestedKey, ...]
    exact: bool  # the key set must match (else: extra keys are ignored)
    reader: _FastReader | None = None

    def read(self, td: TensorDictBase) -> list | None:
        """The leaves at ``keys``, or ``None`` if the TensorDict does not fit the slot."""
        if type(td) is not self.td_type or td.batch_size != self.batch_size:
            return None
        if self.reader is not None:
            values = self.reader.read(td)
            if values is not None:
                return values
        if self.exact and _td_leaf_keys(td) != self.keys:
            return None
        values = [_read_slow(td, key) for key in self.keys]
        if any(value is MISSING for value in values):
            return None
        return values


class Layout:
    """The structure of a call's inputs, fixed at capture.

    ``leaves(tree)`` returns the flat leaves of a later call in the captured order,
    or ``None`` when the structure differs; ``diff(tree)`` then says how.
    """

    def __init__(self, treespec: Any, slots: tuple[TensorDictSlot, ...], paths: list[tuple], outer: list):
        self.treespec = treespec
        self.slots = slots
        self.paths = paths  # the optree path of each outer leaf
        self.described = [describe(leaf) for leaf in outer]  # for "missing" messages
        self._slot_at = {slot.position: slot for slot in slots}

    @classmethod
    def capture(cls, tree: Any, by_key: dict[int, Sequence[NestedKey] | None] | None = None):
        """The layout of ``tree`` and its leaves.

        ``by_key`` maps the position of a TensorDict among the optree leaves to the
        keys to read from it (``None``: the keys it has now); those TensorDicts
        ignore extra keys later. Every other TensorDict is read exactly.
        """
        by_key = by_key or {}
        paths, outer, treespec = optree.tree_flatten_with_path(tree)
        slots = []
        for position, leaf in enumerate(outer):
            if isinstance(leaf, TensorDictBase):
                if position in by_key:
                    keys = by_key[position]
                    keys = _td_leaf_keys(leaf) if keys is None else _expand_keys(leaf, keys)
                    exact = False
                else:
                    keys, exact = _td_leaf_keys(leaf), True
                reader = None
                if type(leaf) is TensorDict:
                    values = [_read_slow(leaf, key) for key in keys]
                    if all(isinstance(v, torch.Tensor) for v in values):
                        reader = _FastReader(keys, exact, _node_names(leaf))
                slots.append(
                    TensorDictSlot(position, type(leaf), leaf.batch_size, keys, exact, reader)
                )
        layout = cls(treespec, tuple(slots), paths, outer)
        split = layout.leaves(tree)
        if split is None:  # a by-key TensorDict lacks one of the keys asked for
            return layout, None
        return layout, split

    def leaf_paths(self, arg_names: Sequence[str] = ()) -> list[str]:
        """A printable path for each flat leaf."""
        out = []
        for position, path in enumerate(self.paths):
            text = format_path(path, arg_names)
            slot = self._slot_at.get(position)
            if slot is None:
                out.append(text)
            else:
                out += [f"{text}[{format_key(key)}]" for key in slot.keys]
        return out

    def leaves(self, tree: Any) -> tuple[list, dict[int, TensorDictBase]] | None:
        """The flat leaves of ``tree`` and its TensorDicts by position, or ``None``."""
        outer, treespec = optree.tree_flatten(tree)
        if treespec != self.treespec:
            return None
        if not self.slots:
            return outer, NO_TDS
        flat: list = []
        tds: dict[int, TensorDictBase] = {}
        start = 0
        for slot in self.slots:
            flat += outer[start : slot.position]
            start = slot.position + 1
            td = outer[slot.position]
            values = slot.read(td) if isinstance(td, TensorDictBase) else None
            if values is None:
                return None
            flat += values
            tds[slot.position] = td
        flat += outer[start:]
        return flat, tds

    def loose_leaves(self, tree: Any, arg_names: Sequence[str] = ()) -> tuple[list, list[Mismatch]] | None:
        """For a message: the leaves (``MISSING`` where absent) and TensorDict-level mismatches.

        ``None`` when the containers themselves differ (see :meth:`diff`).
        """
        outer, treespec = optree.tree_flatten(tree)
        if treespec != self.treespec:
            return None
        flat: list = []
        found: list[Mismatch] = []
        for position, leaf in enumerate(outer):
            slot = self._slot_at.get(position)
            if slot is None:
                flat.append(leaf)
                continue
            text = format_path(self.paths[position], arg_names)
            if not isinstance(leaf, TensorDictBase):
                found.append(Mismatch(text, "type", f"a {slot.td_type.__name__}", describe(leaf)))
                flat += [MISSING] * len(slot.keys)
                continue
            found += _diff_td(slot, leaf, text)
            flat += [_read_slow(leaf, key) for key in slot.keys]
        return flat, found

    def diff(self, tree: Any, arg_names: Sequence[str] = ()) -> list[Mismatch]:
        """How the containers of ``tree`` differ from the captured ones."""
        paths, outer, treespec = optree.tree_flatten_with_path(tree)
        by_path = dict(zip(map(tuple, paths), outer))
        captured = {tuple(path): position for position, path in enumerate(self.paths)}
        found: list[Mismatch] = []
        for path, position in captured.items():
            text = format_path(path, arg_names)
            if path not in by_path:
                found.append(Mismatch(text, "missing", self.described[position], "nothing"))
                continue
            value, slot = by_path[path], self._slot_at.get(position)
            if slot is None and isinstance(value, TensorDictBase):
                found.append(Mismatch(text, "type", self.described[position], describe(value)))
            elif slot is not None and not isinstance(value, TensorDictBase):
                found.append(Mismatch(text, "type", f"a {slot.td_type.__name__}", describe(value)))
            elif slot is not None:
                found += _diff_td(slot, value, text)
        for path, value in by_path.items():
            if path not in captured:
                found.append(Mismatch(format_path(path, arg_names), "extra", "", describe(value)))
        if not found and treespec != self.treespec:
            found.append(
                Mismatch("inputs", "structure", _spec_text(self.treespec), _spec_text(treespec))
            )
        return found


NO_TDS: dict = {}  # a call without TensorDicts (shared, never written)


def _spec_text(treespec: Any) -> str:
    text = str(treespec)
    return text[len("PyTreeSpec(") : -1] if text.startswith("PyTreeSpec(") else text


def _expand_keys(td: TensorDictBase, keys: Sequence[Any]) -> tuple[NestedKey, ...]:
    """The leaf keys under ``keys`` (a key may name a nested TensorDict); missing keys stay."""
    out = []
    for key in map(as_key, keys):
        value = td.get(key, None)
        if isinstance(value, TensorDictBase):
            out += [key + sub for sub in _td_leaf_keys(value)]
        else:
            out.append(key)
    return tuple(sorted(set(out), key=_key_order))


def _diff_td(slot: TensorDictSlot, td: TensorDictBase, text: str) -> list[Mismatch]:
    found = []
    if type(td) is not slot.td_type:
        found.append(Mismatch(text, "type", slot.td_type.__name__, type(td).__name__))
    if td.batch_size != slot.batch_size:
        found.append(
            Mismatch(text, "batch_size", str(tuple(slot.batch_size)), str(tuple(td.batch_size)))
        )
    have = set(_td_leaf_keys(td))
    if slot.exact:
        for key in sorted(have - set(slot.keys)):
            found.append(
                Mismatch(f"{text}[{format_key(key)}]", "extra", "", describe(td.get(key)))
            )
    return found


def unflatten(layout: Layout, leaves: list, tds: dict[int, TensorDictBase]) -> Any:
    """Rebuild a tree from flat leaves, with ``tds[position]`` for each TensorDict slot."""
    if not layout.slots:
        return optree.tree_unflatten(layout.treespec, leaves)
    outer: list = []
    start = 0
    for slot in layout.slots:
        count = slot.position - len(outer)
        outer += leaves[start : start + count]
        start += count + len(slot.keys)
        outer.append(tds[slot.position])
    outer += leaves[start:]
    return optree.tree_unflatten(layout.treespec, outer)


def slot_ranges(layout: Layout) -> dict[int, range]:
    """For each TensorDict slot, the range of its leaves in the flat list."""
    ranges, offset, outer_done = {}, 0, 0
    for slot in layout.slots:
        offset += slot.position - outer_done
        ranges[slot.position] = range(offset, offset + len(slot.keys))
        offset += len(slot.keys)
        outer_done = slot.position + 1
    return ranges


def tensor_leaves(tree: Any) -> list[torch.Tensor]:
    """Every tensor in ``tree``, TensorDicts expanded by sorted key, in a fixed order."""
    out: list[torch.Tensor] = []
    for leaf in optree.tree_leaves(tree):
        if isinstance(leaf, torch.Tensor):
            out.append(leaf)
        elif isinstance(leaf, TensorDictBase):
            for key in _td_leaf_keys(leaf):
                value = leaf.get(key)
                if isinstance(value, torch.Tensor):
                    out.append(value)
    return out
