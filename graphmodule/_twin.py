"""A twin's results: copied, by the graph's last kernels, into buffers outside any graph pool.

``outputs="safe"`` captures a call again (a *twin*, see ``_lend``) when a caller still holds
the results of its graph. A twin lent the memory its own capture put its results in would
have to be captured in a pool of its own (a graph sharing a pool writes its temporaries
where a graph captured after it may have put its results), so each twin would cost a whole
capture's memory. Instead, a twin is captured in the pool of the graph it twins (the
runner's shared pool, or the first graph's own), and its results are copied, inside its
graph, into buffers allocated before the capture by the ordinary caching allocator: no
graph can put anything there. What it lends are those buffers, so a twin costs one set of
output buffers, plus what its capture needs in a pool that already holds the first
capture's temporaries.

The buffers are laid out as the first graph's results are (the twin's capture must find
the same): a result covering its memory densely gets a buffer of its own shape and
strides; results sharing memory (the same tensor twice, views of each other) and results
with gaps or overlaps (a strided slice, an expanded tensor) get one byte buffer spanning
them, with views at the same relative offsets and strides, filled by one byte copy; a
result without elements gets an empty tensor, with nothing to copy. What the call returns
that is not the graph's (its inputs, views of them, parameters) is not copied: it never
was one of the graph's results.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ._inputs import _byte_view, _extent, storage_base
from ._materialized import resolve
from ._effects import collect_call
from ._outputs import dense

__all__ = ["CopyOut"]

Tensor = torch.Tensor


class _Group:
    """Results of the first graph that share memory (or one result with gaps or overlaps):
    one byte buffer spanning them, and their views of it."""

    __slots__ = ("members", "rel", "nbytes", "flat")

    def __init__(self, members: list[tuple[int, Tensor]]):
        extents = [_extent(t) for _, t in members]
        base = min(start for start, _ in extents)
        self.members = [j for j, _ in members]
        self.rel = [start - base for start, _ in extents]
        self.nbytes = max(end for _, end in extents) - base
        first = members[0][1]
        with torch.inference_mode(first.is_inference()):
            self.flat = torch.empty(self.nbytes, dtype=torch.uint8, device=first.device)

    def views(self, like: list[Tensor]) -> list[tuple[int, Tensor]]:
        storage = self.flat.untyped_storage()
        out = []
        for j, rel in zip(self.members, self.rel):
            t = like[j]
            with torch.inference_mode(t.is_inference()):
                view = torch.empty(0, dtype=t.dtype, device=t.device)
                out.append((j, view.set_(storage, rel // t.element_size(), t.shape, t.stride())))
        return out

    def source(self, sources: list[Tensor]) -> Tensor | None:
        """The bytes of the twin's results this group copies (``None``: laid out otherwise)."""
        first = sources[self.members[0]]
        base = _extent(first)[0] - self.rel[0]
        key = storage_base(first)
        for j, rel in zip(self.members, self.rel):
            t = sources[j]
            if storage_base(t) != key or _extent(t)[0] - base != rel:
                return None
        if base < 0 or base + self.nbytes > first.untyped_storage().nbytes():
            return None
        return _byte_view(first.untyped_storage(), base, self.nbytes, first.device)


class CopyOut:
    """The output buffers of a twin, and the capture's tail that fills them.

    Made before the twin's capture from the graph it twins (``like``: its results, recipes
    and effects) and what its capture hands the function (``materialized``, to find the
    containers the function writes results into). :meth:`wrap` adds the copies to the
    captured function; :meth:`outputs` checks, after the capture, that the twin produced
    its results where the copies read them, and returns the buffers (the twin's results).
    """

    def __init__(self, like: Any, materialized: Any):
        graph: list[Tensor] = like.plan.graph
        self.like = graph
        self.out_recipe, self.ops = like.out_recipe, like.effects.ops
        # the containers the function stores results into, as handed to it (before it moves any)
        self.targets = [resolve(op.target, materialized.tree, materialized.slot_objs) for op in self.ops]
        self.buffers: list[Tensor | None] = [None] * len(graph)
        self.singles: list[int] = []
        self.groups: list[_Group] = []
        by_storage: dict[int, list[tuple[int, Tensor]]] = {}
        for j, t in enumerate(graph):
            if t.numel():
                by_storage.setdefault(storage_base(t), []).append((j, t))
            else:  # nothing to copy, nor to overwrite
                with torch.inference_mode(t.is_inference()):
                    self.buffers[j] = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
        for members in by_storage.values():
            j, t = members[0]
            if len(members) == 1 and dense(t):
                with torch.inference_mode(t.is_inference()):
                    self.buffers[j] = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
                self.singles.append(j)
            else:
                group = _Group(members)
                self.groups.append(group)
                for k, view in group.views(graph):
                    self.buffers[k] = view
        self.nbytes = sum(self.buffers[j].untyped_storage().nbytes() for j in self.singles)
        self.nbytes += sum(g.nbytes for g in self.groups)
        self.sources: list[Tensor] | None = None
        self.problem: str | None = None

    def wrap(self, body: Callable[[], Any]) -> Callable[[], Any]:
        """``body``, then the copies of its results into the buffers (the graph's last kernels)."""

        def run() -> Any:
            out = body()
            self._copy(out)
            return out

        return run

    def _copy(self, out: Any) -> None:
        found: dict[int, Tensor] = {}
        collect_call(self.out_recipe, self.ops, out, self.targets, found)
        like = self.like
        # (nothing here may raise: that would fail the capture itself, and its recovery costs
        # more than a twin's; what does not fit is reported after the capture, by outputs())
        if sorted(found) != list(range(len(like))) or not all(isinstance(t, Tensor) for t in found.values()):
            self.problem = f"{len(found)} of the first capture's {len(like)} results found"
            return
        sources = [found[j].detach() for j in range(len(like))]
        for j, (t, s) in enumerate(zip(like, sources)):
            if (s.shape, s.stride(), s.dtype, s.device) != (t.shape, t.stride(), t.dtype, t.device):
                self.problem = (f"result {j} is {tuple(s.shape)}/{s.stride()} {s.dtype} on {s.device}, "
                                f"the first capture's {tuple(t.shape)}/{t.stride()} {t.dtype} on {t.device}")
                return
        spans = [g.source(sources) for g in self.groups]
        if any(span is None for span in spans):
            self.problem = "results share memory otherwise than the first capture's"
            return
        bases = [storage_base(sources[j]) for j in self.singles] + [storage_base(s) for s in spans]
        if len(set(bases)) != len(bases):
            self.problem = "results share memory the first capture's did not"
            return
        with torch.no_grad():
            if self.singles:
                dests = [self.buffers[j] for j in self.singles]
                srcs = [sources[j] for j in self.singles]
                if len(dests) == 1:
                    dests[0].copy_(srcs[0])
                else:
                    torch._foreach_copy_(dests, srcs)
            for group, span in zip(self.groups, spans):
                group.flat.copy_(span)
        self.sources = sources

    def outputs(self, graph: list[Tensor]) -> list[Tensor]:
        """The twin's results: the buffers, once ``graph`` (the tensors its capture planned
        as results) is what the copies read. Raises ``ValueError`` otherwise (no twin then)."""
        sources, self.sources = self.sources, None  # (their memory is the pool's again)
        problem = self.problem
        if problem is None and sources is None:
            problem = "the copies did not run"
        if problem is None and len(graph) != len(sources):
            problem = f"{len(graph)} results where the first capture had {len(sources)}"
        if problem is None:
            for j, (t, s) in enumerate(zip(graph, sources)):
                if (t.data_ptr(), t.shape, t.stride(), t.dtype) != (s.data_ptr(), s.shape, s.stride(), s.dtype):
                    problem = f"result {j} is not where the first capture's was"
                    break
        if problem is not None:
            raise ValueError(f"a twin's results cannot be copied into buffers laid out as the first "
                             f"capture's: {problem}")
        return list(self.buffers)
