"""Which calls get a graph of their own by default (``max_graphs=None``).

A program calls one function with a Python flag that changes from call to call (TorchRL's
TD3 update, ``update(td, update_actor)`` with a bool that alternates), or in train and in
eval mode, with and without grad: eagerly each call runs its own branch, so a wrapper keeps a
graph for each (up to :data:`~graphmodule._options.AUTO_GRAPHS`, as ``torch.compile`` records
up to 8 variants of a function). A call whose *tensors* differ from the graphs held (another
shape, dtype, device...) is refused instead: copying it into a graph's buffers would cast or
move it silently, and a new shape is most often a bug (or ``max_graphs=N`` is asked for).

A call's tensors (:func:`tensors_of`) are where its tensors and TensorDicts sit among its
arguments and what they are (the captured signature's tensor facts and TensorDict
structures); its *Python values* are everything else: non-tensor arguments, ``None`` where a
value was (or the reverse), non-tensor entries of its TensorDicts. Its modes are grad mode,
train/eval, interaction type, autocast, inference mode, the default dtype and deterministic
algorithms (``_mode``).

    >>> import torch
    >>> from graphmodule._record import read_call
    >>> from graphmodule._spec import InputSpec
    >>> def spec(*args):
    ...     call = read_call("f", (args, {}), {}, (), None)
    ...     return InputSpec(call.layout, call.leaves)
    >>> x = torch.zeros(3)
    >>> tensors_of(spec(x, True)) == tensors_of(spec(x, False)) == tensors_of(spec(x, None))
    True
    >>> tensors_of(spec(x, True)) == tensors_of(spec(x.double(), True))
    False
"""

from __future__ import annotations

import enum
from typing import Any, Sequence

import optree
from torch import Tensor

from ._errors import InputMismatchError, Mismatch
from ._explain import explain_mismatches
from ._options import AUTO_GRAPHS
from ._spec import InputSpec
from ._tree import NAMESPACE, is_slot_value

__all__ = ["Leaf", "Room", "limit_error", "tensors_of"]


class Leaf(enum.Enum):
    """What sits at one place among a call's arguments, for :func:`tensors_of`."""

    VALUE = "a Python value (or None)"
    TENSOR = "a tensor"
    SLOT = "a TensorDict or tensorclass"


class Room(enum.Enum):
    """Whether a call that no graph takes may have one of its own (``max_graphs=None``)."""

    WARMING = "its signature is warming up already"
    NEW = "another signature of the held graphs' tensors, with room for it"
    FULL = "another signature of the held graphs' tensors, with no room left"
    OTHER_TENSORS = "its tensors differ from the held graphs'"


def tensors_of(spec: InputSpec) -> tuple:
    """``spec`` without its Python values and modes: the containers of the call (with
    ``None`` counted as a value), which of their places hold tensors, TensorDicts or values,
    and what the tensors and TensorDicts are."""
    layout = spec.layout
    kinds = [Leaf.TENSOR if isinstance(v, Tensor) else Leaf.SLOT if is_slot_value(v) else Leaf.VALUE
             for v in layout.outer]
    tree = optree.tree_unflatten(layout.treespec, kinds)
    marks, structure = optree.tree_flatten(tree, none_is_leaf=True, namespace=NAMESPACE)
    return structure, tuple(Leaf.VALUE if mark is None else mark for mark in marks), spec.tensor_key


def limit_error(owner: str, spec: InputSpec, tree: Any, arg_names: Sequence[str], modes: list[Mismatch],
                when: str) -> InputMismatchError:
    """A call refused for want of room: what differs from ``spec`` (the most recently used
    graph's, or ``when="warmed up"``, the signature that started warming up last) and the limit."""
    return InputMismatchError(
        owner, explain_mismatches(spec, tree, arg_names) + modes, when,
        advice=f"max_graphs=None (the default) keeps a graph for each of up to {AUTO_GRAPHS} calls that differ "
        "only in Python values (non-tensor arguments) and modes, and this call would be one more: pass a value "
        "that changes from call to call as a tensor, max_graphs=N to keep up to N graphs, or "
        "on_graph_limit='evict' to replace the least recently used graph.")
