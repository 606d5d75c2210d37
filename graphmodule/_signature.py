"""The graphs of one signature: the graph the wrapper holds, its twins, and where each call's
results come from.

A :class:`Signature` is made for each graph the wrapper holds (``_graphs``) and serves its
calls: it owns the twins (the same call captured again with output buffers of its own,
``_twin``), the state machine of their output sets (``_outputsets.OutputSets``, pure: which
action a call whose results are all held takes, and the state after it), and performs those
actions: the captures again (through the :class:`Recorder` the wrapper gave, held weakly),
a replay, an eager call. Where the machine moves to a new graph, the new graph gets a
signature of its own and takes the old one's place among the wrapper's graphs, and the old
graph is released (results it lent keep their memory, see ``_lend``).

The graph the wrapper holds is passed at each call rather than held: it holds its signature
(``entry.outputs``, which the hot path reads), and held here too it would make a reference
cycle (a deleted wrapper's graphs kept until the collector runs).

At every call the hot path asks :meth:`Signature.serve`, which tries the sets in a list laid
out at each transition (:attr:`Signature.sets`): each set's check that no caller holds its
results (the ``Lender``'s ``free``; none where results are never held back) and its replay; a
call that finds every set held (or, in ``LEND_LATER``, any call) comes to :meth:`held`, which
asks the machine. The serve loop stays direct (no action returned on the hot path): it is
what a replayed call costs.
"""

from __future__ import annotations

import logging
import weakref
from sys import getrefcount
from typing import Any, Callable, NamedTuple, Protocol

from ._entry import Entry
from ._errors import GraphStateError
from ._graphentry import Outputs
from ._lend import OneStorage, use_count
from ._outputsets import COPYING, LEND_LATER, RELEASED, STATIC, Action, Outcome, OutputSets, OutputState, first_state
from ._policy import Capture
from ._scope import SCOPE
from ._stats import GraphStats

__all__ = ["Recorder", "Set", "Signature"]

log = logging.getLogger("graphmodule")


class Recorder(Protocol):
    """What a signature asks of the wrapper whose graph it serves."""

    def record_again(self, entry: Entry, leaves: Any, objs: dict, capture: Capture, like: Entry | None) -> Entry:
        """``entry``'s call captured again, for ``capture``: lending (beside ``like``, copying its
        results into buffers of its own, see ``_twin``) or returning copies. Raises on failure."""

    def replace(self, old: Entry, new: Entry) -> None:
        """``new`` takes ``old``'s place among the wrapper's graphs."""

    def run_eager(self, tree: Any) -> Any:
        """The function's own result for this call, run eagerly."""


class Set(NamedTuple):
    """One output set as :meth:`Signature.serve` tries it."""

    one: OneStorage | None  # its results lent from one storage: the check, read inline
    free: Callable[[], bool] | None  # else the lender's check (``None``: never held back)
    run: Callable[..., Any]  # its replay, ``run(entry, leaves, objs, tree)`` (``Entry.run``)
    # its entry; ``None``: the entry the call came to, which holds this signature (held here,
    # it would make a reference cycle)
    target: Entry | None


class Signature(Outputs):
    """The twins and output sets of the graph ``entry`` (see the module docstring); attaches
    itself to ``entry`` as ``entry.outputs``. ``state``: where the machine starts (default:
    as the capture's plan says, ``_outputsets.first_state``)."""

    __slots__ = ("machine", "sets", "twins", "_recorder", "stats", "_owner")

    def __init__(self, entry: Entry, recorder: Recorder, stats: GraphStats, owner: str,
                 state: OutputState | None = None) -> None:
        self.machine = OutputSets(state or first_state(entry.plan.outputs))
        self.twins: list[Entry] = []  # each with a Lender of its own
        self._recorder = weakref.ref(recorder)
        self.stats, self._owner = stats, owner
        self.sets: tuple = ()
        self._lay_out(entry)
        entry.outputs = self

    @property
    def state(self) -> OutputState:
        return self.machine.state

    def __repr__(self) -> str:
        return f"Signature({self.state.name}, {1 + len(self.twins)} set{'s' * bool(self.twins)})"

    def describe(self) -> str:
        """One line for ``explain()``: ``outputs: TWINS, 2 sets (lent from sets that ...)``."""
        sets = f", {1 + len(self.twins)} sets" if self.twins else ""
        return f"outputs: {self.state.name}{sets} ({self.state.value})"

    def _lay_out(self, entry: Entry) -> None:
        """The sets :meth:`serve` tries, in order, as :class:`Set` records (at each transition)."""
        state = self.state
        if state is LEND_LATER:
            self.sets = ()  # every call comes to held()
        elif state is COPYING and entry.plan.lender is not None:
            self.sets = (_lent_set(entry, None),)  # (the .grad it lends, where a step drops them)
        elif state in (COPYING, STATIC, RELEASED):
            self.sets = (Set(None, None, entry.run, None),)
        else:
            self.sets = (_lent_set(entry, None), *(_lent_set(twin, twin) for twin in self.twins))

    def _after(self, entry: Entry, action: Action, outcome: Outcome) -> Any:
        step = self.machine.after(action, outcome, 1 + len(self.twins))
        if not step.new_graph:
            self._lay_out(entry)
        return step

    # -- the hot path --------------------------------------------------------------------
    def serve(self, entry: Entry, leaves: Any, objs: dict, tree: Any) -> Any:
        """The call's result (``decide`` said ``REPLAY``), counted in the wrapper's stats: the
        first set whose results no caller holds replays; if the caller holds them all, the
        machine's action (:meth:`held`). A loop over records laid out at each transition,
        the check of a set lent from one storage inlined (``Lender.free``)."""
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
        call): the machine's action for it, performed."""
        action, out = self.machine.on_held(), None
        while action is not None:
            action, out = _PERFORM[action](self, entry, leaves, objs, tree)
        return out

    def release(self, entry: Entry) -> None:
        """``entry`` was released: so are its twins."""
        for twin in self.twins:
            twin.release()
        self.twins = []
        if self.state is not RELEASED:
            self.machine.move(RELEASED)
            self._lay_out(entry)

    # -- the actions: each returns (the next action of the same call or None, the result) --
    def _lend_now(self, entry: Entry, leaves: Any, objs: dict, tree: Any) -> tuple[Action | None, Any]:
        """``entry`` returns copies, captured in a pool that held another graph: capture its
        call again, in the same pool, with its results copied out of the pool into buffers
        of its own, and lend those from now on. If that fails, ``entry`` keeps copying."""
        lending = self._lending(entry, leaves, objs, "results stay copies")
        if lending is None:
            self._after(entry, Action.LEND_NOW, Outcome.FAILED)
            return None, entry.run(entry, leaves, objs, tree)
        self.stats.lending_captures += 1
        self._succeed(entry, lending, self._after(entry, Action.LEND_NOW, Outcome.MADE).state)
        log.info("%s: captured again in %.1f ms to lend its results from buffers outside the shared pool",
                 self._owner, 1e3 * lending.capture_seconds)
        return None, lending.finish(leaves, objs, tree)

    def _add_twin(self, entry: Entry, leaves: Any, objs: dict, tree: Any) -> tuple[Action | None, Any]:
        """The same call captured again, with buffers of its own: its result; if that failed,
        the machine's next action.

        A function that rebinds state it reads (``group["lr"] = lr0 * alpha``) left that
        state as the twin's capture made it, which ``entry``'s graphs do not read: the twin
        then replaces them, with no further set.
        """
        twin = self._lending(entry, leaves, objs, "no further output set")
        if twin is None:
            return self._after(entry, Action.TWIN, Outcome.FAILED).then, None
        self.stats.twin_captures += 1
        self.stats.twin_bytes += twin.capture_bytes  # (its output buffers included)
        if not entry.watch.check():
            self._succeed(entry, twin, self._after(entry, Action.TWIN, Outcome.REPLACES).state)
            log.info("%s: the function rebinds state its graph reads; its second capture replaces the "
                     "first", self._owner)
            return None, twin.finish(leaves, objs, tree)
        self.twins.append(twin)
        self._after(entry, Action.TWIN, Outcome.MADE)
        log.info("%s: captured another output set in %.1f ms (results of the last call were still held)",
                 self._owner, 1e3 * twin.capture_seconds)
        return None, twin.finish(leaves, objs, tree)

    def _copying(self, entry: Entry, leaves: Any, objs: dict, tree: Any,
                 action: Action = Action.COPIES) -> tuple[Action | None, Any]:
        """The caller holds results of every set: capture the call once more, returning
        copies from then on (``Action.COPIES_ALL``: the ``.grad`` its step drops too, one
        was kept); if that fails, the machine's next action (run eagerly)."""
        capture = Capture.COPYING if action is Action.COPIES else Capture.COPYING_ALL
        try:
            fresh = self._recorder_now().record_again(entry, leaves, objs, capture, None)
        except Exception as err:  # noqa: BLE001 - nothing replayable is free: run eagerly
            log.info("%s: no graph returning copies (%s); calls made while results are held run eagerly",
                     self._owner, _first_line(err))
            SCOPE.collect_before_next_capture()
            return self._after(entry, action, Outcome.FAILED).then, None
        self.stats.copy_recaptures += 1
        sets = 1 + len(self.twins)
        self._succeed(entry, fresh, self._after(entry, action, Outcome.MADE).state)
        log.info("%s: results of %d calls were held at once; this call now returns copies "
                 "(captured again in %.1f ms)", self._owner, sets, 1e3 * fresh.capture_seconds)
        return None, fresh.finish(leaves, objs, tree)

    def _copying_all(self, entry: Entry, leaves: Any, objs: dict, tree: Any) -> tuple[Action | None, Any]:
        """A ``.grad`` the copying graph lent was kept past its step: copies of everything."""
        return self._copying(entry, leaves, objs, tree, Action.COPIES_ALL)

    def _eager(self, entry: Entry, leaves: Any, objs: dict, tree: Any) -> tuple[Action | None, Any]:
        """A call made while every set's results are held, where no graph returning copies
        could be captured: the function's own results, run eagerly."""
        self.stats.eager_calls += 1
        return None, self._recorder_now().run_eager(tree)

    # -- what the actions share ------------------------------------------------------------
    def _recorder_now(self) -> Recorder:
        recorder = self._recorder()
        if recorder is None:  # unreachable while the wrapper calls; kept for safety
            raise GraphStateError(f"{self._owner}: the wrapper of this graph is gone")
        return recorder

    def _lending(self, entry: Entry, leaves: Any, objs: dict, failed: str) -> Entry | None:
        """``entry``'s call captured again beside it, its results copied into buffers of its
        own, which it lends; ``None`` (logged as ``failed``) if that capture failed or cannot
        lend (``entry`` stays)."""
        try:
            lending = self._recorder_now().record_again(entry, leaves, objs, Capture.LENDING, entry)
        except Exception as err:  # noqa: BLE001 - entry's graph is still good
            log.info("%s: %s (%s)", self._owner, failed, _first_line(err))
            SCOPE.collect_before_next_capture()
            return None
        if not lending.plan.outputs.lend:  # (this torch cannot lend, or the call returns no tensors)
            lending.release()
            return None
        return lending

    def _succeed(self, entry: Entry, new: Entry, state: OutputState) -> None:
        """``new``, with a signature of its own starting in ``state``, takes ``entry``'s place;
        ``entry`` is released."""
        recorder = self._recorder_now()
        Signature(new, recorder, self.stats, self._owner, state)
        recorder.replace(entry, new)
        entry.release()  # results it lent keep its memory (see _lend)


_PERFORM: dict[Action, Callable[..., tuple[Action | None, Any]]] = {
    Action.LEND_NOW: Signature._lend_now,
    Action.TWIN: Signature._add_twin,
    Action.COPIES: Signature._copying,
    Action.COPIES_ALL: Signature._copying_all,
    Action.EAGER: Signature._eager,
}


def _lent_set(entry: Entry, target: Entry | None) -> Set:
    lender = entry.plan.lender
    return Set(lender.one, lender.free if lender.one is None else None, entry.run, target)


def _first_line(err: BaseException) -> str:
    return str(err).splitlines()[0] if str(err) else type(err).__name__
