"""The graph's static inputs: buffers the replay copies each call's tensors into.

Buffers mirror the capturing call's aliasing, so that the function sees at capture
what it would see eagerly: a tensor passed twice is one buffer passed twice, and views
of one tensor (``g(x, x[1:])``) are views of one buffer, at the same relative offsets.
Every replay then copies each aliasing group once: one ``torch._foreach_copy_`` for
the plain buffers, one byte copy per group of views.

A tensor with memory of its own gets a dense buffer in the order of its strides (``clone``:
a dense tensor's strides, the order of a slice's or a transpose's, contiguous for an
expanded one), so that a later call's tensor of any layout is copied into it (``copy_``);
the graph's results then have the capture's layout, not the call's. A group of views is one
block of bytes laid out as at capture: a call sharing memory so must have the captured
strides (``Entry.extra_ok``).

The function is handed the input tree over these buffers (``_materialized``).
"""

from __future__ import annotations

from operator import is_
from typing import Any

import torch

from ._errors import Mismatch, MismatchKind
from ._tree import Layout, slot_ranges

__all__ = ["StaticInputs", "inference_inputs", "overlapping_inputs", "storage_base"]

Tensor = torch.Tensor


def storage_base(t: Tensor) -> int:
    """The address of ``t``'s storage (equal for tensors sharing memory)."""
    return t.data_ptr() - t.storage_offset() * t.element_size()


def _extent(t: Tensor) -> tuple[int, int]:
    """The bytes of ``t``'s storage that ``t`` spans: ``(start, end)``."""
    start = t.storage_offset() * t.element_size()
    if t.numel() == 0:
        return start, start
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return start, start + (last + 1) * t.element_size()


def _byte_view(storage: Any, offset: int, nbytes: int, device: torch.device) -> Tensor:
    return torch.empty(0, dtype=torch.uint8, device=device).set_(storage, offset, (nbytes,), (1,))


def alias_groups(members: list[tuple[int, Tensor]]) -> list[list[tuple[int, Tensor]]]:
    """Leaves grouped by overlapping memory: views of one storage that share bytes.

    Views of one storage that do not overlap (slices of one batch) are separate groups:
    copying into them cannot interfere.
    """
    by_storage: dict[tuple, list[tuple[int, Tensor]]] = {}
    for i, t in members:
        key = (t.device, storage_base(t)) if t.numel() else ("empty", i)
        by_storage.setdefault(key, []).append((i, t))
    groups = []
    for same in by_storage.values():
        if len(same) == 1:
            groups.append(same)
            continue
        ranged = sorted(((_extent(t), i, t) for i, t in same), key=lambda r: r[0])
        current, end = [], -1
        for (start, stop), i, t in ranged:
            if current and start >= end:
                groups.append(sorted(current, key=lambda m: m[0]))
                current = []
            current.append((i, t))
            end = max(end, stop)
        groups.append(sorted(current, key=lambda m: m[0]))
    return sorted(groups, key=lambda g: g[0][0])


def inference_inputs(leaves: Any, index: list[int], name: Any, why: str) -> list[Mismatch]:
    """The leaves at ``index`` that are inference tensors, where a replay needs normal ones
    (``why``): eagerly, torch would refuse to write one outside inference mode, or to save
    one for backward. (The graph's buffers are normal tensors: a replay would not refuse.)"""
    return [Mismatch(name(i), MismatchKind.INFERENCE, f"a normal tensor ({why})",
                     "an inference tensor (made under torch.inference_mode())")
            for i in index if leaves[i].is_inference()]


def internal_overlap(t: Tensor) -> bool:
    """Whether elements of ``t`` share memory as torch's in-place ops refuse (a dim of more
    than one element with stride 0: ``x.expand(...)``), where a write raises eagerly."""
    strides = t.stride()
    return 0 in strides and any(s == 0 and n > 1 for n, s in zip(t.shape, strides))


def overlapping_inputs(leaves: Any, index: list[int], name: Any) -> list[Mismatch]:
    """The leaves at ``index`` (inputs the function writes) whose elements share memory:
    eagerly the write raises; the graph writes its dense buffer, whose values could not be
    copied back into such a tensor."""
    return [Mismatch(name(i), MismatchKind.OVERLAP, "a tensor whose elements each have their own memory (the function "
                     "writes into it)", f"an expanded tensor (stride {leaves[i].stride()})")
            for i in index if internal_overlap(leaves[i])]


def identity_pattern(leaves: Any, index: list[int]) -> list[int]:
    """For each tensor leaf, the position of the first leaf that is the same object."""
    first: dict[int, int] = {}
    return [first.setdefault(id(leaves[i]), i) for i in index]


class Span:
    """A group of input leaves that are views of one storage: one byte buffer for all."""

    __slots__ = ("rep", "rep_start", "base", "nbytes", "flat", "device")

    def __init__(self, members: list[tuple[int, Tensor]]):
        extents = [_extent(t) for _, t in members]
        self.base = min(start for start, _ in extents)
        self.nbytes = max(end for _, end in extents) - self.base
        self.rep, rep_tensor = members[0]
        self.rep_start = extents[0][0]
        self.device = rep_tensor.device
        self.flat = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
        self.flat.copy_(self.source(rep_tensor))

    def source(self, rep: Tensor) -> Tensor:
        """The caller's bytes this span copies, located from its representative leaf."""
        offset = rep.storage_offset() * rep.element_size() - (self.rep_start - self.base)
        return _byte_view(rep.untyped_storage(), offset, self.nbytes, self.device)

    def view(self, t: Tensor) -> Tensor:
        start, _ = _extent(t)
        rel = start - self.base
        if rel % t.element_size():
            raise ValueError("misaligned view")
        out = torch.empty(0, dtype=t.dtype, device=self.device)
        return out.set_(self.flat.untyped_storage(), rel // t.element_size(), t.shape, t.stride())


def _copy(dests: list, sources: list) -> None:
    if any(map(is_, dests, sources)):  # a producer wrote straight into a buffer
        pairs = [(d, s) for d, s in zip(dests, sources) if d is not s]
        dests, sources = [d for d, _ in pairs], [s for _, s in pairs]
        if not dests:
            return
    if len(dests) == 1:  # one tensor (a policy's observation): copy_ skips foreach's setup
        dests[0].copy_(sources[0])
    else:
        torch._foreach_copy_(dests, sources)


class StaticInputs:
    """Buffers for the capturing call's tensor leaves, aliased as the call's leaves are.

    Attributes:
        leaves: the buffers at tensor positions, the captured constants elsewhere.
        aliased: whether any two tensor leaves shared memory at capture.
    """

    def __init__(self, layout: Layout, leaves: list):
        self.layout = layout
        self.ranges = slot_ranges(layout)
        self.leaves = list(leaves)
        self.tensor_index = [i for i, leaf in enumerate(leaves) if isinstance(leaf, Tensor)]
        groups = alias_groups([(i, leaves[i]) for i in self.tensor_index])
        self.identity = identity_pattern(leaves, self.tensor_index)
        self.spans: list[Span] = []
        copy_dests, copy_srcs = [], []
        # per tensor leaf: the index of its group's first leaf (the alias pattern)
        self.pattern: dict[int, int] = {}
        with torch.no_grad():
            for members in groups:
                first = members[0][0]
                made: dict[int, Tensor] = {}
                distinct = {id(t) for _, t in members}
                if len(distinct) == 1:
                    # dense (clone: an expanded tensor's copy is contiguous): any layout copies in
                    buffer = members[0][1].clone()
                    copy_dests.append(buffer)
                    copy_srcs.append(first)
                    for i, _ in members:
                        self.leaves[i] = buffer
                else:
                    span = Span(members)
                    self.spans.append(span)
                    for i, t in members:
                        if id(t) not in made:
                            made[id(t)] = span.view(t)
                        self.leaves[i] = made[id(t)]
                for i, _ in members:
                    self.pattern[i] = first
        self.aliased = any(len(m) > 1 for m in groups)
        # the leaves whose bytes a span copies from: a call must lay them out as at capture
        self.span_reps = frozenset(span.rep for span in self.spans)
        self.copy_dests = copy_dests
        self.copy_srcs = copy_srcs
        # torch._foreach_copy_ takes its fused path (one launch per list on CUDA) only when
        # every tensor shares a dtype and device; otherwise it copies tensor by tensor. So
        # mixed inputs (float observations, bool dones) are copied one list per kind.
        kinds: dict[tuple, tuple[list, list]] = {}
        for dest, src in zip(copy_dests, copy_srcs):
            dests, srcs = kinds.setdefault((dest.dtype, dest.device), ([], []))
            dests.append(dest)
            srcs.append(src)
        self.copy_groups = list(kinds.values()) if len(kinds) > 1 else None
        self.identity_copy = copy_srcs == self.tensor_index and not self.spans and self.copy_groups is None
        self.all_tensors = len(self.tensor_index) == len(self.leaves)
        self.buffers = [self.leaves[i] for i in self.tensor_index]
        # one buffer and nothing else (a policy's observation): (buffer, leaf index), copied
        # without the lists
        self.one = (copy_dests[0], copy_srcs[0]) if len(copy_dests) == 1 and not self.spans else None

    def copy_from(self, leaves: Any) -> None:
        """Copy a call's tensor leaves into the buffers (one foreach launch, plus spans)."""
        one = self.one
        if one is not None:
            buffer, index = one
            source = leaves[index]
            if source is not buffer:  # (a producer wrote straight into the buffer)
                buffer.copy_(source)
            return
        if self.copy_groups is not None:
            for dests, srcs in self.copy_groups:
                _copy(dests, [leaves[i] for i in srcs])
        else:
            if self.identity_copy:
                sources = leaves if self.all_tensors else [leaves[i] for i in self.tensor_index]
            else:
                sources = [leaves[i] for i in self.copy_srcs]
            if self.copy_dests:
                _copy(self.copy_dests, sources)
        for span in self.spans:
            span.flat.copy_(span.source(leaves[span.rep]))

    def copy_back(self, leaves: Any, indices: list[int]) -> None:
        """Copy the buffers at ``indices`` back into the call's leaves (writes the function made)."""
        dests, sources = [], []
        spans_done = set()
        for i in indices:
            span = self._span_of(i)
            if span is not None:
                if id(span) not in spans_done:
                    spans_done.add(id(span))
                    span.source(leaves[span.rep]).copy_(span.flat)
                continue
            if leaves[i] is not self.leaves[i]:
                dests.append(leaves[i])
                sources.append(self.leaves[i])
        if dests:
            torch._foreach_copy_(dests, sources)

    def _span_of(self, i: int) -> Span | None:
        for span in self.spans:
            if self.pattern[i] == span.rep:
                return span
        return None

    def versions(self) -> list[int | None]:
        out = []
        for t in self.buffers:
            try:
                out.append(t._version)
            except RuntimeError:  # inference tensors have no version counter
                out.append(None)
        return out

    def layouts(self) -> list[tuple]:
        """Each buffer's shape, strides and offset, to find metadata changed in place."""
        return [(tuple(t.shape), t.stride(), t.storage_offset()) for t in self.buffers]

    def relaid(self, before: list[tuple]) -> list[tuple[int, tuple, tuple]]:
        """``(leaf index, before, after)`` of each buffer whose shape, strides or offset the
        function changed in place (``x.t_()``, ``x.unsqueeze_(0)``, ``x.resize_(2)``)."""
        return [(i, was, now) for i, was, now in zip(self.tensor_index, before, self.layouts()) if was != now]

    def snapshot(self) -> list[Tensor]:
        """Copies of the buffers' bytes, to find writes no version counter saw (``.data``)."""
        with torch.no_grad():
            return [span_bytes(t).clone() for t in self.buffers]

    def written(self, versions: list, snapshot: list[Tensor]) -> list[int]:
        """The leaf indices whose buffers the function wrote."""
        out = []
        after = self.versions()
        for j, i in enumerate(self.tensor_index):
            # (a buffer made under inference mode has no version counter: its bytes tell; a
            # write of the same bytes then goes unseen, and copying it back would change nothing
            # but the version counter of the caller's tensor, which eagerly does not move)
            moved = versions[j] is not None and after[j] != versions[j]
            if moved or not torch.equal(span_bytes(self.buffers[j]), snapshot[j]):
                out.append(i)
        return out


def span_bytes(t: Tensor) -> Tensor:
    """The bytes of ``t``'s storage that ``t`` spans, as a uint8 view."""
    storage = t.untyped_storage()
    start, end = _extent(t)
    return _byte_view(storage, start, end - start, t.device)
