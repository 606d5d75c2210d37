"""The state machine of a graph's output sets: where a call's results come from, and what a
call does when its caller still holds the results of every set.

``outputs="safe"`` lends a graph's output buffers to the caller (``_lend``) and never replays
a graph whose lent results are still held. :class:`OutputSets` is the machine that decides,
at such a call, where the results come from instead; it is pure: a state, the action a held
call takes in it (:data:`ON_HELD`), and the state after each action's outcome (:data:`AFTER`),
checked against every transition there is (:data:`_NEXT`). The graphs themselves, the
captures and the hot path's replays are the signature's (``_signature.Signature``), which
performs the actions and reports their outcomes::

    LEND_LATER ──held──► capture again, lending ──ok──► (new graph) LENDING
         └────────────────────────────────────failed──► COPYING
    LENDING ──held──► twin ──ok──► TWINS ──held──► twin ... ──OUTPUT_SETS sets──► FULL
       │               ├─failed──► FULL (and the same call captures copies)
       │               └─the function rebinds what its graphs read──► (the twin) FULL
    FULL ──held──► capture again, returning copies ──ok──► (new graph) COPYING
                                                 └──failed──► EAGER_WHILE_HELD
    COPYING (lending the .grad its step drops) ──held──► capture again, copying all ──ok──► (new graph) COPYING
                                                                              └──failed──► EAGER_WHILE_HELD
    any ──release()──► RELEASED

A *twin* is the same call captured again beside the first graph, with output buffers of its
own (``_twin``): the sets alternate, each replayed while the others' results are held. A graph
returning copies still lends a train step's ``.grad`` where the step drops it at its next call
(``zero_grad()`` first, ``_policy.CapturePlan.lend_drops``): a loop keeping every loss pays a
copy of its losses, not of its gradients, at each call; a ``.grad`` kept past its step holds
that set, and the call is captured once more, copying everything.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from ._policy import CapturePlan

__all__ = ["AFTER", "ON_HELD", "OUTPUT_SETS", "Action", "Outcome", "OutputSets", "OutputState", "Step",
           "first_state"]

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


class Action(enum.Enum):
    """What a call does when the caller holds the results of every set."""

    LEND_NOW = "capture the call again, its results copied out of the pool into buffers it lends"
    TWIN = "capture the call again beside the graph, with output buffers of its own (a twin)"
    COPIES = "capture the call again, returning copies"
    COPIES_ALL = "capture the call again, returning copies of everything, the .grad a step drops included"
    EAGER = "run the function eagerly"


class Outcome(enum.Enum):
    """How an action's capture went."""

    MADE = "captured"
    FAILED = "the capture failed, or cannot lend"
    REPLACES = "captured; the function rebinds state its graphs read, so the new graph replaces them"


class Step(NamedTuple):
    """The state after an action's outcome."""

    state: OutputState
    new_graph: bool  # ``state`` is the new graph's (which takes the old one's place), else these sets'
    then: Action | None = None  # what the same call does next (None: it is served)


# the action of a call that finds every set held (in LEND_LATER: any call), by state; the others
# (STATIC, RELEASED) have one set that is never held back (COPYING's is held back only where it
# lends the .grad its step drops, and one is kept)
ON_HELD: dict[OutputState, Action] = {
    LEND_LATER: Action.LEND_NOW,
    LENDING: Action.TWIN,
    TWINS: Action.TWIN,
    FULL: Action.COPIES,
    COPYING: Action.COPIES_ALL,
    EAGER_WHILE_HELD: Action.EAGER,
}

# the state after each action's outcome (a twin made: TWINS or FULL by the sets there are, see OutputSets.after)
AFTER: dict[tuple[Action, Outcome], Step] = {
    (Action.LEND_NOW, Outcome.MADE): Step(LENDING, new_graph=True),
    (Action.LEND_NOW, Outcome.FAILED): Step(COPYING, new_graph=False),
    (Action.TWIN, Outcome.MADE): Step(TWINS, new_graph=False),
    (Action.TWIN, Outcome.REPLACES): Step(FULL, new_graph=True),
    (Action.TWIN, Outcome.FAILED): Step(FULL, new_graph=False, then=Action.COPIES),
    (Action.COPIES, Outcome.MADE): Step(COPYING, new_graph=True),
    (Action.COPIES, Outcome.FAILED): Step(EAGER_WHILE_HELD, new_graph=False, then=Action.EAGER),
    (Action.COPIES_ALL, Outcome.MADE): Step(COPYING, new_graph=True),
    (Action.COPIES_ALL, Outcome.FAILED): Step(EAGER_WHILE_HELD, new_graph=False, then=Action.EAGER),
}

# every transition of one graph's sets, in one place; checked at each (a state not listed has none)
_NEXT: dict[OutputState, frozenset[OutputState]] = {
    LEND_LATER: frozenset({COPYING, RELEASED}),
    LENDING: frozenset({TWINS, FULL, RELEASED}),
    TWINS: frozenset({TWINS, FULL, RELEASED}),
    FULL: frozenset({EAGER_WHILE_HELD, RELEASED}),
    EAGER_WHILE_HELD: frozenset({RELEASED}),
    COPYING: frozenset({EAGER_WHILE_HELD, RELEASED}),
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


class OutputSets:
    """The state of one graph's output sets and its transitions (see the module docstring)."""

    __slots__ = ("state",)

    def __init__(self, state: OutputState) -> None:
        self.state = state

    def on_held(self) -> Action:
        """The action of a call that finds every set held."""
        return ON_HELD[self.state]

    def after(self, action: Action, outcome: Outcome, sets: int = 1) -> Step:
        """The step after ``action``'s ``outcome`` (``sets``: the sets there are now); these
        sets move there unless the step is a new graph's."""
        step = AFTER[action, outcome]
        if step.state is TWINS and sets >= OUTPUT_SETS:
            step = step._replace(state=FULL)
        if not step.new_graph:
            self.move(step.state)
        return step

    def move(self, state: OutputState) -> None:
        """The only place the state changes."""
        if state not in _NEXT[self.state]:
            raise AssertionError(f"output sets: no transition {self.state.name} -> {state.name}")  # pragma: no cover
        self.state = state
