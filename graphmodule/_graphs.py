"""The graphs a wrapper holds, and the slow path's work on them.

:class:`Graphs` keeps a wrapper's captured graphs (``Entry`` values, most recently used
first), the index of which graph calls of other shapes or modes matched last (``_index``),
the warmup calls of signatures not captured yet, and what warmup calls showed (the keys of a
returned TensorDict, whether results track gradients). It captures graphs (``_record``),
captures them again when their output sets ask (it is their :class:`~graphmodule._outputsets.Recorder`),
finds the graph a call replays (asking ``_entry.decide`` graph by graph), and drops stale and
evicted graphs. Which of these a call needs is the wrapper's life cycle (``_module``).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, NamedTuple

import torch

from ._dispatch import add_required, by_key_paths, fit_batch
from ._eager import EagerEntry
from ._entry import NOT_SERVED, OTHER, REPLAY, STALE, Entry, Verdict, decide
from ._errors import GraphStateError
from ._grad import tracks_grad
from ._hooks import detach_hook_weights, refuse as refuse_hooks
from ._index import CallIndex
from ._inputs import StaticInputs
from ._mode import check_capture
from ._outputsets import OutputSets
from ._record import CallRead, leaf_keys, read_call, record
from ._runners import Runner
from ._spec import InputSpec
from ._stale import Watch
from ._stats import GraphStats

__all__ = ["NOT_RUN", "Found", "Graphs"]

log = logging.getLogger("graphmodule")


class Found(NamedTuple):
    """What :meth:`Graphs.find` found for a call."""

    verdict: Verdict  # REPLAY, STALE or REFUSED for ``entry``; OTHER: no graph takes the call
    entry: Entry | None
    leaves: Any  # the call's leaves and slot values, where its signature matched
    objs: dict | None


_NO_GRAPH = Found(OTHER, None, None, None)
NOT_RUN = object()  # (Graphs.eager: the call has not run yet)


def _untie_hook_weights(module: Any) -> None:
    """Before the function runs on the side stream (a warmup call, a capture) in grad mode:
    see :func:`~graphmodule._hooks.detach_hook_weights`."""
    if torch.is_grad_enabled():
        detach_hook_weights(module)


def _laid_out_as(entry: Entry, leaves: Any) -> list:
    """The call's leaves, copied into tensors laid out as ``entry``'s buffers (the same
    aliasing and strides), requiring grad where the call's do; its constants as captured."""
    scratch = StaticInputs(entry.spec.layout, entry.inputs.leaves)
    with torch.no_grad():
        scratch.copy_from(leaves)
    out = list(scratch.leaves)
    for i in scratch.tensor_index:
        if leaves[i].requires_grad:
            out[i].requires_grad_(True)
    return out


class Graphs:
    """The graphs of one wrapper (see the module docstring).

    Args:
        owner: the wrapper's name, for messages.
        module: the function captured.
        runner: what captures and replays (``_runners``).
        stats: the wrapper's counters (captures, evictions, what output sets did).
        clone: results are copies (``outputs`` not ``"static"``); ``lend``: lent (``"safe"``).
        in_keys: the keys a TensorDict module reads (None: not one).
        arg_names: names of the positional arguments, for messages.
    """

    def __init__(self, *, owner: str, module: Callable[..., Any], runner: Runner, stats: GraphStats, clone: bool,
                 lend: bool, in_keys: list | None, arg_names: tuple) -> None:
        # (nothing here refers to the wrapper: a wrapper is freed without the collector)
        self.owner, self.module, self.runner, self.stats = owner, module, runner, stats
        self.clone, self.lend, self.in_keys, self.arg_names = clone, lend, in_keys, arg_names
        self.entries: list[Entry] = []  # most recently used first
        self.index = CallIndex()  # which entry calls of other shapes or modes matched last
        self.pending: dict[Any, int] = {}  # warmup calls of signatures not captured yet
        self.returned_input: bool | None = None  # a TensorDict module's warmup returned its input
        self.warm_keys: list | None = None  # keys of the TensorDict the last warmup call returned
        self.layer_hint = False  # the last warmup call returned tensors that track gradients (_grad)

    # -- finding a call's graph ----------------------------------------------------------
    def find(self, args: tuple, kwargs: dict, mode: Any) -> Found:
        """The first graph whose signature the call has, and what :func:`decide` says of it;
        a graph it replays becomes the most recently used."""
        entries = self.entries
        other_grads = None  # a graph captured with .grad None where the call has a tensor, or the reverse
        for n, entry in enumerate(entries):
            verdict, split = decide(entry, args, kwargs, mode)
            if verdict is OTHER:
                continue
            if verdict is STALE and entry.watch.other_grads():  # another graph may take it (_rebind)
                other_grads = other_grads or Found(verdict, entry, *split)
                continue
            if verdict is REPLAY:
                if len(entries) > 1:
                    self.index.remember(args, kwargs, mode, entry, entries)
                entries.insert(0, entries.pop(n))
            leaves, objs = split
            return Found(verdict, entry, leaves, objs)
        return other_grads or _NO_GRAPH

    def fit_built(self, td: Any) -> None:
        """``td``, a TensorDict dispatch built from a keyword call, laid out for a graph of
        the module's: its batch size (``_dispatch.fit_batch``), and the empty nested TensorDicts
        the caller's TensorDict had where the graph writes below them (``Entry.requires``),
        which the keyword call's result does not depend on."""
        slots = [(entry.spec.lone_slot.batch_size, entry.requires) for entry in self.entries
                 if entry.spec.lone_slot is not None]
        fit_batch(td, [batch_size for batch_size, _ in slots])
        for batch_size, requires in slots:
            if batch_size == td.batch_size:
                add_required(td, requires)
                return

    def other_batch_size(self, td: Any, mode: Any) -> Any:
        """A TensorDict module's call ``g(td)`` that no graph takes, served by a graph of its
        entries captured with another batch size (``Entry.through_stand_in``), the most
        recently used first; ``NOT_SERVED`` where none does."""
        for entry in self.entries:
            slot = entry.spec.lone_slot
            if slot is None or slot.batch_size == td.batch_size:
                continue
            out = entry.through_stand_in(td, self.in_keys, mode)
            if out is not NOT_SERVED:
                return out
        return NOT_SERVED

    # -- warmup --------------------------------------------------------------------------
    def warmup_call(self, args: tuple, kwargs: dict, first: bool) -> Any:
        """A warmup call, run eagerly; ``first``: of the wrapper's first signature (its result
        tells the capture what the eager call returns)."""
        _untie_hook_weights(self.module)
        out = self.runner.run_eager(lambda: self.module(*args, **kwargs))
        self.layer_hint = tracks_grad(out)
        if first:
            if self.returned_input is None and self.in_keys is not None and args:  # (a TensorDict module)
                self.returned_input = out is args[0]
            self.warm_keys = leaf_keys(out)
        return out

    def warming(self, args: tuple, kwargs: dict, mode: Any, warmup: int) -> bool:
        """Whether this call of a signature no graph has is one of its ``warmup`` calls
        (counted); ``False`` once it has had them: capture it."""
        call = self.read(args, kwargs)
        key = InputSpec(call.layout, call.leaves, mode).key
        count = self.pending.get(key, 0)
        if count < warmup:
            self.pending[key] = count + 1
            return True
        self.pending.pop(key, None)
        return False

    # -- capture -------------------------------------------------------------------------
    def read(self, args: tuple, kwargs: dict) -> CallRead:
        """The call as a capture reads it; raises what a capture cannot take."""
        by_key = by_key_paths(self.in_keys, "tensordict_out" in kwargs)  # the TensorDicts read by key
        return read_call(self.owner, (args, kwargs), by_key, self.arg_names, self.runner.device)

    def capture(self, call: CallRead, mode: Any) -> Entry:
        """Capture ``call``: the new graph, the most recently used (its call's result is
        ``entry.finish(...)``). Raises the runner's :class:`~graphmodule.CaptureError`."""
        # outputs="safe" where the pool already holds a graph (another signature's, another
        # wrapper's): results lent from this capture's memory could sit where that graph
        # writes its temporaries. This call returns copies; the next one captures it again
        # with its results copied out of the pool (a twin of it, see _twin), which lends them.
        lend_later = self.lend and not self.layer_hint and self.runner.pool_in_use()
        _untie_hook_weights(self.module)
        entry, _ = record(owner=self.owner, module=self.module, runner=self.runner, layout=call.layout,
                          leaves=call.leaves, mode=mode, clone=self.clone, lend=self.lend and not lend_later,
                          texts=call.texts, objs=call.objs, eager_keys=self.warm_keys if not self.entries else None,
                          alone=self.layer_hint)
        self.entries.insert(0, entry)
        stats = self.stats
        stats.captures += 1
        stats.replays += 1
        stats.capture_seconds = entry.capture_seconds
        log.info("%s: captured graph %d in %.1f ms (%d held)", self.owner, stats.captures,
                 1e3 * entry.capture_seconds, len(self.entries))
        OutputSets(entry, self, stats, self.owner,
                   lend_later=lend_later and entry.layer is None and bool(entry.plan.graph))
        return entry

    def eager(self, call: CallRead, mode: Any, watch: Watch, ran: Any = NOT_RUN) -> tuple[EagerEntry, Any]:
        """``call``'s signature served eagerly, without a graph (the runner captures none, or
        its capture failed with ``on_capture_failure="eager"``): its entry, the most recently
        used, and the call's result (``ran``, where the call already ran, else run now).

        What a capture refuses before running the function (module hooks, autocast's cache
        over what the graph reads, inference tensors autograd would save; ``watch``: what it
        reads, taken before the call) is refused here too, so that code that runs without
        CUDA runs on a GPU. What only a capture sees (a host synchronisation, Python state
        the function changes) is not."""
        args, kwargs = call.tree
        if ran is NOT_RUN:
            check_capture(self.owner, mode, watch.tensors(), list(zip(call.texts, call.leaves)))
            refuse_hooks(self.owner, watch.modules, backward=torch.is_grad_enabled())
            ran = self.runner.run_eager(lambda: self.module(*args, **kwargs))
        self.stats.eager_calls += 1
        # what it reads as the call left it (a function that builds state at its first call)
        entry = EagerEntry(spec=InputSpec(call.layout, call.leaves, mode), watch=Watch(self.module),
                           runner=self.runner, module=self.module, stats=self.stats,
                           returns_input_td=self.in_keys is not None and bool(args) and ran is args[0])
        self.entries.insert(0, entry)
        return entry, ran

    # -- what output sets ask (the Recorder of _outputsets) -------------------------------
    def record_again(self, entry: Entry, leaves: Any, objs: dict, lend: bool, like: Entry | None) -> Entry:
        """``entry``'s call captured again: a lending one (``lend``), or a graph returning copies.

        A lending capture copies its results, inside its graph, into buffers of its own
        beside ``like``'s graph, laid out as ``like``'s results (``_twin``); a layer's, whose
        activations must outlive the replay until its backward, is a whole capture in a pool
        of its own.

        The new graph serves ``entry``'s calls, so it is captured from ``entry``'s layout, not
        the call's: the call's values in buffers aliased and strided as ``entry``'s (a call
        ``decide`` let through may pass one tensor twice where ``entry`` has two buffers, or
        other gaps between elements), with ``entry``'s signature."""
        alone = entry.layer is not None
        _untie_hook_weights(self.module)
        return record(owner=self.owner, module=self.module, runner=self.runner, layout=entry.spec.layout,
                      leaves=_laid_out_as(entry, leaves), mode=entry.mode, clone=True, lend=lend,
                      texts=entry.texts, objs=objs, alone=alone, like=None if alone else like, spec=entry.spec)[0]

    def replace(self, old: Entry, new: Entry) -> None:
        self.entries[self.entries.index(old)] = new

    def run_eager(self, tree: Any) -> Any:
        args, kwargs = tree
        return self.runner.run_eager(lambda: self.module(*args, **kwargs))

    # -- dropping graphs -------------------------------------------------------------------
    def drop(self, entry: Entry) -> None:
        """A stale graph goes."""
        self.entries.remove(entry)
        entry.release()

    def make_room(self, max_graphs: int) -> None:
        """With ``max_graphs`` held, the least recently used goes (``on_graph_limit="evict"``)."""
        if len(self.entries) >= max_graphs:
            evicted = self.entries.pop()
            evicted.release()
            self.stats.evictions += 1
            log.info("%s: evicted its least recently used graph for a new signature", self.owner)

    def release(self) -> None:
        """Every graph goes (``reset()``)."""
        for entry in self.entries:
            entry.release()

    # -- what a user reads -------------------------------------------------------------------
    def captured(self) -> list[Entry]:
        """The graphs held, most recently used first (not signatures served eagerly)."""
        return [entry for entry in self.entries if entry.handle is not None]

    def debug_dump(self, path: str) -> list[str]:
        """Each graph's structure to ``path`` (one graph) or ``path`` with ``.n`` before its
        suffix (graph ``n``, most recently used first); the paths written."""
        root, ext = os.path.splitext(os.fspath(path))
        entries = self.captured()
        n = len(entries)
        paths = [os.fspath(path)] if n == 1 else [f"{root}.{k}{ext}" for k in range(n)]
        for entry, where in zip(entries, paths):
            self.runner.debug_dump(entry.handle, where, self.owner)
            if not os.path.exists(where):
                raise GraphStateError(f"torch wrote no file at {where} for {self.owner}'s graph.")
        return paths
