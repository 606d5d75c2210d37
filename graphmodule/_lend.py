"""Safe outputs at zero-copy speed: lend the graph's output buffers, never overwrite a held one.

A replay writes its results into the same memory every time. ``outputs="clone"`` copies
every result so that no later call overwrites what a caller holds; most callers drop
their results before the next call (``action = policy(obs)``, then ``env.step(action)``),
so most of those copies are wasted. ``outputs="safe"`` instead hands out the graph's
buffers themselves, through a storage of their own over the graph's memory (a *lent*
storage), and just before the next replay looks at its use count
(``torch._C._storage_Use_Count``: every tensor and view over it holds one):

- nobody holds it (the count is what graphmodule itself holds; the lent storage is ours
  alone, so that count never changes under us): replay; nothing is copied;
- a caller still holds a result, a view of one, a container with one, or its storage
  (``out.untyped_storage()`` is graphmodule's lent storage object itself: its Python
  references are counted too): this graph must not run. The commonest holder is the
  caller's own variable (in ``for ...: out = g(x)``, ``out`` holds the last result while
  the next call runs), so the first time, the entry captures the same call a second time
  with buffers of its own (a *twin*); from then on the two alternate, each replayed while
  the other's results are held. A caller that
  holds one result more (the last round's, kept past a loop) gets a third set;
- the results of all ``OUTPUT_SETS`` sets are held (a list of losses, a rollout of
  actions kept whole): the call is captured once more, returning copies from then on
  (``outputs="clone"`` for that signature), and the lending graphs are dropped.

Which of these a call gets is decided by the graph's output sets (``_outputsets``); this
module is the lending itself.

What a set costs. The first graph lends the memory its capture put its results in, with
no copy (captured in a pool of its own where the shared pool already holds a graph: a graph
sharing a pool writes its temporaries where a graph captured after it may have put its
results). A twin is captured beside it, in the same pool, whose free memory (the first
capture's temporaries) its own temporaries reuse, and its graph's last kernels copy its
results into buffers allocated before its capture by the ordinary caching allocator,
outside any graph pool, where no graph writes (``_twin``): it lends those. So a twin costs
a set of input and output buffers, and at each of its replays one copy of its results on
the device, inside the graph (no launch more); ``stats.twin_bytes`` counts what twins
added. (A graph used as a layer, whose activations must outlive a replay until its
backward, still gets a whole capture per twin, in a pool of its own.)

A lent storage keeps its memory alive (it is made through the CUDA array interface, or
the buffer protocol on the CPU, over an object holding the graph's own storage, or the
twin's buffer): results outlive their graph (the wrapper deleted or reset, the graph
dropped or evicted), and the memory goes back to the pool, or the allocator, when the last
of them goes.

What this cannot see: a raw address taken from a result (``data_ptr()``, DLPack,
``__cuda_array_interface__``), work another stream has queued on a result without the
caller's stream waiting for it, and a CUDA graph the caller captured over a result: those
read the graph's memory, which the next call overwrites. Use ``outputs="clone"`` there.
"""

from __future__ import annotations

import ctypes
import functools
import weakref
from operator import attrgetter, is_
from sys import getrefcount
from typing import Any, NamedTuple

import torch

__all__ = ["DroppingLender", "Lender", "OneStorage", "available", "by_address", "use_count"]

Tensor = torch.Tensor

use_count = getattr(torch._C, "_storage_Use_Count", None)

# each lent storage (held weakly), and the storage of the graph under it
_OWNERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def available() -> bool:
    """Whether this torch has what lending needs (else results are cloned)."""
    return use_count is not None


class _Keeper:
    """The graph's storage, seen through the CUDA array interface: a tensor made from it
    holds this object (so the graph's memory) until its storage goes."""

    def __init__(self, owner: torch.UntypedStorage):
        self.owner = owner
        self.__cuda_array_interface__ = {"shape": (owner.nbytes(),), "typestr": "|u1", "version": 2,
                                         "data": (owner.data_ptr(), False), "strides": None}


def _lent_storage(owner: torch.UntypedStorage) -> torch.UntypedStorage:
    """A storage of its own over ``owner``'s memory that keeps ``owner`` alive."""
    if owner.device.type == "cuda":
        with torch.cuda.device(owner.device):
            flat = torch.as_tensor(_Keeper(owner), device=owner.device)
    else:  # the buffer protocol: the ctypes array holds the owner
        buffer = (ctypes.c_uint8 * owner.nbytes()).from_address(owner.data_ptr())
        buffer.owner = owner
        flat = torch.frombuffer(buffer, dtype=torch.uint8)
    assert flat.data_ptr() == owner.data_ptr()
    storage = flat.untyped_storage()
    _OWNERS[storage] = owner
    return storage


def by_address(t: Tensor) -> Tensor | None:
    """A tensor over the memory of ``t`` where ``t`` is a lent result (else ``None``) that keeps
    the graph's memory alive without using the lent storage: how another graph that reads a
    lent result holds it (a CUDA graph holds its address), so that it never counts as a caller
    holding the result (gradient accumulation: a graph that adds into the gradients
    another graph lent)."""
    if not _OWNERS:
        return None
    owner = _OWNERS.get(t.untyped_storage())
    return None if owner is None else _on(_lent_storage(owner), t)


class _Group:
    """The graph outputs over one storage, and the lent storage they are handed out on."""

    __slots__ = ("templates", "lent", "cdata", "base")

    def __init__(self, members: list[tuple[int, Tensor]]) -> None:
        owner = members[0][1].untyped_storage()
        self.lent = _lent_storage(owner)
        self.templates = [(j, _on(self.lent, t)) for j, t in members]
        self.cdata = self.lent._cdata
        self.base = use_count(self.cdata)  # what graphmodule itself holds


def _on(storage: torch.UntypedStorage, t: Tensor) -> Tensor:
    """A tensor like ``t`` over ``storage`` (an inference tensor where ``t`` is one)."""
    with torch.inference_mode(t.is_inference()), torch.no_grad():
        out = torch.empty((0,), dtype=t.dtype, device=t.device)
        return out.set_(storage, t.storage_offset(), t.shape, t.stride())


class OneStorage(NamedTuple):
    """What :attr:`Lender.free` reads where the results are over one storage, for a caller
    that asks it inline (the output sets, at every call): no caller holds a result while
    ``_storage_Use_Count(cdata) == base and getrefcount(lents[0]) == refs``."""

    cdata: int
    base: int  # the storage's uses graphmodule itself holds (its templates)
    # the lent storage, in a list: a reference held here, not counted in ``refs``
    lents: list
    # ``out.untyped_storage()`` is the lent storage object itself (torch keeps one per storage):
    # a caller holding it alone adds a Python reference, not a use of the storage
    refs: int


class Lender:
    """The lent outputs of one graph.

    Per call: :attr:`free` (whether no caller holds what the last replay lent; else the
    entry replays its twin, or is captured again with copied outputs), the replay, then
    :meth:`values` (or, for one result, :attr:`lone`'s ``.data``). A lent result is a new
    tensor over the lent storage at each call (``.data``: a tensor with a version counter
    of its own, as a fresh result has). Outputs without memory (no elements) are cloned:
    nothing to overwrite, nothing to copy; so are those in ``copied`` (a graph that returns
    copies and lends only the ``.grad`` its step drops, see :class:`DroppingLender`).
    """

    def __init__(self, graph: list[Tensor], copied: frozenset[int] = frozenset()) -> None:
        groups: dict[int, list[tuple[int, Tensor]]] = {}
        self.inert: list[tuple[int, Tensor]] = []
        for j, t in enumerate(graph):
            if j in copied or t.untyped_storage().nbytes() == 0:
                self.inert.append((j, t))
            else:
                groups.setdefault(t.untyped_storage()._cdata, []).append((j, t))
        self.groups = [_Group(members) for members in groups.values()]
        self.n = len(graph)
        # a graph with one result, which has memory: what each call lends a new view of
        self.lone = self.groups[0].templates[0][1] if self.n == 1 and self.groups else None
        cdatas, bases = [g.cdata for g in self.groups], [g.base for g in self.groups]
        lents = [g.lent for g in self.groups]
        refs = list(map(getrefcount, lents))  # (read as free() reads them: from the list)
        # one storage (nearly every graph): free() inlined by the output sets
        self.one = OneStorage(cdatas[0], bases[0], lents, getrefcount(lents[0])) if len(lents) == 1 else None
        self._counted = (cdatas, lents, refs)  # (for a subclass's own check: a list more would count)
        self.kept: frozenset[int] = frozenset()  # outputs whose last values() are still bound (DroppingLender)

        def free() -> bool:
            """Whether no caller holds a result lent by the last replay (a tensor or view
            over a lent storage, or the storage itself)."""
            return list(map(use_count, cdatas)) == bases and list(map(getrefcount, lents)) == refs

        self.free = free

    def values(self) -> list[Any]:
        out: list[Any] = [None] * self.n
        for g in self.groups:
            for j, template in g.templates:
                out[j] = template.data
        for j, t in self.inert:
            out[j] = t.clone()
        return out


_grad_of = attrgetter("grad")
_version_of = attrgetter("_version")
# the C++ references to a tensor (``.grad`` holds one, its Python object one): where this torch has it
_impl_uses = getattr(Tensor, "_use_count", None)


@functools.cache  # (measured once, at the first train step that could keep its .grad bound)
def _bound_counts() -> tuple[int, int] | None:
    """``(C++ references, Python references)`` of a ``.grad`` that nothing but the kept list
    holds, read as :class:`DroppingLender` reads them; ``None`` where this torch cannot tell a
    held one apart (then nothing is kept bound)."""
    if _impl_uses is None:
        return None
    with torch.inference_mode(False), torch.enable_grad():  # (whatever mode the first capture ran in)
        p = torch.zeros(1, requires_grad=True)
        p.grad = torch.zeros(1)
    kept = [p.grad]
    free = (list(map(_impl_uses, kept))[0], list(map(getrefcount, kept))[0])
    held = kept[0]  # a caller's variable
    by_python = list(map(getrefcount, kept))[0] != free[1]
    del held
    saved = kept[0].view(1)  # a C++ reference (a view's base, as an autograd graph's saved tensor)
    by_cpp = list(map(_impl_uses, kept))[0] != free[0]
    del saved
    return free if by_python and by_cpp else None


class DroppingLender(Lender):
    """The lender of a train step that drops the ``.grad`` bound at the call before reading it
    (``zero_grad()`` first) and binds a new one, which its graph's buffers hold (``_rebind``).
    The last call bound ``.grad`` to a lent result: the step would drop it, so before asking
    whether a caller holds a result, ``.grad`` is bound to a placeholder that holds nothing
    (a gradient you kept elsewhere still counts as held).

    Where the ``.grad`` the last call bound are still bound and nothing else holds them (no
    Python reference, no C++ one such as an autograd graph's, no view, no write since:
    ``index``, the graph output each ``.grad`` is), they stay bound: the replay writes the
    next gradients into them, and neither placeholders nor new tensors are bound at each
    call (a step over many parameters saves two ``.grad`` bindings and a tensor per
    parameter). A gradient you keep is then still one that no later call overwrites.

    ``copied``: outputs cloned at each call rather than lent (the step's own results, where
    the caller keeps them all, as a loop keeping every loss does: only the ``.grad`` it
    drops is lent)."""

    def __init__(self, graph: list[Tensor], drops: list[tuple[Tensor, Tensor]],
                 copied: frozenset[int] = frozenset(), index: tuple[int, ...] | None = None) -> None:
        super().__init__(graph, copied)
        tensors, placeholders, free = [t for t, _ in drops], [p for _, p in drops], self.free
        self.one = None  # (free() binds the placeholders first: never inlined)
        # the .grad kept bound: each dropped .grad a lent output of its own (else never kept)
        lent = {j: k for k, g in enumerate(self.groups) for j, _ in g.templates}
        counts = _bound_counts()
        keep = (counts is not None and index is not None and len(index) == len(drops)
                and len(set(index)) == len(index) and all(j in lent for j in index))
        self._index = index if keep else None
        self.lone = None if keep else self.lone  # (a lone lent result would be handed out past values())
        self._bound: list[Tensor] | None = None  # what the last call bound, while it may stay bound
        dropped = self._kept = frozenset(index) if keep else frozenset()
        self._others = [(j, t) for g in self.groups for j, t in g.templates if j not in dropped]
        cdatas, lents, refs = self._counted
        extra = [0] * len(self.groups)
        for j in index if keep else ():
            extra[lent[j]] += 1  # (a bound .grad is one more use of its group's storage)
        bound_bases = [g.base + n for g, n in zip(self.groups, extra)]
        n = len(drops)
        # a bound .grad that nothing else holds (what _bound_counts measured), and never written
        impl_uses, py_refs, versions = [counts[0] if keep else 0] * n, [counts[1] if keep else 0] * n, [0] * n

        def free_dropping() -> bool:
            bound = self._bound
            if bound is not None:
                if (all(map(is_, map(_grad_of, tensors), bound)) and list(map(_impl_uses, bound)) == impl_uses
                        and list(map(getrefcount, bound)) == py_refs and list(map(_version_of, bound)) == versions
                        and list(map(use_count, cdatas)) == bound_bases and list(map(getrefcount, lents)) == refs):
                    return True
                bound = self._bound = None  # (held here no more: they count as held otherwise)
            for t, placeholder in zip(tensors, placeholders):
                t.grad = placeholder
            return free()

        self.free = free_dropping

    def values(self) -> list[Any]:
        index, bound = self._index, self._bound
        if index is None or bound is None:
            out = super().values()
            self.kept = frozenset()
            if index is not None:  # bound by this call's effects; kept bound while free_dropping finds them so
                self._bound = [out[j] for j in index]
            return out
        self.kept = self._kept
        # the .grad still bound, held by nothing else: bound again (Effects skips them)
        out: list[Any] = [None] * self.n
        for j, template in self._others:
            out[j] = template.data
        for j, t in zip(index, bound):
            out[j] = t
        for j, t in self.inert:
            out[j] = t.clone()
        return out
