"""The graph's static buffers: inputs the replay copies into, outputs it hands back.

``StaticInputs`` holds clones of the capturing call's leaves; every replay copies
the new leaves into them with one ``torch._foreach_copy_`` (a leaf that *is* the
buffer is skipped). ``Effects`` replays what the function did to its inputs
besides returning: in-place writes to input tensors, keys written into or deleted
from input TensorDicts. ``OutputPlan`` turns the graph's output buffers into the
call's result: clones by default, the buffers themselves in zero-copy mode, and
the caller's own objects where the function returned one of its inputs.
"""

from __future__ import annotations

import operator
from typing import Any

import optree
import torch
from tensordict import TensorDict, TensorDictBase

from ._tree import Layout, NestedKey, leaf_keys, raw_node, slot_ranges, unflatten

__all__ = ["Effects", "OutputPlan", "StaticInputs"]

Tensor = torch.Tensor


class StaticInputs:
    """Clones of the capturing call's leaves, which the graph reads at every replay."""

    def __init__(self, layout: Layout, leaves: list, td_devices: dict[int, Any]):
        self.layout = layout
        with torch.no_grad():
            self.leaves = [leaf.clone() if isinstance(leaf, Tensor) else leaf for leaf in leaves]
        self.tensor_index = [i for i, leaf in enumerate(self.leaves) if isinstance(leaf, Tensor)]
        self.tensors = [self.leaves[i] for i in self.tensor_index]
        self.all_tensors = len(self.tensors) == len(self.leaves)
        self.ranges = slot_ranges(layout)
        # One dense TensorDict per TensorDict input, over the buffers; never handed to
        # the function itself (see materialize), so its entries stay the input buffers.
        self.tds: dict[int, TensorDict] = {}
        for slot in layout.slots:
            td = TensorDict(batch_size=slot.batch_size, device=td_devices.get(slot.position))
            for key, index in zip(slot.keys, self.ranges[slot.position]):
                td.set(key, self.leaves[index])
            self.tds[slot.position] = td

    def materialize(self) -> tuple[Any, dict[int, TensorDictBase]]:
        """The input tree over the buffers, with fresh containers, and its TensorDicts."""
        passed = {position: td.copy() for position, td in self.tds.items()}
        return unflatten(self.layout, self.leaves, passed), passed

    def copy_from(self, leaves: list) -> None:
        """Copy a call's tensor leaves into the buffers (one foreach launch)."""
        if self.all_tensors:
            sources = leaves
        else:
            sources = [leaves[i] for i in self.tensor_index]
        dests = self.tensors
        if any(map(operator.is_, sources, dests)):  # producers may write into the buffers directly
            pairs = [(d, s) for d, s in zip(dests, sources) if d is not s]
            if not pairs:
                return
            dests, sources = [d for d, _ in pairs], [s for _, s in pairs]
        torch._foreach_copy_(dests, sources)

    def versions(self) -> list[int]:
        return [t._version for t in self.tensors]


class Effects:
    """What the function did to its inputs, replayed onto the caller's inputs.

    Found once, at capture: tensors whose version counter moved were written in
    place; TensorDict keys bound to new values were written; keys that vanished
    were deleted. Eager code has these effects on the caller's objects, so the
    replay copies them back.
    """

    def __init__(self, inputs: StaticInputs, versions_before: list[int], passed: dict[int, TensorDictBase]):
        after = inputs.versions()
        self.mutated = [
            inputs.tensor_index[j]
            for j, (v0, v1) in enumerate(zip(versions_before, after))
            if v0 != v1
        ]
        self.mutated_buffers = [inputs.leaves[i] for i in self.mutated]
        # per TensorDict input: [(key, buffer written)], [deleted keys]
        self.td_writes: dict[int, list[tuple[NestedKey, Any]]] = {}
        self.td_deletes: dict[int, list[NestedKey]] = {}
        for position, td in passed.items():
            original = inputs.tds[position]
            writes = []
            after_keys = leaf_keys(td)
            for key in after_keys:
                value = td.get(key)
                if original.get(key, None) is not value:
                    writes.append((key, value.detach() if isinstance(value, Tensor) else value))
            kept = set(after_keys)
            deletes = [k for k in leaf_keys(original) if k not in kept]
            if writes:
                self.td_writes[position] = writes
            if deletes:
                self.td_deletes[position] = deletes
        self.any = bool(self.mutated or self.td_writes or self.td_deletes)

    def apply(self, leaves: list, caller_tds: dict[int, TensorDictBase], clone: bool) -> None:
        if self.mutated:
            pairs = [(leaves[i], b) for i, b in zip(self.mutated, self.mutated_buffers) if leaves[i] is not b]
            if pairs:
                torch._foreach_copy_([c for c, _ in pairs], [b for _, b in pairs])
        for position, writes in self.td_writes.items():
            td = caller_tds[position]
            raw = type(td) is TensorDict and not td.is_locked
            for key, value in writes:
                if clone and isinstance(value, (Tensor, TensorDictBase)):
                    value = value.clone()
                if not (raw and isinstance(value, Tensor) and _set_raw(td, key, value)):
                    td.set(key, value)
        for position, deletes in self.td_deletes.items():
            td = caller_tds[position]
            for key in deletes:
                if key in td.keys(include_nested=True):
                    td.del_(key)


def _set_raw(td: TensorDict, key: NestedKey, value: Tensor) -> bool:
    """``td.set(key, value)`` for a value known to fit (same shape, device and batch size as
    at capture), straight into the nested dicts; ``False`` where a parent is missing."""
    try:
        node = raw_node(td, key[:-1])
    except (KeyError, AttributeError):
        return False
    node[key[-1]] = value
    return True


# kinds of output leaves
_CLONE, _INPUT, _INPUT_TD, _CONST = range(4)


class OutputPlan:
    """How the graph's outputs become a call's result."""

    def __init__(self, out: Any, inputs: StaticInputs, passed: dict[int, TensorDictBase], clone: bool):
        leaves, self.treespec = optree.tree_flatten(out)
        buffer_index = {id(buf): i for i, buf in enumerate(inputs.leaves) if isinstance(buf, Tensor)}
        passed_position = {id(td): position for position, td in passed.items()}
        self.plan: list[tuple[int, Any]] = []
        for leaf in leaves:
            if isinstance(leaf, Tensor):
                if id(leaf) in buffer_index:
                    self.plan.append((_INPUT, buffer_index[id(leaf)]))
                else:
                    self.plan.append((_CLONE, leaf.detach()))
            elif isinstance(leaf, TensorDictBase):
                if id(leaf) in passed_position:
                    self.plan.append((_INPUT_TD, passed_position[id(leaf)]))
                else:
                    self.plan.append((_CLONE, leaf.detach()))
            else:
                self.plan.append((_CONST, leaf))
        self.clone = clone
        self.static = [value for kind, value in self.plan if kind == _CLONE]
        # the common case: every output is a buffer to hand back
        self.all_buffers = len(self.static) == len(self.plan)
        self.single = self.all_buffers and len(self.plan) == 1 and self.treespec.num_nodes == 1
        # the function returned its input TensorDict, and nothing else
        self.lone_input_td = (
            self.plan[0][1] if len(self.plan) == 1 and self.plan[0][0] == _INPUT_TD
            and self.treespec.num_nodes == 1 else None
        )

    def build(self, leaves: list, caller_tds: dict[int, TensorDictBase]) -> Any:
        clone = self.clone
        if self.lone_input_td is not None:
            return caller_tds[self.lone_input_td]
        if self.single:
            value = self.static[0]
            return value.clone() if clone else value
        if self.all_buffers:
            values = [v.clone() for v in self.static] if clone else list(self.static)
            return optree.tree_unflatten(self.treespec, values)
        values = []
        for kind, value in self.plan:
            if kind == _CLONE:
                values.append(value.clone() if clone else value)
            elif kind == _INPUT:
                values.append(leaves[value])
            elif kind == _INPUT_TD:
                values.append(caller_tds[value])
            else:
                values.append(value)
        return optree.tree_unflatten(self.treespec, values)
