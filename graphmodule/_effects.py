"""What the function did to its inputs besides returning, replayed onto the caller's.

Eagerly, a function's writes land on the caller's objects. A replay runs on the
graph's own buffers and fresh containers, so what the capturing call did is found once
and then repeated on every call's objects:

- tensors written in place: the version counter moved, or the bytes changed (a write
  through ``.data`` moves no counter); their buffers are copied back;
- containers changed: a dict or list gained, lost or rebound entries, a TensorDict
  gained or lost keys or changed its batch size or names. Their final content is
  turned into recipes (see ``_outputs``) and applied to the caller's containers;
- objects outside the call rebound (``_rebind``): a tensor's ``.grad``, a module's or
  object's attribute: bound again after each replay, to this call's values.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch
from tensordict import TensorDict, TensorDictBase

from ._inputs import StaticInputs
from ._materialized import SLOT, SLOT_OBJ, Materialized, Outside, Ref, resolve
from ._outputs import PlanBuilder
from ._recipes import build, collect

__all__ = ["AttrOp", "ContainerSnapshot", "DictOp", "Effects", "GradOp", "ListOp", "OpKind", "Requirement",
           "TensorDictOp", "collect_call"]


class OpKind(enum.Enum):
    """The kind of container an effect operation (or a snapshot of its content) is about."""

    TD = "a TensorDict: entries written, deleted or moved, batch size, names"
    DICT = "a dict: its final items"
    LIST = "a list: its final items"
    GRAD = "a tensor outside the call: its .grad rebound"
    ATTR = "a dict outside the call (a module's __dict__ or _buffers, an object's): an entry rebound"


TD, DICT, LIST = OpKind.TD, OpKind.DICT, OpKind.LIST  # (read without the class: faster)
GRAD, ATTR = OpKind.GRAD, OpKind.ATTR


@dataclass(frozen=True, slots=True, eq=False)  # (read at every call: as fast as a tuple)
class TensorDictOp:
    """A TensorDict of the call changed: its writes, deletions, batch size, names, order."""

    target: Ref
    writes: list  # (name, recipe)
    deletes: list  # names
    batch_size: Any  # the new one, or None if unchanged
    names: Any  # the new dim names, or _ABSENT if unchanged
    moved: list  # names deleted and set again (they come last, in this order)
    kind: ClassVar[OpKind] = TD


@dataclass(frozen=True, slots=True, eq=False)
class DictOp:
    """A dict of the call changed: its content after the call."""

    target: Ref
    keys: list
    values: list  # recipes
    kind: ClassVar[OpKind] = DICT


@dataclass(frozen=True, slots=True, eq=False)
class ListOp:
    """A list of the call changed: its content after the call."""

    target: Ref
    items: list  # recipes
    kind: ClassVar[OpKind] = LIST


@dataclass(frozen=True, slots=True, eq=False)
class GradOp:
    """The function rebound the ``.grad`` of tensors (``zero_grad()``, then its backward): to
    tensors of the graph's, lent or copied per call as results are, or to ``None``. One op
    for all of them (a loop, not an op per parameter)."""

    target: Outside  # the tensors (a tuple)
    values: list  # a recipe per tensor
    labels: list  # a place per tensor, for messages
    # the graph outputs they are bound to, where each is one (a lender may keep them bound: see apply)
    graph_index: frozenset[int] | None = None
    kind: ClassVar[OpKind] = GRAD


@dataclass(frozen=True, slots=True, eq=False)
class AttrOp:
    """The function rebound an attribute (``self.last_loss = loss.detach()``): the entry
    ``name`` of an object's ``__dict__`` or a module's ``_buffers``."""

    target: Outside  # the dict
    name: str
    value: Any  # recipe
    label: str
    kind: ClassVar[OpKind] = ATTR


class Requirement(NamedTuple):
    """For the effects to be the function's: the caller's TensorDict at slot ``position``
    holds a nested TensorDict of ``batch_size`` at ``key`` (``batch_size`` None: holds none)."""

    position: int
    key: tuple
    batch_size: Any


class Contents(NamedTuple):
    """What a container held at one moment (items, and a TensorDict's batch size and names)."""

    kind: OpKind
    items: list  # (key, value) pairs for TD and DICT, values for LIST
    batch_size: Any = None
    names: tuple | None = None


def _contents(obj: Any) -> Contents | None:
    if isinstance(obj, TensorDictBase):
        names = tuple(obj.names) if obj._has_names() else None
        return Contents(TD, list(obj.items()), obj.batch_size, names)
    if isinstance(obj, dict):
        return Contents(DICT, list(obj.items()))
    if isinstance(obj, list):
        return Contents(LIST, list(obj))
    return None  # immutable (tuples) or a tensorclass, whose TensorDict is tracked


def _same_items(a: list, b: list) -> bool:
    return len(a) == len(b) and all(ka == kb and va is vb for (ka, va), (kb, vb) in zip(a, b))


class ContainerSnapshot:
    """The content of every container handed to the function, before it ran."""

    def __init__(self, materialized: Materialized):
        self.materialized = materialized
        self.before = [(obj, _contents(obj)) for obj in materialized.objects]

    def changes(self) -> list[tuple[Any, Contents, Contents]]:
        """``(object, before, after)`` of each container the function changed."""
        out = []
        for obj, before in self.before:
            if before is None:
                continue
            after = _contents(obj)
            if before.kind is LIST:
                changed = len(before.items) != len(after.items) or any(
                    a is not b for a, b in zip(before.items, after.items))
            else:
                changed = not _same_items(before.items, after.items)
                if before.kind is TD:
                    changed = changed or before.batch_size != after.batch_size or before.names != after.names
            if changed:
                out.append((obj, before, after))
        return out


class Effects:
    """The effects of the capturing call, as operations on a later call's objects."""

    def __init__(self, written: list[int], changes: list, materialized: Materialized, builder: PlanBuilder):
        self.written = written
        self.ops: list[TensorDictOp | DictOp | ListOp] = []
        # the caller's TensorDicts must hold (or not hold) nested TensorDicts where the
        # function found them, for the ops to be what the function would do (see
        # Materialized.mirrors)
        self.requires: list[Requirement] = []
        for obj, before, after in changes:
            ref = materialized.refs[id(obj)]
            # a TensorDict slot itself is registered as the slot's object: its place is its root
            where = Ref.slot(ref.position) if ref.kind is SLOT_OBJ and isinstance(obj, TensorDictBase) else ref
            if after.kind is DICT:
                keys = [k for k, _ in after.items]
                self.ops.append(DictOp(ref, keys, [builder.plan(v) for _, v in after.items]))
            elif after.kind is LIST:
                self.ops.append(ListOp(ref, [builder.plan(v) for v in after.items]))
            else:
                old = dict(before.items)
                writes = [(name, builder.plan(value)) for name, value in after.items
                          if old.get(name, _ABSENT) is not value]
                kept = {name for name, _ in after.items}
                deletes = [name for name in old if name not in kept]
                batch_size = after.batch_size if after.batch_size != before.batch_size else None
                names = after.names if after.names != before.names else _ABSENT
                moved = _appended([name for name, _ in before.items], [name for name, _ in after.items])
                self.ops.append(TensorDictOp(ref, writes, deletes, batch_size, names, moved))
                if where.kind is SLOT and where.position in materialized.by_key:
                    # a TensorDict the function created under a key the module does not read:
                    # eagerly it would merge into one the caller had there
                    self.requires += [Requirement(where.position, where.path + (name,), None)
                                      for name, value in after.items
                                      if name not in old and isinstance(value, TensorDictBase)
                                      and id(value) not in materialized.refs]
            if where.kind is SLOT:
                # writes below a nested TensorDict mirrored from the caller's: it must be there
                position, key = where.position, where.path
                self.requires += [Requirement(position, key[:i], materialized.mirrors[(position, key[:i])].batch_size)
                                  for i in range(1, len(key) + 1) if (position, key[:i]) in materialized.mirrors]
        self.requires = list(dict.fromkeys(self.requires))
        # a function that writes or creates nested TensorDicts in a TensorDict read by key can
        # also carry the caller's unread ones along (TensorDictSequential copies nested
        # TensorDicts into tensordict_out whole): then their layout must stay as at capture
        heads = frozenset(r.key[0] for r in self.requires)  # the top-level entries concerned
        self.layouts = {position: (heads, tuple(p for p in paths if p[0] in heads))
                        for position, paths in materialized.nested.items()} if heads else {}
        self.any = bool(self.written or self.ops)

    def rebind(self, ops: list[GradOp | AttrOp]) -> None:
        """Add the rebinding of objects outside the call (after the containers' ops)."""
        self.ops += ops
        self.any = bool(self.written or self.ops)

    def apply(self, inputs: StaticInputs, leaves: Any, objs: dict, tree: Any, values: list,
              memo: dict | None = None, kept: frozenset[int] = frozenset()) -> None:
        """The call's effects, from this call's ``values`` (``kept``: the graph outputs whose
        values are the ``.grad`` still bound from the last call, see ``_lend.DroppingLender``)."""
        if self.written:
            inputs.copy_back(leaves, self.written)
        # the objects as the call passed them, before any op moves one (a nested
        # TensorDict written into, then deleted from its parent)
        targets = [resolve(op.target, tree, objs) for op in self.ops]
        for op, target in zip(self.ops, targets):
            kind = op.kind
            if kind is TD:
                writes, deletes, batch_size, names, moved = op.writes, op.deletes, op.batch_size, op.names, op.moved
                if deletes:
                    for name in deletes:
                        if name in target.keys():
                            del target[name]
                raw = type(target) is TensorDict and not target.is_locked
                # a dense TensorDict takes the writes unchecked, then the new batch size (as
                # the function may have written entries of that size first); others check
                # each write against the batch size, so it comes first
                if batch_size is not None and not raw:
                    target.batch_size = batch_size
                for name, recipe in writes:
                    value = build(recipe, values, leaves, objs, tree, memo)
                    if raw and isinstance(value, (torch.Tensor, TensorDictBase)):
                        target._tensordict[name] = value  # as the function left it, batch size too
                    else:
                        target.set(name, value)
                if batch_size is not None and raw:
                    target.batch_size = batch_size
                for name in moved:  # deleted and set again, and what came after: last, in order
                    if raw:
                        target._tensordict[name] = target._tensordict.pop(name)
                    elif name in target.keys():
                        value = target.get(name)
                        del target[name]
                        target.set(name, value)
                if names is not _ABSENT:
                    target.names = list(names) if names is not None else None
            elif kind is GRAD:
                if kept and op.graph_index is not None and op.graph_index <= kept:
                    continue  # (every .grad still bound to the value it gets)
                for t, recipe in zip(target, op.values):
                    value = build(recipe, values, leaves, objs, tree, memo)
                    if t.grad is not value:  # (a .grad kept bound from the last call, see DroppingLender)
                        t.grad = value
            elif kind is ATTR:
                target[op.name] = build(op.value, values, leaves, objs, tree, memo)
            elif kind is DICT:
                items = [build(r, values, leaves, objs, tree, memo) for r in op.values]
                target.clear()
                target.update(zip(op.keys, items))
            else:
                target[:] = [build(r, values, leaves, objs, tree, memo) for r in op.items]


_ABSENT = object()


def _appended(before: list, after: list) -> list:
    """The keys of ``after`` that a dict would hold last: new, or deleted and set again.

    Keys never deleted keep their order and come first; what follows the longest such
    prefix was (re)inserted during the call.
    """
    position = {name: i for i, name in enumerate(before)}
    last, n = -1, 0
    for name in after:
        i = position.get(name)
        if i is None or i < last:
            break
        last, n = i, n + 1
    return after[n:] if any(name in position for name in after[n:]) else []


def collect_call(out_recipe: Any, ops: list, out: Any, targets: list, found: dict[int, Any]) -> None:
    """The fresh tensors at the graph-output places of a run of the function: in what it
    returned (``out``), in the containers its effects (``ops``) write (``targets``, as
    handed to it), and what it bound outside the call (``targets``: the tensors whose
    ``.grad``, the dict whose entry, it rebinds): what a twin copies out (``_twin``)."""
    collect(out_recipe, out, found)
    for op, target in zip(ops, targets):
        if op.kind is TD:
            for name, recipe in op.writes:
                collect(recipe, target.get(name), found)
        elif op.kind is GRAD:
            for t, recipe in zip(target, op.values):
                collect(recipe, t.grad, found)
        elif op.kind is ATTR:
            collect(op.value, target[op.name], found)
        elif op.kind is DICT:
            for key, recipe in zip(op.keys, op.values):
                collect(recipe, target[key], found)
        else:
            for value, recipe in zip(target, op.items):
                collect(recipe, value, found)
