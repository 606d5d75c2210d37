"""Safe outputs at zero-copy speed: lend the graph's output buffers, move what callers keep.

A replay writes its results into the same memory every time. ``outputs="clone"`` copies
every result so that no later call overwrites what a caller holds; most callers drop
their results before the next call (``action = policy(obs)``, then ``env.step(action)``),
so most of those copies are wasted. ``outputs="safe"`` instead hands out
the graph's buffers themselves, through a storage of our own over their memory (a
*lent* storage), and just before the next replay looks at each lent storage's use count
(``torch._C._storage_Use_Count``: every tensor and view over it holds one):

- nobody holds it (the count is what graphmodule itself holds; the lent storage is ours
  alone, so that count never changes under us): replay; nothing is copied;
- a caller still holds a result, a view of one or a container with one: copy the bytes to
  fresh memory and swap the two storages' memory (``UntypedStorage._swap_data_ptr_``), so
  every tensor over the lent storage, the caller's views included, now reads the copy; the
  graph's memory gets a new lent storage. Then replay.

When the graph goes (the wrapper deleted or reset, the graph evicted), results still lent
out are moved the same way: they never outlive the memory they were lent.

The commonest holder is the caller's own variable: in ``for ...: out = g(x)``, ``out``
still holds the last result while the next call runs. So the first time a result is still
held, the entry captures the same call a second time, with buffers of its own (the *twin*,
sharing the memory pool: only the inputs' and results' buffers are doubled); from then on
the two alternate, each replayed while the other's results are held, with no copy. Only when
the results of both are held (a list of losses, a rollout of actions kept whole) are they
moved; such a loop would pay that move at every call, which costs more than a plain copy:
after a move, the next :data:`COOLDOWN` calls return copies, then lending is tried again.

What this cannot see: a raw address taken from a result (``data_ptr()``, DLPack,
``__cuda_array_interface__``), work another stream has queued on a result without the
caller's stream waiting for it, and a CUDA graph the caller captured over a result: those
read the graph's memory, which the next call overwrites. Use ``outputs="clone"`` there.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

__all__ = ["Lender", "COOLDOWN", "available"]

Tensor = torch.Tensor

COOLDOWN = 32  # calls that return copies after a rescue

_use_count = getattr(torch._C, "_storage_Use_Count", None)
_over = getattr(torch._C, "_construct_storage_from_data_pointer", None)


def available() -> bool:
    """Whether this torch has what lending needs (else results are cloned)."""
    return _use_count is not None and _over is not None and hasattr(torch.UntypedStorage, "_swap_data_ptr_")


class _Group:
    """The graph outputs over one storage, and the lent storage they are handed out on."""

    __slots__ = ("members", "owner", "lent", "templates", "cdata", "base")

    def __init__(self, members: list[tuple[int, Tensor]]) -> None:
        self.members = members  # (output index, the graph's own tensor)
        self.owner = members[0][1].untyped_storage()  # owns the graph's memory (kept alive)
        self.lend(_over(self.owner.data_ptr(), self.owner.device, self.owner.nbytes()))

    def lend(self, storage: torch.UntypedStorage) -> None:
        """Hand out tensors over ``storage`` (a storage over the graph's memory, not owning it)."""
        self.lent = storage
        self.templates = [(j, _on(storage, t)) for j, t in self.members]
        self.cdata = storage._cdata
        self.base = _use_count(self.cdata)  # what graphmodule itself holds

    def held(self) -> bool:
        """Whether a caller holds a tensor over the lent storage."""
        return _use_count(self.cdata) != self.base

    def rescue(self, last: bool = False) -> None:
        """A caller holds tensors over the lent storage: give them a copy of its bytes
        (``last``: the graph's memory is going, lend nothing more)."""
        held = self.lent
        fresh = torch.UntypedStorage(held.nbytes(), device=held.device)
        fresh.copy_(held)  # queued before the replay that overwrites the graph's memory
        held._swap_data_ptr_(fresh)  # the caller's tensors now read the copy...
        if not last:
            self.lend(fresh)  # ...and ``fresh`` is over the graph's memory


def _on(storage: torch.UntypedStorage, t: Tensor) -> Tensor:
    """A tensor like ``t`` over ``storage`` (an inference tensor where ``t`` is one)."""
    with torch.inference_mode(t.is_inference()), torch.no_grad():
        out = torch.empty((0,), dtype=t.dtype, device=t.device)
        return out.set_(storage, t.storage_offset(), t.shape, t.stride())


class Lender:
    """The lent outputs of one graph.

    Per call: :meth:`busy` (a caller holds what the last replay lent: the entry replays its
    twin, or calls :meth:`rescue`), the replay, then :meth:`lending` says whether this call's
    results are lent (:meth:`values`) or copied.
    """

    def __init__(self, graph: list[Tensor]) -> None:
        groups: dict[int, list[tuple[int, Tensor]]] = {}
        for j, t in enumerate(graph):
            groups.setdefault(t.untyped_storage()._cdata, []).append((j, t))
        self.groups = [_Group(members) for members in groups.values()]
        self.n = len(graph)
        self.cooldown = 0
        self.rescues = 0

    def busy(self) -> bool:
        """Whether a caller still holds a result lent by the last replay."""
        if self.cooldown:  # the last results were copies: nothing is lent out
            return False
        groups = self.groups
        if len(groups) == 1:  # the common case, without a generator
            return groups[0].held()
        return any(g.held() for g in groups)

    def rescue(self) -> None:
        """Move what callers hold to copies; the next :data:`COOLDOWN` calls return copies."""
        for g in self.groups:
            if g.held():
                g.rescue()
                self.rescues += 1
        self.cooldown = COOLDOWN

    def __del__(self) -> None:
        # The graph's memory goes with this lender (the wrapper was deleted or reset, or the
        # graph evicted): results still lent out must not outlive it.
        if sys.is_finalizing():  # the process is ending: nothing left to protect
            return
        try:
            for g in self.groups:
                if g.held():
                    g.rescue(last=True)  # lending anew here aborted the process at exit
        except Exception:  # noqa: BLE001 - CUDA already torn down: nothing left to protect
            pass

    def lending(self) -> bool:
        if self.cooldown:
            self.cooldown -= 1
            return False
        return True

    def single(self) -> Tensor:
        """The lent result of a graph with one output."""
        return self.groups[0].templates[0][1].detach()

    def values(self) -> list[Any]:
        out: list[Any] = [None] * self.n
        for g in self.groups:
            for j, template in g.templates:
                out[j] = template.detach()
        return out
