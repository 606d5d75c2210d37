"""The graphs a wrapper holds, and the slow path's work on them.

:class:`Graphs` keeps a wrapper's captured graphs (``Entry`` values, most recently used
first), the index of which graph calls of other shapes or modes matched last (``_index``),
the warmup calls of signatures not captured yet, and what warmup calls showed (the keys of a
returned TensorDict, whether results track gradients). It captures graphs (``_record``),
captures them again when their signatures ask (it is their :class:`~graphmodule._signature.Recorder`),
finds the graph a call replays (asking ``_entry.decide`` graph by graph), and drops stale and
evicted graphs. Which of these a call needs is the wrapper's life cycle (``_module``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import torch

from ._discover import Discovery
from ._dispatch import add_required, by_key_paths, fit_batch
from ._eager import CheckingRunner, EagerEntry, checked_entry
from ._entry import NOT_SERVED, OTHER, REPLAY, STALE, Entry, Verdict, decide
from ._errors import GraphStateError
from ._explain import explain_mismatches
from ._gradtrace import tracks_grad
from ._hooks import detach_hook_weights
from ._index import CallIndex
from ._inputs import StaticInputs
from ._lend import available as lendable
from ._mode import Mode, ModeReader, global_mode
from ._optim import stepping_capturable
from ._options import AUTO_GRAPHS
from ._policy import Capture, Facts, OutputPolicy, plan_capture
from ._record import CallRead, leaf_keys, read_call, record
from ._refuse import before_capture
from ._runners import Kind, Runner
from ._signature import Signature
from ._spec import InputSpec
from ._stale import Watch
from ._stats import GraphStats
from ._variants import Room, limit_error, tensors_of

__all__ = ["NOT_RUN", "Found", "Graphs", "Warming"]

log = logging.getLogger("graphmodule")


class Found(NamedTuple):
    """What :meth:`Graphs.find` found for a call."""

    verdict: Verdict  # REPLAY, STALE or REFUSED for ``entry``; OTHER: no graph takes the call
    entry: Entry | None
    leaves: Any  # the call's leaves and slot values, where its signature matched
    objs: dict | None


@dataclass
class Warming:
    """A signature no graph has yet: its warmup calls so far, and what the last one showed.

    Counted per signature (``spec`` under ``mode``), so that signatures whose calls alternate
    (a flag that flips at every call) each have their ``warmup`` calls before their capture;
    :attr:`Graphs.first` counts the calls before the first graph together, whatever their
    signatures. The wrapper's only warmup counter (:meth:`Graphs.warmup_call` counts)."""

    spec: InputSpec | None  # (without its mode: ``mode`` may be read again, see Graphs.know_modules)
    mode: tuple
    calls: int = 0  # its warmup calls so far (those that returned: a call that raises is not one)
    keys: list | None = None  # keys of the TensorDict its last warmup call returned
    layer_hint: bool = False  # its last warmup call returned tensors that track gradients (_grad)

    @property
    def key(self) -> tuple:
        return self.spec.key, self.mode


_NO_GRAPH = Found(OTHER, None, None, None)
NOT_RUN = object()  # (Graphs.eager: the call has not run yet)


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
        policy: ``outputs=``, which each capture's plan is made from (``_policy``).
        in_keys: the keys a TensorDict module reads (None: not one).
        arg_names: names of the positional arguments, for messages.
    """

    def __init__(self, *, owner: str, module: Callable[..., Any], runner: Runner, stats: GraphStats,
                 policy: OutputPolicy, in_keys: list | None, arg_names: tuple) -> None:
        # (nothing here refers to the wrapper: a wrapper is freed without the collector)
        self.owner, self.module, self.runner, self.stats = owner, module, runner, stats
        self.policy, self.in_keys, self.arg_names = policy, in_keys, arg_names
        self.entries: list[Entry] = []  # most recently used first
        self.index = CallIndex()  # which entry calls of other shapes or modes matched last
        self.switching = False  # the last call replayed another graph than the one before it
        self.pending: dict[tuple, Warming] = {}  # signatures not captured yet, oldest first
        # the calls before the first graph, counted together (max_graphs=N; or calls no signature reads)
        self.first = Warming(None, ())
        self.returned_input: bool | None = None  # a TensorDict module's warmup returned its input
        self.warm_keys: list | None = None  # keys of the TensorDict the last warmup call returned
        self.layer_hint = False  # the last warmup call returned tensors that track gradients (_grad)
        # without CUDA: what captures a signature's first call, to check it as a GPU would (_eager)
        self.checking = None if runner.kind.captures else CheckingRunner()

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
    def warmup_call(self, args: tuple, kwargs: dict, warming: Warming) -> Any:
        """A warmup call, run eagerly, counted in ``warming`` (its signature's record, or
        :attr:`first`), which keeps what the call showed for that signature's capture; before
        the first graph, its result also tells the capture what the eager call returns."""
        if torch.is_grad_enabled():  # (_hooks.detach_hook_weights; a capture's record does it with its walk's modules)
            detach_hook_weights(self.module)
        # the optimizers it steps made capturable before their first step, where exact (_optim)
        out = stepping_capturable(self.owner, self.module, self.runner.device,
                                  lambda: self.runner.run_eager(lambda: self.module(*args, **kwargs)),
                                  simulated=self.runner.kind is Kind.SIMULATED)
        self.layer_hint = tracks_grad(out)
        if not self.entries:
            if self.returned_input is None and self.in_keys is not None and args:  # (a TensorDict module)
                self.returned_input = out is args[0]
            self.warm_keys = leaf_keys(out)
        # (counted once it ran: a warmup call that raises is not one)
        warming.keys, warming.layer_hint = leaf_keys(out), self.layer_hint
        warming.calls += 1
        self.stats.warmup_calls += 1
        if warming is not self.first:
            self.pending[warming.key] = warming
        return out

    def signature(self, args: tuple, kwargs: dict, mode: tuple) -> Warming:
        """The warmup record of this call's signature (a new one, not counted yet, if none)."""
        call = self.read(args, kwargs)
        new = Warming(InputSpec(call.layout, call.leaves), mode)
        return self.pending.get(new.key, new)

    def warmed(self, warming: Warming | None) -> None:
        """``warming``'s signature has its graph (or is served eagerly): no longer warming up.
        (A capture refused leaves it warm: its next call captures.)"""
        if warming is not None:
            self.pending.pop(warming.key, None)

    def restart_warmup(self) -> None:
        """Every graph was dropped (stale): every signature warms up again from its first call."""
        self.first = Warming(None, ())
        self.pending.clear()

    # -- max_graphs=None: a graph per Python value and mode (_variants) --------------------
    def room(self, warming: Warming, on_limit: str) -> Room:
        """Whether the call of ``warming``'s signature, which no graph takes, may warm up and
        be captured: another signature of the held graphs' tensors (all held graphs have the
        same, see :meth:`make_room_for`), with fewer than ``AUTO_GRAPHS`` signatures held or
        warming up. With ``on_limit="evict"``, a call with no room makes some: the oldest
        signature warming up is forgotten (the least recently used graph goes at its capture)."""
        if self.entries and tensors_of(warming.spec) != tensors_of(self.entries[0].spec):
            return Room.OTHER_TENSORS
        if warming.key in self.pending:
            return Room.WARMING
        if len(self.entries) + len(self.pending) < AUTO_GRAPHS:
            return Room.NEW
        if on_limit == "evict" and self.pending:
            del self.pending[next(iter(self.pending))]
        return Room.FULL

    def make_room_for(self, warming: Warming) -> None:
        """Before capturing ``warming``'s signature (``max_graphs=None``,
        ``on_graph_limit="evict"``): graphs of other tensors go, then the least recently used
        ones, so that the graphs held and the other signatures warming up stay under
        ``AUTO_GRAPHS`` with it."""
        tensors = tensors_of(warming.spec)
        for entry in [e for e in self.entries if tensors_of(e.spec) != tensors]:
            self._evict(entry)
        others = len(self.pending) - (warming.key in self.pending)
        while self.entries and len(self.entries) + others >= AUTO_GRAPHS:
            self._evict(self.entries[-1])

    def know_modules(self, modules: tuple, keep_other_tensors: bool) -> None:
        """After the first capture, whose modules give calls their train/eval modes: the
        signatures still warming up, counted before it without them (``_mode.global_mode``),
        are counted under the modes the modules are in now; with ``keep_other_tensors``
        false, those of other tensors than the graph's are forgotten (refused from now on)."""
        tensors = tensors_of(self.entries[0].spec) if self.entries and not keep_other_tensors else None
        pending, self.pending = self.pending, {}
        for warming in pending.values():
            if tensors is not None and tensors_of(warming.spec) != tensors:
                continue
            if not Mode(*warming.mode).modules:
                warming.mode = Mode(*warming.mode)._replace(modules=modules)
            self.pending[warming.key] = warming

    def closest(self, args: tuple, kwargs: dict, mode: Any) -> Entry:
        """The held graph a refused call differs least from (where one has its Python values
        and modes, the message names only what is wrong), the most recently used first."""
        def differences(entry: Entry) -> int:
            return len(explain_mismatches(entry.spec, (args, kwargs), self.arg_names)) + (entry.mode != mode)

        return min(self.entries, key=differences)

    def limit_error(self, args: tuple, kwargs: dict, mode: Any, reader: ModeReader | None) -> Exception:
        """A call with no room (``Room.FULL``): what differs from the most recently used graph
        (before any capture, from the signature that started warming up last), and the limit."""
        if self.entries:
            spec, captured, when = self.entries[0].spec, self.entries[0].mode, self.entries[0].when
        else:  # (no module modes before the first capture)
            last = next(reversed(self.pending.values()))
            spec, captured, when, reader, mode = last.spec, last.mode, "warmed up", ModeReader([], []), global_mode()
        modes = reader.mismatches(captured, mode) if mode != captured else []
        return limit_error(self.owner, spec, (args, kwargs), self.arg_names, modes, when)

    # -- capture -------------------------------------------------------------------------
    def read(self, args: tuple, kwargs: dict) -> CallRead:
        """The call as a capture reads it; raises what a capture cannot take."""
        by_key = by_key_paths(self.in_keys, "tensordict_out" in kwargs)  # the TensorDicts read by key
        return read_call(self.owner, (args, kwargs), by_key, self.arg_names, self.runner.device)

    def capture(self, call: CallRead, mode: Any, warmed: Warming | None = None,
                found: Discovery | None = None) -> Entry:
        """Capture ``call``: the new graph, the most recently used (its call's result is
        ``entry.finish(...)``); ``warmed``: its signature's warmup record, if counted per
        signature; ``found``: the walk from the function just taken (``record``'s). Raises the
        runner's :class:`~graphmodule.CaptureError`. Without CUDA the entry is an
        :class:`EagerEntry`, checked by a simulated capture (``_eager.checked_entry``)."""
        layer_hint = self.layer_hint if warmed is None else warmed.layer_hint
        warm_keys = self.warm_keys if warmed is None else warmed.keys
        eager_keys = warm_keys if not self.entries else None
        if self.checking is not None:
            entry = checked_entry(self.owner, self.module, call, mode, eager_keys, self.checking, self.runner,
                                  self.stats, self.policy, found)
            self.entries.insert(0, entry)
            return entry
        plan = plan_capture(self.policy, Facts(Capture.FIRST, layer=layer_hint, pool_in_use=self.runner.pool.in_use(),
                                               lendable=lendable()))
        entry, _ = record(owner=self.owner, module=self.module, runner=self.runner, call=call, mode=mode, plan=plan,
                          eager_keys=eager_keys, found=found)
        self.entries.insert(0, entry)
        stats = self.stats
        stats.captures += 1
        stats.replays += 1
        stats.capture_seconds = entry.capture_seconds
        log.info("%s: captured graph %d in %.1f ms (%d held)", self.owner, stats.captures,
                 1e3 * entry.capture_seconds, len(self.entries))
        Signature(entry, self, stats, self.owner)
        return entry

    def eager(self, call: CallRead, mode: Any, watch: Discovery, ran: Any = NOT_RUN) -> tuple[EagerEntry, Any]:
        """``call``'s signature served eagerly, without a graph, after its capture failed with
        ``on_capture_failure="eager"``: its entry, the most recently used, and the call's
        result (``ran``, where the call already ran, else run now). What a capture refuses
        before running the function (``_refuse.before_capture``, bar DDP's rules; ``watch``:
        what it reads, taken before the call) is refused here too."""
        args, kwargs = call.tree
        if ran is NOT_RUN:
            before_capture(self.owner, mode, watch, list(zip(call.texts, call.leaves)), graph=False)
            ran = self.runner.run_eager(lambda: self.module(*args, **kwargs))
        self.stats.eager_calls += 1
        # what it reads as the call left it (a function that builds state at its first call)
        entry = EagerEntry(spec=InputSpec(call.layout, call.leaves, mode), watch=Watch(self.module),
                           runner=self.runner, module=self.module, stats=self.stats,
                           returns_input_td=self.in_keys is not None and bool(args) and ran is args[0])
        self.entries.insert(0, entry)
        return entry, ran

    # -- what signatures ask (the Recorder of _signature) ---------------------------------
    def record_again(self, entry: Entry, leaves: Any, objs: dict, capture: Capture, like: Entry | None) -> Entry:
        """``entry``'s call captured again, for ``capture`` (``_policy.Capture``): a lending one,
        or a graph returning copies.

        A lending capture copies its results, inside its graph, into buffers of its own
        beside ``like``'s graph, laid out as ``like``'s results (``_twin``); a layer's, whose
        activations must outlive the replay until its backward, is a whole capture in a pool
        of its own.

        The new graph serves ``entry``'s calls, so it is captured from ``entry``'s layout, not
        the call's: the call's values in buffers aliased and strided as ``entry``'s (a call
        ``decide`` let through may pass one tensor twice where ``entry`` has two buffers, or
        other gaps between elements), with ``entry``'s signature."""
        facts = Facts(capture, layer=entry.layer is not None, lendable=lendable(), drops=entry.plan.drops)
        plan = plan_capture(self.policy, facts)
        call = CallRead(None, entry.spec.layout, _laid_out_as(entry, leaves), objs, entry.texts)
        return record(owner=self.owner, module=self.module, runner=self.runner, call=call, mode=entry.mode,
                      plan=plan, like=like if plan.beside else None, spec=entry.spec)[0]

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
            self._evict(self.entries[-1])

    def _evict(self, entry: Entry) -> None:
        self.entries.remove(entry)
        entry.release()
        self.stats.evictions += 1
        log.info("%s: evicted a graph for a new signature", self.owner)

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
        suffix (graph ``n``, most recently used first); the paths written (``debug=True``)."""
        root, ext = os.path.splitext(os.fspath(path))
        entries = self.captured()
        n = len(entries)
        paths = [os.fspath(path)] if n == 1 else [f"{root}.{k}{ext}" for k in range(n)]
        for entry, where in zip(entries, paths):
            entry.dump(where)
            if not os.path.exists(where):
                raise GraphStateError(f"torch wrote no file at {where} for {self.owner}'s graph.")
        return paths
