"""TensorDict slots: a TensorDict (or tensorclass) among a call's leaves, read by key.

A slot is read as captured (a tensorclass held in a TensorDict is a nested level, read
through its own TensorDict, as tensordict's ``keys(include_nested=True)`` lists its fields):

- exact (an argument of a plain function): the same keys in the same order and the
  same batch size at every nested level;
- by key (the input of a TensorDict module, ``tensordict_out``): the keys the module
  reads must be there and other keys are ignored; a key naming a sub-TensorDict reads
  that sub-TensorDict exactly.

A slot's structure is a tree of :class:`Node` built once, at capture; :attr:`Slot.read`, the
reader chosen then, runs at every call (the hot path). Messages about mismatches are
written by ``_explain``, never here.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from tensordict import LazyStackedTensorDict, NonTensorData, TensorDict, TensorDictBase, is_tensorclass

from ._paths import NestedKey

MISSING = object()  # a key absent from a TensorDict


def _is_non_tensor(value: Any) -> bool:
    return bool(getattr(type(value), "_is_non_tensor", False))


def _is_node(value: Any) -> bool:
    return isinstance(value, TensorDictBase) and not _is_non_tensor(value)


def node_td(value: Any) -> TensorDictBase | None:
    """The TensorDict a nested entry is read as: a TensorDict, or a tensorclass's own;
    ``None`` for a leaf."""
    if _is_node(value):
        return value
    if is_tensorclass(value) and not _is_non_tensor(value):
        return value._tensordict
    return None


def child_td(child: "Node", value: Any) -> TensorDictBase | None:
    """``value`` read as the nested level ``child`` was captured as (a TensorDict, or a
    tensorclass of the captured class and non-tensor fields); ``None`` where it is not one."""
    if child.tc is None:
        return value if _is_node(value) else None
    if type(value) is not child.tc or dict(value._non_tensordict) != child.tc_extra:
        return None
    return value._tensordict


class Node:
    """One TensorDict level of a slot, as captured.

    ``entries`` lists ``(name, child)`` in the captured order, where ``child`` is the
    index of a leaf in the slot or a nested :class:`Node`. ``exact`` nodes must hold
    exactly these names, in this order.
    """

    __slots__ = ("cls", "batch_size", "names", "device", "entries", "keys", "exact", "flat", "dense", "tc", "tc_extra")

    def __init__(self, td: TensorDictBase, entries: list, exact: bool, tc: Any = None):
        # a tensorclass held in a TensorDict: its class and non-tensor fields (``td`` is its own TensorDict)
        self.tc = type(tc) if tc is not None else None
        self.tc_extra = dict(tc._non_tensordict) if tc is not None else None
        self.cls = type(td)
        self.batch_size = td.batch_size
        self.names = tuple(td.names) if td._has_names() else None
        self.device = td.device
        self.entries = tuple(entries)
        self.keys = tuple(name for name, _ in entries)
        self.exact = exact
        self.flat = all(type(child) is int for _, child in entries)
        self.dense = type(td) is TensorDict and tc is None and all(
            type(child) is int or child.dense for _, child in entries
        )

    def leaf_keys(self, prefix: NestedKey = ()) -> list[NestedKey]:
        out = []
        for name, child in self.entries:
            if type(child) is int:
                out.append(prefix + (name,))
            else:
                out += child.leaf_keys(prefix + (name,))
        return out


class Unreadable(Exception):
    """An entry a TensorDict cannot hand out whole: a lazily stacked TensorDict's tensors of
    several shapes under one key (a graph's buffer has one shape)."""

    def __init__(self, key: NestedKey, shapes: list):
        super().__init__(key, shapes)
        self.key, self.shapes = key, shapes


def _get(td: TensorDictBase, name: str, key: NestedKey) -> Any:
    """``td``'s entry ``name``, at ``key`` in its slot; raises :class:`Unreadable`."""
    try:
        return td.get(name)
    except RuntimeError as err:
        if not isinstance(td, LazyStackedTensorDict):
            raise
        try:
            shapes = [tuple(t.shape) for t in td.get(name, as_list=True)]
        except Exception:  # noqa: BLE001 - the shapes are for the message only
            shapes = []
        raise Unreadable(key, shapes) from err


def nested_entries(td: TensorDictBase) -> list[tuple[str, Any]]:
    """``(name, value)`` of ``td``'s nested levels (TensorDicts, tensorclasses); an entry that
    cannot be read whole (tensors of several shapes in a lazy stack) is a leaf, skipped."""
    out = []
    for name in td.keys():
        try:
            value = td.get(name)
        except RuntimeError:
            continue
        if node_td(value) is not None:
            out.append((name, value))
    return out


def _build_node(td: TensorDictBase, want: dict | None, counter: list, leaves: list, tc: Any = None,
                prefix: NestedKey = ()) -> Node:
    """The node of ``td`` (of tensorclass ``tc``'s, if given); ``want`` maps names to sub-wants
    (``None``: everything, exactly)."""
    entries = []
    names = td.keys() if want is None else [n for n in td.keys() if n in want]
    for name in names:
        value = _get(td, name, prefix + (name,))
        sub_want = None if want is None else want[name]
        inner = node_td(value)
        if inner is not None:
            entries.append((name, _build_node(inner, sub_want, counter, leaves, value if inner is not value else None,
                                              prefix + (name,))))
        else:
            entries.append((name, counter[0]))
            counter[0] += 1
            leaves.append(td[name] if _is_non_tensor(value) else value)
    return Node(td, entries, exact=want is None, tc=tc)


def _key_tree(keys: list[NestedKey]) -> dict:
    """``[("a", "b"), ("c",)]`` → ``{"a": {"b": None}, "c": None}`` (``None``: read all of it)."""
    tree: dict = {}
    for key in keys:
        node = tree
        for part in key[:-1]:
            child = node.setdefault(part, {})
            if child is None:  # an ancestor is read whole already
                break
            node = child
        else:
            node[key[-1]] = None
    return tree


def _missing(td: TensorDictBase, want: dict, prefix: NestedKey = ()) -> list[NestedKey]:
    out = []
    for name, sub in want.items():
        value = _get(td, name, prefix + (name,)) if name in td.keys() else MISSING
        if value is MISSING:
            out.append(prefix + (name,))
        elif sub is not None:
            inner = node_td(value)
            out += _missing(inner, sub, prefix + (name,)) if inner is not None else [prefix + (name,)]
    return out


class Slot:
    """A TensorDict (or tensorclass) among the call's optree leaves, and how to read it."""

    def __init__(self, position: int, path: tuple, obj: Any, keys: list[NestedKey] | None):
        self.position = position
        self.path = path
        self.cls = type(obj)
        self.is_tc = is_tensorclass(obj)
        td = obj._tensordict if self.is_tc else obj
        self.tc_extra = dict(obj._non_tensordict) if self.is_tc else None
        self.exact = keys is None
        # keys the module names but the TensorDict lacks at capture are not read (a module
        # that needs one fails eagerly, as it would without the wrapper)
        self.unread = [] if keys is None else _missing(td, _key_tree(keys))
        keys = None if keys is None else [k for k in keys if not any(k[: len(u)] == u for u in self.unread)]
        self.want = None if keys is None else _key_tree(keys)
        leaves: list = []
        self.root = _build_node(td, self.want, [0], leaves)
        self.captured = leaves
        self.keys = tuple(self.root.leaf_keys())
        self.has_non_tensor = any(not isinstance(v, torch.Tensor) for v in leaves)
        self.batch_size = td.batch_size
        # a function may branch on it (``td.is_locked``) or write: a locked one raises eagerly
        self.locked = td.is_locked
        fast = self.root.dense and not self.has_non_tensor and not self.is_tc
        # a TensorDict module's usual slot: top-level keys only (no nested TensorDict read)
        flat = fast and self.root.flat
        self.read: Callable[[Any], list | None] = (self._read_flat if flat else self._read_fast) if fast \
            else self._read_general

    # -- readers: a list of leaves, or None when the value does not fit ------------------
    def _read_fast(self, td: Any) -> list | None:
        if type(td) is not TensorDict:
            return None if self.exact else self._read_general(td)
        # (a TensorDict's own fields: its properties are a frame each, at every call)
        if td._batch_size != self.batch_size or td._is_locked != self.locked:
            return None
        out: list = []
        try:
            ok = _read_dense(self.root, td, out, top=True)
        except KeyError:
            return None
        return out if ok else None

    def _read_flat(self, td: Any) -> list | None:
        """``_read_fast`` where every key read is at the top level: the values in one pass."""
        if type(td) is not TensorDict:
            return None if self.exact else self._read_general(td)
        if td._batch_size != self.batch_size or td._is_locked != self.locked:
            return None
        d, root = td._tensordict, self.root
        if root.exact:
            return list(d.values()) if tuple(d) == root.keys else None
        try:
            return list(map(d.__getitem__, root.keys))
        except KeyError:
            return None

    def _read_general(self, obj: Any) -> list | None:
        if type(obj) is not self.cls and (self.exact or self.is_tc or not isinstance(obj, TensorDictBase)):
            return None
        if self.is_tc:
            if dict(obj._non_tensordict) != self.tc_extra:
                return None
            obj = obj._tensordict
        if obj.batch_size != self.batch_size or obj.is_locked != self.locked:
            return None
        out: list = []
        try:
            ok = _read_any(self.root, obj, out)
        except (KeyError, RuntimeError):  # a missing key, or an entry that cannot be read
            return None
        return out if ok else None

    def td_of(self, obj: Any) -> TensorDictBase:
        return obj._tensordict if self.is_tc else obj


def _read_dense(node: Node, td: TensorDict, out: list, top: bool = False) -> bool:
    if not top and td._batch_size != node.batch_size:
        return False
    d = td._tensordict
    if node.exact:
        if tuple(d) != node.keys:
            return False
        if node.flat:
            out.extend(d.values())
            return True
        values = d.values()
    else:
        values = map(d.__getitem__, node.keys)  # (a missing key raises KeyError: not this layout)
    for (_, child), value in zip(node.entries, values):
        if type(child) is int:
            out.append(value)
        elif type(value) is not TensorDict or not _read_dense(child, value, out):
            return False
    return True


def _read_any(node: Node, td: TensorDictBase, out: list) -> bool:
    if node.exact and tuple(td.keys()) != node.keys:
        return False
    for name, child in node.entries:
        value = td.get(name, MISSING)
        if value is MISSING:
            return False
        if type(child) is int:
            out.append(td[name] if _is_non_tensor(value) else value)
            continue
        inner = child_td(child, value)
        if inner is None or inner.batch_size != child.batch_size or not _read_any(child, inner, out):
            return False
    return True


def build_td(node: Node, values: list) -> TensorDict:
    """A new dense TensorDict of ``node``'s structure over ``values`` (indexed by leaf)."""
    source = {}
    for name, child in node.entries:
        if type(child) is not int:
            inner = build_td(child, values)
            source[name] = inner if child.tc is None else child.tc._from_tensordict(inner, non_tensordict=dict(
                child.tc_extra))
        elif isinstance(values[child], torch.Tensor):
            source[name] = values[child]
        else:  # a non-tensor entry, handed to the function as tensordict stores it
            source[name] = NonTensorData(data=values[child], batch_size=node.batch_size, device=node.device)
    td = TensorDict._new_unsafe(source=source, batch_size=node.batch_size, device=node.device)
    if node.names is not None:
        td.names = list(node.names)
    return td
