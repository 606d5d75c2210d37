"""What the function did to its inputs besides returning, replayed onto the caller's.

Eagerly, a function's writes land on the caller's objects. A replay runs on the
graph's own buffers and fresh containers, so what the capturing call did is found once
and then repeated on every call's objects:

- tensors written in place: the version counter moved, or the bytes changed (a write
  through ``.data`` moves no counter); their buffers are copied back;
- containers changed: a dict or list gained, lost or rebound entries, a TensorDict
  gained or lost keys or changed its batch size or names. Their final content is
  turned into recipes (see ``_outputs``) and applied to the caller's containers.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from ._inputs import Materialized, StaticInputs, resolve
from ._outputs import PlanBuilder, build

__all__ = ["Effects", "ContainerSnapshot"]


def _state(obj: Any) -> Any:
    if isinstance(obj, TensorDictBase):
        names = tuple(obj.names) if obj._has_names() else None
        return ("td", list(obj.items()), obj.batch_size, names)
    if isinstance(obj, dict):
        return ("dict", list(obj.items()))
    if isinstance(obj, list):
        return ("list", list(obj))
    return None  # immutable (tuples) or a tensorclass, whose TensorDict is tracked


def _same_items(a: list, b: list) -> bool:
    return len(a) == len(b) and all(ka == kb and va is vb for (ka, va), (kb, vb) in zip(a, b))


class ContainerSnapshot:
    """The content of every container handed to the function, before it ran."""

    def __init__(self, materialized: Materialized):
        self.materialized = materialized
        self.before = [(obj, _state(obj)) for obj in materialized.objects]

    def changes(self) -> list[tuple[Any, Any, Any]]:
        out = []
        for obj, before in self.before:
            if before is None:
                continue
            after = _state(obj)
            kind = before[0]
            if kind == "list":
                changed = len(before[1]) != len(after[1]) or any(a is not b for a, b in zip(before[1], after[1]))
            else:
                changed = not _same_items(before[1], after[1])
                if kind == "td":
                    changed = changed or before[2] != after[2] or before[3] != after[3]
            if changed:
                out.append((obj, before, after))
        return out


class Effects:
    """The effects of the capturing call, as operations on a later call's objects."""

    def __init__(self, written: list[int], changes: list, materialized: Materialized, builder: PlanBuilder):
        self.written = written
        self.ops: list[tuple] = []
        # (position, key, batch size): the caller's TensorDict at a slot must hold a nested
        # TensorDict of that batch size at key (None: must not hold one), for the ops to be
        # what the function would do (see Materialized.mirrors)
        self.requires: list[tuple] = []
        for obj, before, after in changes:
            ref = materialized.refs[id(obj)]
            kind = after[0]
            # a TensorDict slot itself is registered as the slot's object: its place is its root
            where = ("slot", ref[1], ()) if ref[0] == "slot_obj" and isinstance(obj, TensorDictBase) else ref
            if kind == "dict":
                keys = [k for k, _ in after[1]]
                self.ops.append(("dict", ref, keys, [builder.plan(v) for _, v in after[1]]))
            elif kind == "list":
                self.ops.append(("list", ref, [builder.plan(v) for v in after[1]]))
            else:
                old = dict(before[1])
                writes = [(name, builder.plan(value)) for name, value in after[1] if old.get(name, _ABSENT) is not value]
                kept = {name for name, _ in after[1]}
                deletes = [name for name in old if name not in kept]
                batch_size = after[2] if after[2] != before[2] else None
                names = after[3] if after[3] != before[3] else _ABSENT
                moved = _appended([name for name, _ in before[1]], [name for name, _ in after[1]])
                self.ops.append(("td", ref, writes, deletes, batch_size, names, moved))
                if where[0] == "slot" and where[1] in materialized.by_key:
                    # a TensorDict the function created under a key the module does not read:
                    # eagerly it would merge into one the caller had there
                    self.requires += [(where[1], where[2] + (name,), None) for name, value in after[1]
                                      if name not in old and isinstance(value, TensorDictBase)
                                      and id(value) not in materialized.refs]
            if where[0] == "slot":
                # writes below a nested TensorDict mirrored from the caller's: it must be there
                position, key = where[1], where[2]
                self.requires += [(position, key[:i], materialized.mirrors[(position, key[:i])][0])
                                  for i in range(1, len(key) + 1) if (position, key[:i]) in materialized.mirrors]
        self.requires = list(dict.fromkeys(self.requires))
        # a function that writes or creates nested TensorDicts in a TensorDict read by key can
        # also carry the caller's unread ones along (TensorDictSequential copies nested
        # TensorDicts into tensordict_out whole): then their layout must stay as at capture
        heads = frozenset(key[0] for _, key, _ in self.requires)  # the top-level entries concerned
        self.layouts = {position: (heads, tuple(p for p in paths if p[0] in heads))
                        for position, paths in materialized.nested.items()} if heads else {}
        self.any = bool(self.written or self.ops)

    def apply(self, inputs: StaticInputs, leaves: Any, objs: dict, tree: Any, values: list,
              memo: dict | None = None) -> None:
        if self.written:
            inputs.copy_back(leaves, self.written)
        # the objects as the call passed them, before any op moves one (a nested
        # TensorDict written into, then deleted from its parent)
        targets = [resolve(op[1], tree, objs) for op in self.ops]
        for op, target in zip(self.ops, targets):
            kind = op[0]
            if kind == "td":
                _, _, writes, deletes, batch_size, names, moved = op
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
            elif kind == "dict":
                _, _, keys, recipes = op
                items = [build(r, values, leaves, objs, tree, memo) for r in recipes]
                target.clear()
                target.update(zip(keys, items))
            else:
                target[:] = [build(r, values, leaves, objs, tree, memo) for r in op[2]]


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
