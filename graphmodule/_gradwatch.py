"""What each call must find in the ``.grad`` a graph reads, checked before each replay.

A graph that accumulates into a gradient, or whose optimizer step reads it, reads fixed
memory; one whose backward binds a new gradient relies on finding ``None``. ``_rebind`` finds
which at capture; :class:`Required` is the per-call check (part of ``_stale.Watch.check``),
and what a call that fails it is: another graph's call (``None`` where the capture found a
tensor, or the reverse: gradient accumulation), or a graph to capture again (a gradient over
other memory).

>>> import torch
>>> p = torch.nn.Parameter(torch.ones(2)); p.grad = torch.zeros(2)
>>> required = Required(); required.add(p, p.grad, "p")
>>> required.same(), required.other_state()
(True, False)
>>> p.grad = None
>>> required.same(), required.other_state()
(False, True)
"""

from __future__ import annotations

import weakref
from itertools import repeat
from operator import attrgetter, is_

import torch

__all__ = ["Required", "StatesOnly"]

Tensor = torch.Tensor

_grad = attrgetter("grad")
_data_ptr, _stride = Tensor.data_ptr, Tensor.stride
_deref = weakref.ref.__call__


class Required:
    """What each call must find in the ``.grad`` the graph reads: ``None`` (its backward binds
    a new gradient), or a tensor over the memory the graph reads (accumulates into, or an
    optimizer step reads). Any tensor object over that memory will do (a gradient another
    graph bound is a new object over the same buffer at each call); no reference to it is
    kept (a lender would count it as a held result). ``torch`` makes a ``.grad`` the shape,
    dtype and device of its tensor, so the address and the strides are what may differ.

    Whether a ``.grad`` is ``None`` at the call is part of what the graph was captured for: a
    call that finds the other state (gradient accumulation: ``None`` at the first call of a
    cycle, a tensor at the next) is another graph's call (:meth:`other_state`). A gradient over
    other memory (:meth:`moved`) makes the graph stale, and it is captured again over that memory
    (as with ``on_stale="recapture"``, whatever that option says)."""

    def __init__(self) -> None:
        self.none: list[Tensor] = []  # tensors whose .grad must be None
        self.none_labels: list[str] = []
        self.kept: list[Tensor] = []  # tensors whose .grad must be over the memory the graph reads
        self.kept_labels: list[str] = []
        self.ptrs: list[int] = []
        self.strides: list[tuple] = []
        self.seen: list[weakref.ref] = []  # the gradients the last check passed (a fast path)

    def add(self, t: Tensor, grad: Tensor | None, label: str) -> None:
        if grad is None:
            self.none.append(t)
            self.none_labels.append(label)
        else:
            self.kept.append(t)
            self.kept_labels.append(label)
            self.ptrs.append(_data_ptr(grad))
            self.strides.append(grad.stride())
            self.seen.append(weakref.ref(grad))

    def __bool__(self) -> bool:
        return bool(self.none or self.kept)

    def same(self) -> bool:
        """Whether every call's ``.grad`` is what the graph reads (C-level passes)."""
        if self.none and not all(map(is_, map(_grad, self.none), repeat(None))):
            return False
        if self.kept:
            grads = list(map(_grad, self.kept))
            if any(map(is_, grads, repeat(None))):
                return False
            if all(map(is_, grads, map(_deref, self.seen))):
                return True  # the objects the last check saw (held weakly)
            if list(map(_data_ptr, grads)) == self.ptrs and list(map(_stride, grads)) == self.strides:
                self.seen = list(map(weakref.ref, grads))
                return True
            return False
        return True

    def other_state(self) -> bool:
        """Whether some ``.grad`` is ``None`` where the capture found a tensor, or the reverse."""
        return (not all(map(is_, map(_grad, self.none), repeat(None)))
                or any(map(is_, map(_grad, self.kept), repeat(None))))

    def moved(self) -> bool:
        """Whether the ``.grad`` are as at capture but for some over other memory (the graph
        that binds them was captured after this one, or bound another set while one is held):
        the graph is captured again, over the memory bound now."""
        return not self.other_state() and not self.same()

    def changes(self) -> list[tuple[str, str]]:
        """``(place, what)`` of each ``.grad`` that is not what the graph reads, for messages."""
        out = [(f"{label}.grad", _NOT_NONE) for t, label in zip(self.none, self.none_labels) if t.grad is not None]
        for t, label, ptr, stride in zip(self.kept, self.kept_labels, self.ptrs, self.strides):
            g = t.grad
            if g is None:
                out.append((f"{label}.grad", _NONE))
            elif _data_ptr(g) != ptr or g.stride() != stride:
                out.append((f"{label}.grad", _OTHER))
        return out


class StatesOnly(Required):
    """:class:`Required` for a signature served without a graph (``_eager``): whether each
    ``.grad`` is ``None`` is still the signature (a GPU captures a graph for each state), but
    no memory is read at a fixed address, so any tensor will do where one was found."""

    @classmethod
    def of(cls, required: Required) -> StatesOnly:
        out = cls()
        out.__dict__.update(required.__dict__)
        return out

    def same(self) -> bool:
        return not self.other_state()

    def moved(self) -> bool:
        return False

    def changes(self) -> list[tuple[str, str]]:
        return [(place, what) for place, what in super().changes() if what is not _OTHER]


_NOT_NONE = ("a tensor, where the capture found None (eagerly the step's backward would add into it; the graph "
             "makes a new gradient): set it to None before each call (zero_grad()), or pass max_graphs=2 to "
             "capture a graph for each (gradient accumulation)")
_NONE = ("None, where the capture found the gradient the graph accumulates into or reads: keep a gradient there "
         "between calls (zero_grad(set_to_none=False)), or pass max_graphs=2 to capture a graph for each "
         "(gradient accumulation)")
_OTHER = ("a tensor over other memory than the gradient the graph accumulates into or reads (a graph reads fixed "
          "addresses): keep that tensor between calls (zero_grad(set_to_none=False)), and hold no gradient a "
          "graph bound past the next call")
