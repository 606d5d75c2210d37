"""``InputSpec``: what a graph was captured with, and the check every replay runs.

Built once at capture. ``check()`` is the replay's fast path: one optree flatten,
one C++ comparison of every tensor's shape, dtype, device and requires_grad
(dynamo's ``TensorGuards``, where this torch has it) and a tuple comparison of the
non-tensor constants. Only when that fails is the tree walked again to write the
message, which lists every mismatch of the call at once.

Strides are not compared: ``copy_`` writes any layout into the captured buffer.
"""

from __future__ import annotations

from typing import Any, Sequence

import optree
import torch
from tensordict import TensorDictBase

from ._errors import InputMismatchError, Mismatch, RequiresGradError
from ._tree import MISSING, NO_TDS, Layout, describe

try:  # dynamo's C++ tensor check; optional, the Python comparison is the reference
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:  # pragma: no cover - depends on the torch build
    _TensorGuards = None

__all__ = ["InputSpec", "refuse_requires_grad"]

Tensor = torch.Tensor


def _facts(t: Tensor) -> tuple:
    return (t.shape, t.dtype, t.device, t.requires_grad)


def _same_constant(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b)
    except Exception:  # an object whose == is not a truth value (e.g. an array)
        return False


def refuse_requires_grad(owner: str, leaves: Sequence[Any], paths: Sequence[str]) -> None:
    """Raise :class:`RequiresGradError` naming every input that requires grad."""
    found = [
        Mismatch(path, "requires_grad", "False", "True")
        for leaf, path in zip(leaves, paths)
        if isinstance(leaf, Tensor) and leaf.requires_grad
    ]
    if found:
        raise RequiresGradError(owner, found)


class InputSpec:
    """The captured inputs: their layout, tensor facts and constants.

    Args:
        owner: how messages name the wrapper, e.g. ``"CudaGraphModule(policy)"``.
        layout: the captured :class:`~graphmodule._tree.Layout`.
        leaves: the captured flat leaves.
        arg_names: names of positional arguments for messages.
    """

    def __init__(self, owner: str, layout: Layout, leaves: Sequence[Any], arg_names: Sequence[str] = ()):
        self.owner = owner
        self.layout = layout
        self.arg_names = tuple(arg_names)
        self.tensor_index = tuple(i for i, leaf in enumerate(leaves) if isinstance(leaf, Tensor))
        self.const_index = tuple(i for i, leaf in enumerate(leaves) if not isinstance(leaf, Tensor))
        self.facts = tuple(_facts(leaves[i]) for i in self.tensor_index)
        self.constants = tuple(leaves[i] for i in self.const_index)
        self.all_tensors = not self.const_index
        # captured with positional tensors only (no containers, no kwargs): the fast path
        flat_positional = optree.tree_structure((tuple(range(len(leaves))), {}))
        self.n_positional_tensors = (
            len(leaves)
            if self.all_tensors and not layout.slots and layout.treespec == flat_positional
            else -1
        )
        # captured with one TensorDict as the only argument (a TensorDict module's call)
        self.lone_slot = (
            layout.slots[0]
            if self.all_tensors and len(layout.slots) == 1
            and layout.treespec == optree.tree_structure(((0,), {}))
            else None
        )
        self._guard = self._make_guard([leaves[i] for i in self.tensor_index])

    @staticmethod
    def _make_guard(tensors: list[Tensor]):
        if _TensorGuards is None or not tensors:
            return None
        try:
            dynamic = [[None] * t.dim() for t in tensors]
            guard = _TensorGuards(*tensors, dynamic_dims_sizes=None, dynamic_dims_strides=dynamic)
            if guard.check(*tensors):
                return guard
        except Exception:  # a private API: any surprise means the Python path
            pass
        return None

    # -- the fast path ---------------------------------------------------------------
    def split(self, args: tuple, kwargs: dict) -> tuple[Any, dict]:
        """The call's leaves and TensorDicts if they match the capture; else raise."""
        if self.n_positional_tensors == len(args) and not kwargs:
            # positional tensors only, as captured: the arguments are the leaves (no
            # flatten); a non-tensor among them fails the tensor check below
            if self.matches(args):
                return args, NO_TDS
        elif self.lone_slot is not None and len(args) == 1 and not kwargs:
            # one TensorDict, as captured: read its leaves without flattening the call
            td = args[0]
            leaves = self.lone_slot.read(td) if isinstance(td, TensorDictBase) else None
            if leaves is not None and self.matches(leaves):
                return leaves, {0: td}
        else:
            split = self.layout.leaves((args, kwargs))
            if split is not None and self.matches(split[0]):
                return split
        return self.raise_mismatch((args, kwargs))

    def matches(self, leaves: list) -> bool:
        if self.all_tensors:
            tensors = leaves
        else:
            tensors = [leaves[i] for i in self.tensor_index]
            consts = tuple(leaves[i] for i in self.const_index)
            if not all(map(_same_constant, consts, self.constants)):
                return False
        guard = self._guard
        if guard is not None:
            try:
                if guard.check(*tensors):
                    return True
            except TypeError:  # a non-tensor where a tensor was captured
                return False
            # The guard also compares dispatch keys (e.g. inference-mode tensors):
            # decide with the comparison that defines a match.
        try:
            return all(_facts(t) == f for t, f in zip(tensors, self.facts))
        except AttributeError:
            return False

    # -- the slow path: only after a mismatch ----------------------------------------
    def mismatches(self, tree: Any) -> list[Mismatch]:
        """Every difference between ``tree`` and the capture, in input order."""
        loose = self.layout.loose_leaves(tree, self.arg_names)
        if loose is None:
            return self.layout.diff(tree, self.arg_names)
        leaves, found = loose
        paths = self.layout.leaf_paths(self.arg_names)
        facts = dict(zip(self.tensor_index, self.facts))
        constants = dict(zip(self.const_index, self.constants))
        for i, (leaf, path) in enumerate(zip(leaves, paths)):
            if leaf is MISSING:
                expected = _describe_facts(facts[i]) if i in facts else describe(constants[i])
                found.append(Mismatch(path, "missing", expected, "nothing"))
            elif i in facts:
                found += _tensor_mismatches(path, facts[i], leaf)
            elif not _same_constant(leaf, constants[i]):
                kind = "type" if isinstance(leaf, Tensor) else "value"
                found.append(Mismatch(path, kind, describe(constants[i]), describe(leaf)))
        return found

    def raise_mismatch(self, tree: Any) -> tuple[list, dict]:
        found = self.mismatches(tree)
        if not found:  # the fast check was stricter than the definition: a match
            return self.layout.leaves(tree)
        if all(m.kind == "requires_grad" for m in found):
            raise RequiresGradError(self.owner, found, "captured")
        raise InputMismatchError(self.owner, found)

    def describe(self) -> str:
        """The captured signature, one input per line."""
        paths = self.layout.leaf_paths(self.arg_names)
        facts = dict(zip(self.tensor_index, self.facts))
        constants = dict(zip(self.const_index, self.constants))
        lines = []
        for i, path in enumerate(paths):
            if i in facts:
                lines.append(f"{path}: {_describe_facts(facts[i])}")
            else:
                lines.append(f"{path}: constant {describe(constants[i])}")
        return "\n".join(lines)


def _describe_facts(facts: tuple) -> str:
    shape, dtype, device, _ = facts
    return f"a tensor of shape {tuple(shape)}, {dtype} on {device}"


def _tensor_mismatches(path: str, facts: tuple, leaf: Any) -> list[Mismatch]:
    if not isinstance(leaf, Tensor):
        return [Mismatch(path, "type", "a tensor", describe(leaf))]
    shape, dtype, device, requires_grad = facts
    found = []
    if leaf.shape != shape:
        found.append(Mismatch(path, "shape", str(tuple(shape)), str(tuple(leaf.shape))))
    if leaf.dtype != dtype:
        found.append(Mismatch(path, "dtype", str(dtype), str(leaf.dtype)))
    if leaf.device != device:
        found.append(Mismatch(path, "device", str(device), str(leaf.device)))
    if leaf.requires_grad != requires_grad:
        found.append(Mismatch(path, "requires_grad", str(requires_grad), str(leaf.requires_grad)))
    return found
