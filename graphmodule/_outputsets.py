"""The output sets of one graph: which buffers a call's results come from, and what happens
when a caller still holds them.

``outputs="safe"`` lends a graph's output buffers to the caller (``_lend``) and never replays
a graph whose lent results are still held. :class:`OutputSets` is the state machine that
decides, at such a call, where the results come from instead::

    LEND_LATER ──held──► capture again, lending ──ok──► (new graph) LENDING
         └────────────────────────────────────failed──► COPYING
    LENDING ──held──► twin ──ok──► TWINS ──held──► twin ... ──OUTPUT_SETS sets──► FULL
       │               └─failed, or the function rebinds what its graphs read──► FULL
    FULL ──held──► capture again, returning copies ──ok──► (new graph) COPYING
                                                 └──failed──► EAGER_WHILE_HELD
    any ──release()──► RELEASED

A *twin* is the same call captured again beside the first graph, with output buffers of its
own (``_twin``): the sets alternate, each replayed while the others' results are held. Where
the machine moves to a new graph, the wrapper's entry is replaced through the
:class:`Recorder` it gave (held without a reference to the wrapper itself), and the old
graph is released (results it lent keep their memory, see ``_lend``).

At every call the hot path asks :meth:`OutputSets.serve`, which tries the sets in a list laid
out at each transition (:attr:`OutputSets.sets`): each set's check that no caller holds its
results (the ``Lender``'s ``free``; none where results are never held back) and its replay; a
call that finds every set held (or, in ``LEND_LATER``, any call) comes to the transitions.
"""

from __future__ import annotations

import enum
import logging
import weakref
from sys import getrefcount
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Protocol

from ._errors import GraphStateError
from ._lend import OneStorage, use_count
from ._policy import CapturePlan
from ._scope import SCOPE
from ._stats import GraphStats

if TYPE_CHECKING:  # (a cycle at import: an Entry holds its OutputSets)
    from ._entry import Entry

__all__ = ["OUTPUT_SETS", "OutputSets", "OutputState", "Recorder", "Set"]

log = logging.getLogger("graphmodule")

OUTPUT_SETS = 3  # output buffer sets of one call at most (the first graph and two twins)


class OutputState(enum.Enum):
    """Where the results of a graph's calls come from."""

    LENDING = "lent from the graph's buffers; when a caller holds them at a call, a twin is captured"
    TWINS = "lent from sets that alternate; when every set is held, another twin is captured"
    FULL = "lent from the sets there are; when every set is held, a graph returning copies is captured"
    LEND_LATER = "copies, until the next call captures the graph again to lend from buffers outside the pool"
    COPYING = "copies made at each call"
    STATIC = "the graph's own buffers, overwritten by the next call (outputs='static')"
    EAGER_WHILE_HELD = "lent; a call made while every set is held runs eagerly (no graph returning copies)"
    RELEASED = "none: the graph was released"


LENDING, TWINS, FULL, LEND_LATER = OutputState.LENDING, OutputState.TWINS, OutputState.FULL, OutputState.LEND_LATER
COPYING, STATIC, EAGER_WHILE_HELD, RELEASED = (OutputState.COPYING, OutputState.STATIC, OutputState.EAGER_WHILE_HELD,
                                               OutputState.RELEASED)

# every transition, in one place; checked at each (a state not listed has none)
_NEXT: dict[OutputState, frozenset[OutputState]] = {
    LEND_LATER: frozenset({COPYING, RELEASED}),
    LENDING: frozenset({TWINS, FULL, RELEASED}),
    TWINS: frozenset({TWINS, FULL, RELEASED}),
    FULL: frozenset({EAGER_WHILE_HELD, RELEASED}),
    EAGER_WHILE_HELD: frozenset({RELEASED}),
    COPYING: frozenset({RELEASED}),
    STATIC: frozenset({RELEASED}),
    RELEASED: frozenset({RELEASED}),
}


def first_state(plan: CapturePlan) -> OutputState:
    """The state a graph's output sets start in: as its capture's plan (``_policy``) says."""
    if plan.lend:
        return LENDING
    if plan.lend_later:
        return LEND_LATER
    return COPYING if plan.clone else STATIC


class Recorder(Protocol):
    """What output sets ask of the wrapper whose graph they serve."""

    def record_again(self, entry: Entry, leaves: Any, objs: dict, lend: bool, like: Entry | None) -> Entry:
        """``entry``'s call captured again: lending (``lend``; beside ``like``, copying its
        results into buffers of its own, see ``_twin``) or returning copies. Raises on failure."""

    def replace(self, old: Entry, new: Entry) -> None:
        """``new`` takes ``old``'s place among the wrapper's graphs."""

    def run_eager(self, tree: Any) -> Any:
        """The function's own result for this call, run eagerly."""


class OutputSets:
    """The output sets of one graph (its own, and its twins') and their state.

    Made for each graph the wrapper holds (``recorder``: how to capture again, held weakly:
    the recorder holds the graphs, and a cycle would keep a deleted wrapper's graphs until
    the collector runs), in the state its capture allows. Nothing else writes its fields; it
    attaches itself to ``entry`` as ``entry.outputs``.
    """

    __slots__ = ("state", "sets", "others", "_recorder", "stats", "_owner")

    def __init__(self, entry: Entry, recorder: Recorder, stats: GraphStats, owner: str) -> None:
        self.others: list[Entry] = []  # the twins, each with a Lender of its own
        self._recorder = weakref.ref(recorder)
        self.stats, self._owner = stats, owner
        self.sets: tuple = ()
        self.state = first_state(entry.plan.outputs)
        self._lay_out(entry)
        entry.outputs = self

    def __repr__(self) -> str:
        return f"OutputSets({self.state.name}, {1 + len(self.others)} set{'s' * bool(self.others)})"

    def describe(self) -> str:
        """One line for ``explain()``: ``outputs: TWINS, 2 sets (lent from sets that ...)``."""
        sets = f", {1 + len(self.others)} sets" if self.others else ""
        return f"outputs: {self.state.name}{sets} ({self.state.value})"

    # -- transitions ---------------------------------------------------------------------
    def _move(self, entry: Entry, state: OutputState) -> None:
        """The only place the state changes."""
        if state not in _NEXT[self.state]:
            raise AssertionError(f"output sets: no transition {self.state.name} -> {state.name}")  # pragma: no cover
        self.state = state
        self._lay_out(entry)

    def _lay_out(self, entry: Entry) -> None:
        """The sets :meth:`serve` tries, in order, as :class:`Set` records."""
        state = self.state
        if state is LEND_LATER:
            self.sets = ()  # every call comes to held()
        elif state in (COPYING, STATIC, RELEASED):
            self.sets = (Set(None, None, entry.run, None),)
        else:
            self.sets = (_lent_set(entry, None), *(_lent_set(other, other) for other in self.others))

    def serve(self, entry: Entry, leaves: Any, objs: dict, tree: Any) -> Any:
        """The call's result (``decide`` said ``REPLAY``), counted in the wrapper's stats: the
        first set whose results no caller holds replays; if the caller holds them all, the
        next state's answer (:meth:`held`). The hot path: a loop over records laid out at
        each transition, the check of a set lent from one storage inlined (``Lender.free``)."""
        self.stats.replays += 1
        for one, free, run, target in self.sets:
            if one is not None:
                cdata, base, lents, refs = one
                if use_count(cdata) != base or getrefcount(lents[0]) != refs:
                    continue
            elif free is not None and not free():
                continue
            return run(target or entry, leaves, objs, tree)
        return self.held(entry, leaves, objs, tree)

    def held(self, entry: Entry, leaves: Any, objs: dict, tree: Any) -> Any:
        """A call while the caller holds the results of every set (in ``LEND_LATER``: any
        call): the next state's answer."""
        state = self.state
        if state is LEND_LATER:
            return self._lend_now(entry, leaves, objs, tree)
        if state is EAGER_WHILE_HELD:
            return self._eager(tree)
        if state in (LENDING, TWINS):
            made = self._add_twin(entry, leaves, objs, tree)
            if made is not _NOTHING:
                return made
            self._move(entry, FULL)
        return self._copying(entry, leaves, objs, tree)

    def release(self, entry: Entry) -> None:
        """``entry`` was released: so are its twins."""
        for other in self.others:
            other.release()
        self.others = []
        if self.state is not RELEASED:
            self._move(entry, RELEASED)

    def _recorder_now(self) -> Recorder:
        recorder = self._recorder()
        if recorder is None:  # unreachable while the wrapper calls; kept for safety
            raise GraphStateError(f"{self._owner}: the wrapper of this graph is gone")
        return recorder

    # -- what each transition does -----------------------------------------------------------
    def _lending(self, entry: Entry, leaves: Any, objs: dict, failed: str) -> Entry | None:
        """``entry``'s call captured again beside it, its results copied into buffers of its
        own, which it lends; ``None`` (logged as ``failed``) if that capture failed or cannot
        lend (``entry`` stays)."""
        try:
            lending = self._recorder_now().record_again(entry, leaves, objs, True, entry)
        except Exception as err:  # noqa: BLE001 - entry's graph is still good
            log.info("%s: %s (%s)", self._owner, failed, _first_line(err))
            SCOPE.collect_before_next_capture()
            return None
        if not lending.plan.outputs.lend:  # (this torch cannot lend, or the call returns no tensors)
            lending.release()
            return None
        return lending

    def _lend_now(self, entry: Entry, leaves: Any, objs: dict, tree: Any) -> Any:
        """``entry`` returns copies, captured in a pool that held another graph: capture its
        call again, in the same pool, with its results copied out of the pool into buffers
        of its own, and lend those from now on. If that fails, ``entry`` keeps copying."""
        lending = self._lending(entry, leaves, objs, "results stay copies")
        if lending is None:
            self._move(entry, COPYING)
            return entry._replay(leaves, objs, tree)
        self.stats.lending_captures += 1
        self._succeed(entry, lending)
        log.info("%s: captured again in %.1f ms to lend its results from buffers outside the shared pool",
                 self._owner, 1e3 * lending.capture_seconds)
        return lending.finish(leaves, objs, tree)

    def _add_twin(self, entry: Entry, leaves: Any, objs: dict, tree: Any) -> Any:
        """The same call captured again, with buffers of its own; its result, or ``_NOTHING``
        if that failed.

        A function that rebinds state it reads (``group["lr"] = lr0 * alpha``) left that
        state as the twin's capture made it, which ``entry``'s graphs do not read: the twin
        then replaces them, with no further set.
        """
        twin = self._lending(entry, leaves, objs, "no further output set")
        if twin is None:
            return _NOTHING
        self.stats.twin_captures += 1
        self.stats.twin_bytes += twin.capture_bytes  # (its output buffers included)
        if not entry.watch.check():
            self._succeed(entry, twin, full=True)
            log.info("%s: the function rebinds state its graph reads; its second capture replaces the "
                     "first", self._owner)
            return twin.finish(leaves, objs, tree)
        self.others.append(twin)
        self._move(entry, TWINS if 1 + len(self.others) < OUTPUT_SETS else FULL)
        log.info("%s: captured another output set in %.1f ms (results of the last call were still held)",
                 self._owner, 1e3 * twin.capture_seconds)
        return twin.finish(leaves, objs, tree)

    def _copying(self, entry: Entry, leaves: Any, objs: dict, tree: Any) -> Any:
        """The caller holds results of every set: capture the call once more, returning
        copies from then on; if that fails, run such calls eagerly."""
        try:
            fresh = self._recorder_now().record_again(entry, leaves, objs, False, None)
        except Exception as err:  # noqa: BLE001 - nothing replayable is free: run eagerly
            log.info("%s: no graph returning copies (%s); calls made while results are held run eagerly",
                     self._owner, _first_line(err))
            SCOPE.collect_before_next_capture()
            self._move(entry, EAGER_WHILE_HELD)
            return self._eager(tree)
        self.stats.copy_recaptures += 1
        sets = 1 + len(self.others)
        self._succeed(entry, fresh)
        log.info("%s: results of %d calls were held at once; this call now returns copies "
                 "(captured again in %.1f ms)", self._owner, sets, 1e3 * fresh.capture_seconds)
        return fresh.finish(leaves, objs, tree)

    def _succeed(self, entry: Entry, new: Entry, full: bool = False) -> None:
        """``new`` (with output sets of its own; ``full``: no further set) takes ``entry``'s
        place; ``entry`` is released."""
        recorder = self._recorder_now()
        sets = OutputSets(new, recorder, self.stats, self._owner)
        if full:
            sets._move(new, FULL)
        recorder.replace(entry, new)
        entry.release()  # results it lent keep its memory (see _lend)

    def _eager(self, tree: Any) -> Any:
        """A call made while every set's results are held, where no graph returning copies
        could be captured: the function's own results, run eagerly."""
        self.stats.eager_calls += 1
        return self._recorder_now().run_eager(tree)


class Set(NamedTuple):
    """One output set as :meth:`OutputSets.serve` tries it."""

    one: OneStorage | None  # its results lent from one storage: the check, read inline
    free: Callable[[], bool] | None  # else the lender's check (``None``: never held back)
    run: Callable[..., Any]  # its replay, ``run(entry, leaves, objs, tree)`` (``Entry.run``)
    # its entry; ``None``: the entry the call came to, which holds these output sets (held
    # here, it would make a reference cycle)
    target: Entry | None


def _lent_set(entry: Entry, target: Entry | None) -> Set:
    lender = entry.plan.lender
    return Set(lender.one, lender.free if lender.one is None else None, entry.run, target)


_NOTHING = object()


def _first_line(err: BaseException) -> str:
    return str(err).splitlines()[0] if str(err) else type(err).__name__
