"""A wrapper's life cycle: its :class:`State`, the :class:`Phase` behind it (in ``EAGER``, why
it runs eagerly) and every transition, in one table (:data:`TRANSITIONS`)::

    WARMUP ──CAPTURED──► CAPTURED ──CAPTURED (another signature)──► CAPTURED
      │                      └──ALL_STALE (every graph dropped, on_stale="recapture")──► WARMUP
      ├──CHECKED_NO_CUDA──► EAGER (no CUDA)       ──ALL_STALE──► WARMUP
      ├──CHECKED_EAGER────► EAGER (backend='eager') ──ALL_STALE──► WARMUP
      │     (without graphs: a simulated capture checked the signature's call, which runs eagerly)
      ├──FAILED──────────► FAILED (calls raise)                    (from CAPTURED and EAGER too)
      └──FAILED_TO_EAGER─► EAGER (a capture failed, on_capture_failure='eager': no more captures;
                                  its ALL_STALE stays there)       (from CAPTURED and EAGER too)
    any ──RESET──► WARMUP

The wrapper (``_module``, ``_capturing``) moves its phase only through :meth:`Phase.after`,
which refuses a transition the table does not have (an internal error: a bug of the wrapper,
not of its caller). Warmup calls do not move it: they are counted per signature by the
wrapper's graphs (``_graphs.Warming``).
"""

from __future__ import annotations

import enum

from ._runners import Kind

__all__ = ["EagerReason", "Event", "Phase", "State", "TRANSITIONS", "capture_event"]


class State(str, enum.Enum):
    """Where a :class:`~graphmodule.CudaGraphModule` is in its life.

    ``WARMUP → CAPTURED`` on the first call after warmup; ``EAGER`` without CUDA (or
    after a failed capture with ``on_capture_failure="eager"``): every call runs
    eagerly, still checked (``explain()`` says why); ``FAILED`` after a failed capture:
    calls raise until ``reset()``. Compares equal to its value (``state == "captured"``).
    """

    WARMUP = "warmup"
    CAPTURED = "captured"
    EAGER = "eager"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


class EagerReason(enum.Enum):
    """Why a wrapper in ``State.EAGER`` runs its calls eagerly (the words of ``explain()``)."""

    NO_CUDA = "no CUDA"
    BACKEND = "backend='eager'"
    CAPTURE_FAILED = "a capture failed, on_capture_failure='eager'"


class Phase(enum.Enum):
    """The wrapper's place in its life: its public :class:`State` and, in ``EAGER``, its
    :class:`EagerReason` (``None`` in the other states)."""

    WARMUP = (State.WARMUP, None)
    CAPTURED = (State.CAPTURED, None)
    FAILED = (State.FAILED, None)
    EAGER_NO_CUDA = (State.EAGER, EagerReason.NO_CUDA)
    EAGER_BACKEND = (State.EAGER, EagerReason.BACKEND)
    EAGER_AFTER_FAILURE = (State.EAGER, EagerReason.CAPTURE_FAILED)

    def __init__(self, state: State, reason: EagerReason | None) -> None:
        self.state = state
        self.reason = reason

    def describe(self) -> str:
        """``explain()``'s words: ``captured``, ``eager (no CUDA)``..."""
        return self.state.value if self.reason is None else f"{self.state.value} ({self.reason.value})"

    def after(self, event: Event) -> Phase:
        """The phase ``event`` moves this one to; raises where the table has no such transition."""
        following = TRANSITIONS[self].get(event)
        if following is None:
            raise AssertionError(f"life cycle: no transition from {self.name} on {event.name}")
        return following


class Event(enum.Enum):
    """What moves a wrapper from one phase to another."""

    CAPTURED = "a capture made a graph"
    CHECKED_NO_CUDA = "without CUDA, a simulated capture checked a call; its signature runs eagerly"
    CHECKED_EAGER = "with backend='eager', a simulated capture checked a call; its signature runs eagerly"
    FAILED = "a capture failed, on_capture_failure='raise'"
    FAILED_TO_EAGER = "a capture failed, on_capture_failure='eager'"
    ALL_STALE = "every graph held was stale and was dropped (on_stale='recapture')"
    RESET = "reset()"


_P, _E = Phase, Event

#: every transition, in one place: for each phase, the events it takes and where they lead
TRANSITIONS: dict[Phase, dict[Event, Phase]] = {
    _P.WARMUP: {_E.CAPTURED: _P.CAPTURED, _E.CHECKED_NO_CUDA: _P.EAGER_NO_CUDA, _E.CHECKED_EAGER: _P.EAGER_BACKEND,
                _E.FAILED: _P.FAILED, _E.FAILED_TO_EAGER: _P.EAGER_AFTER_FAILURE, _E.RESET: _P.WARMUP},
    _P.CAPTURED: {_E.CAPTURED: _P.CAPTURED, _E.FAILED: _P.FAILED, _E.FAILED_TO_EAGER: _P.EAGER_AFTER_FAILURE,
                  _E.ALL_STALE: _P.WARMUP, _E.RESET: _P.WARMUP},
    _P.EAGER_NO_CUDA: {_E.CHECKED_NO_CUDA: _P.EAGER_NO_CUDA, _E.FAILED: _P.FAILED,
                       _E.FAILED_TO_EAGER: _P.EAGER_AFTER_FAILURE, _E.ALL_STALE: _P.WARMUP, _E.RESET: _P.WARMUP},
    _P.EAGER_BACKEND: {_E.CHECKED_EAGER: _P.EAGER_BACKEND, _E.FAILED: _P.FAILED,
                       _E.FAILED_TO_EAGER: _P.EAGER_AFTER_FAILURE, _E.ALL_STALE: _P.WARMUP, _E.RESET: _P.WARMUP},
    # no capture is tried again: a signature no graph has runs eagerly, with no transition
    _P.EAGER_AFTER_FAILURE: {_E.ALL_STALE: _P.EAGER_AFTER_FAILURE, _E.RESET: _P.WARMUP},
    # calls raise before any capture or staleness check: only reset() leaves it
    _P.FAILED: {_E.RESET: _P.WARMUP},
}


def capture_event(kind: Kind) -> Event:
    """What a capture that succeeded means for a runner of ``kind``: a graph, or (a runner
    without graphs) a call checked as a capture would check it, then run eagerly."""
    if kind.captures:
        return Event.CAPTURED
    return Event.CHECKED_NO_CUDA if kind is Kind.NO_CUDA else Event.CHECKED_EAGER
