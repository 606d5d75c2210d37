"""What a call did with autograd, read around its capture: is it a layer or a train step?

Before the capture: :func:`track_inputs` makes the buffers of inputs that require grad
require grad too (the backward graph is taken with respect to them), and :class:`Marks` takes
the ``.grad`` of the leaves the call may train and autograd's sequence number. After it:
:func:`_walk` finds the autograd nodes the call made behind its outputs and the leaves they
reach, and :meth:`Marks.trained` and :func:`_freed` tell a call that ran backward itself (a
train step: one graph whose outputs refuse backward) from one whose outputs backpropagate
(a layer, ``_grad``). :func:`tracks_grad` is the hint, at warmup, that a capture is likely a
layer. All of it runs at warmup and capture, never on a replay.
"""

from __future__ import annotations

from typing import Any

import torch

from ._errors import UnsupportedError
from ._inputs import StaticInputs

__all__ = ["Marks", "track_inputs", "tracks_grad"]

Tensor = torch.Tensor


def tracks_grad(out: Any) -> bool:
    """Whether a (warmup) call's result tracks gradients: its capture is likely a layer, whose
    forward activations must outlive the replay; it is captured where no other graph writes."""
    if not torch.is_grad_enabled():
        return False
    try:
        leaves = torch.utils._pytree.tree_leaves(out)
    except Exception:  # noqa: BLE001 - a result pytree cannot walk: no hint
        return False
    return any(isinstance(t, Tensor) and t.requires_grad for t in leaves)


def track_inputs(owner: str, inputs: StaticInputs, leaves: list, texts: list[str]) -> list[int]:
    """Before the forward capture, under grad mode: the buffers of the call's inputs that
    require grad become leaves that require grad, so that the backward can be taken with
    respect to them. Returns their leaf indices."""
    tracked = [i for i in inputs.tensor_index if leaves[i].requires_grad]
    if not tracked:
        return []
    members: dict[int, int] = {}
    for i in inputs.tensor_index:
        members[inputs.pattern[i]] = members.get(inputs.pattern[i], 0) + 1
    shared = [i for i in tracked if members[inputs.pattern[i]] > 1]
    if shared:
        raise UnsupportedError(
            owner,
            f"{texts[shared[0]]} requires grad and shares memory with another input (the same tensor "
            "passed twice, or views of one tensor); the backward graph returns one gradient per input.",
            "pass separate tensors (x.clone()) where gradients must flow, or x.detach() where not.",
        )
    for i in tracked:
        inputs.leaves[i].requires_grad_(True)
    return tracked


class Marks:
    """Taken before the capture: the ``.grad`` of the leaves the call may train (to tell a
    train step), and the autograd sequence number (nodes made later belong to the call)."""

    def __init__(self, tensors: Any, buffers: list[Tensor]):
        self.tensors = [t for t in tensors if t.requires_grad and t.is_leaf] + list(buffers)
        self.grads = [(t.grad, None if t.grad is None else t.grad._version) for t in self.tensors]
        with torch.enable_grad():
            self.start = (torch.zeros((), device="cpu", requires_grad=True) * 1).grad_fn._sequence_nr()

    def trained(self) -> bool:
        """Whether the call wrote a ``.grad`` (ran backward into what it reads or was given)."""
        for t, (grad, version) in zip(self.tensors, self.grads):
            now = t.grad
            if now is not grad or (now is not None and now._version != version):
                return True
        return False


def _walk(outs: list[Tensor], start: int) -> tuple[list[Any], list[Tensor], list[Any]]:
    """The autograd nodes the call made behind ``outs``; the leaves they reach; and nodes made
    before the call (tensors that require grad computed outside it)."""
    nodes: list[Any] = []
    leaves: dict[int, Tensor] = {}
    outside: list[Any] = []
    seen: set[int] = set()
    stack = [o.grad_fn for o in outs if o.grad_fn is not None]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        nodes.append(node)  # (keeps the Python object, so its id stays unique)
        variable = getattr(node, "variable", None)
        if isinstance(variable, Tensor):  # AccumulateGrad: a leaf
            leaves.setdefault(id(variable), variable)
            continue
        if node._sequence_nr() < start:
            outside.append(node)
            continue
        stack.extend(n for n, _ in node.next_functions if n is not None)
    return nodes, list(leaves.values()), outside


def _freed(nodes: list[Any]) -> bool:
    """Whether a backward already ran through these nodes without ``retain_graph``."""
    for node in nodes:
        names = [n for n in dir(node) if n.startswith("_saved_")]
        if hasattr(node, "saved_tensors"):
            names.append("saved_tensors")
        for name in names:
            try:
                getattr(node, name)
            except RuntimeError:
                return True
    return False


def _untrack(inputs: StaticInputs, tracked: list[int]) -> None:
    for i in tracked:
        inputs.leaves[i].requires_grad_(False)
