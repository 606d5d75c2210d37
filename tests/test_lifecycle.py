"""The wrapper's life cycle (``_lifecycle``): every transition of its table reached through the
public API, with the state and (in ``eager``) its reason where users see them; a transition
outside the table refused."""

import array

import pytest
import torch
from torch import nn

from graphmodule import CaptureError, CudaGraphModule, State
from graphmodule._lifecycle import TRANSITIONS, EagerReason, Event, Phase

NO_CUDA = not torch.cuda.is_available()
HOST_SYNC = "CUDA error: operation not permitted when stream is capturing"


class Trip:
    """Makes the function's next run fail as a capture fails, once armed (a count kept in an
    array written in place: no Python state a capture would refuse)."""

    def __init__(self):
        self._left = array.array("q", [0])

    def arm(self):
        self._left[0] = 1

    def __call__(self) -> bool:
        if self._left[0] > 0:
            self._left[0] -= 1
            return True
        return False


def _backend(phase, event):
    """The backend a wrapper needs to reach ``phase`` and take ``event`` there."""
    if Event.CHECKED_NO_CUDA in (event,) or phase is Phase.EAGER_NO_CUDA:
        return "auto"
    if Event.CHECKED_EAGER in (event,) or phase is Phase.EAGER_BACKEND:
        return "eager"
    return "simulate"


class Scene:
    """A wrapper over ``lin`` (its weight is what a graph reads) and a trip that fails a capture,
    with ``warmup=1`` and room for a second signature (``max_graphs=2``): calls of one row
    (the first signature) and of three rows (the second)."""

    def __init__(self, phase, event):
        self.lin, self.trip = nn.Linear(2, 2), Trip()
        lin, trip = self.lin, self.trip

        def fn(x):
            if trip():
                raise RuntimeError(HOST_SYNC)
            return lin(x)

        self.fn = fn
        on_failure = "eager" if Event.FAILED_TO_EAGER is event or phase is Phase.EAGER_AFTER_FAILURE else "raise"
        options = dict(warmup=1, max_graphs=2, on_stale="recapture", on_capture_failure=on_failure,
                       backend=_backend(phase, event))
        if options["backend"] == "auto":
            with pytest.warns(UserWarning, match="CUDA is not available"):
                self.g = CudaGraphModule(fn, **options)
        else:
            self.g = CudaGraphModule(fn, **options)
        self.rows = 1  # the signature the next capture takes

    def call(self):
        x = torch.ones(self.rows, 2)
        out = self.g(x)
        torch.testing.assert_close(out, self.lin(x))  # the plain call's result, whatever the phase
        return out

    def capture(self):
        """A signature's warmup call, then its capture."""
        for _ in range(2):
            self.call()
        self.rows = 3

    def fail_capture(self):
        """A signature's warmup call, then its capture, which fails."""
        self.call()
        self.trip.arm()
        if self.g.options.on_capture_failure == "raise":
            with pytest.raises(CaptureError, match="Likely cause \\(host-sync\\)"):
                self.call()
        else:
            with pytest.warns(UserWarning, match="runs eagerly from now on"):
                self.call()
        self.rows = 3

    def reach(self, phase):
        if phase in (Phase.CAPTURED, Phase.EAGER_NO_CUDA, Phase.EAGER_BACKEND):
            self.capture()
        elif phase in (Phase.FAILED, Phase.EAGER_AFTER_FAILURE):
            self.fail_capture()

    def fire(self, event):
        if event in (Event.CAPTURED, Event.CHECKED_NO_CUDA, Event.CHECKED_EAGER):
            self.capture()
        elif event in (Event.FAILED, Event.FAILED_TO_EAGER):
            self.fail_capture()
        elif event is Event.ALL_STALE:
            with torch.no_grad():
                self.lin.weight = nn.Parameter(self.lin.weight * 2)  # read by the only graph: stale
            self.rows = 1
            self.call()  # dropped, then this call warms up again
        else:
            self.g.reset()

    def shows(self, phase):
        """What users see of the phase: ``state``, and ``explain()``'s first line."""
        assert self.g.state == phase.state and isinstance(self.g.state, State)
        assert self.g.explain().splitlines()[0].startswith(f"CudaGraphModule(fn): state {phase.describe()}, ")


def _needs(phase, event):
    if _backend(phase, event) == "auto" and not NO_CUDA:
        pytest.skip("the no-CUDA fallback (backend='auto' without CUDA)")


@pytest.fixture
def moves(monkeypatch):
    """Every ``(phase, event)`` the wrappers move by, in order."""
    seen, after = [], Phase.after

    def recorded(phase, event):
        seen.append((phase, event))
        return after(phase, event)

    monkeypatch.setattr(Phase, "after", recorded)
    return seen


TABLE = [(phase, event) for phase, events in TRANSITIONS.items() for event in events]

# what users see after each transition, written out apart from the table (which must say the same)
SHOWN = {
    "WARMUP": {"CAPTURED": "captured", "CHECKED_NO_CUDA": "eager (no CUDA)", "CHECKED_EAGER": "eager (backend='eager')",
               "FAILED": "failed", "FAILED_TO_EAGER": "eager (a capture failed, on_capture_failure='eager')",
               "RESET": "warmup"},
    "CAPTURED": {"CAPTURED": "captured", "FAILED": "failed",
                 "FAILED_TO_EAGER": "eager (a capture failed, on_capture_failure='eager')",
                 "ALL_STALE": "warmup", "RESET": "warmup"},
    "EAGER_NO_CUDA": {"CHECKED_NO_CUDA": "eager (no CUDA)", "FAILED": "failed",
                      "FAILED_TO_EAGER": "eager (a capture failed, on_capture_failure='eager')",
                      "ALL_STALE": "warmup", "RESET": "warmup"},
    "EAGER_BACKEND": {"CHECKED_EAGER": "eager (backend='eager')", "FAILED": "failed",
                      "FAILED_TO_EAGER": "eager (a capture failed, on_capture_failure='eager')",
                      "ALL_STALE": "warmup", "RESET": "warmup"},
    "EAGER_AFTER_FAILURE": {"ALL_STALE": "eager (a capture failed, on_capture_failure='eager')", "RESET": "warmup"},
    "FAILED": {"RESET": "warmup"},
}


@pytest.mark.parametrize("phase, event", TABLE, ids=[f"{p.name}-{e.name}" for p, e in TABLE])
def test_every_transition_is_reached_through_the_public_api(phase, event, moves):
    _needs(phase, event)
    scene = Scene(phase, event)
    scene.reach(phase)
    scene.shows(phase)
    del moves[:]
    scene.fire(event)
    assert moves[-1] == (phase, event)
    scene.shows(TRANSITIONS[phase][event])
    assert TRANSITIONS[phase][event].describe() == SHOWN[phase.name][event.name]


def test_the_table_has_the_transitions_users_see():
    assert {(p.name, e.name) for p, e in TABLE} == {(p, e) for p, events in SHOWN.items() for e in events}


def test_the_table_has_every_phase_and_leads_only_to_phases():
    assert set(TRANSITIONS) == set(Phase)
    assert all(isinstance(to, Phase) for events in TRANSITIONS.values() for to in events.values())
    # every phase is reached from WARMUP, and reset() leads every phase back to it
    assert {to for events in TRANSITIONS.values() for to in events.values()} == set(Phase)
    assert all(events[Event.RESET] is Phase.WARMUP for events in TRANSITIONS.values())


OUTSIDE = [(phase, event) for phase in Phase for event in Event if event not in TRANSITIONS[phase]]


@pytest.mark.parametrize("phase, event", OUTSIDE, ids=[f"{p.name}-{e.name}" for p, e in OUTSIDE])
def test_a_transition_outside_the_table_is_refused(phase, event):
    with pytest.raises(AssertionError) as info:
        phase.after(event)
    assert str(info.value) == f"life cycle: no transition from {phase.name} on {event.name}"


class TestEagerReason:
    """``explain()`` says why a wrapper runs eagerly; ``state`` stays ``"eager"``."""

    @staticmethod
    def _first_line(g):
        x = torch.ones(3)
        for _ in range(2):
            g(x)
        assert g.state == "eager"
        return g.explain().splitlines()[0]

    def test_backend_eager(self):
        g = CudaGraphModule(lambda x: x + 1, warmup=1, backend="eager")
        assert self._first_line(g).startswith("CudaGraphModule(<lambda>): state eager (backend='eager'), GraphStats(")

    @pytest.mark.skipif(not NO_CUDA, reason="checks the no-CUDA fallback")
    def test_no_cuda(self):
        with pytest.warns(UserWarning, match="CUDA is not available"):
            g = CudaGraphModule(lambda x: x + 1, warmup=1)
        assert self._first_line(g).startswith("CudaGraphModule(<lambda>): state eager (no CUDA), GraphStats(")

    def test_a_failed_capture(self):
        trip = Trip()

        def fn(x):
            if trip():
                raise RuntimeError(HOST_SYNC)
            return x + 1

        g = CudaGraphModule(fn, warmup=1, backend="simulate", on_capture_failure="eager")
        g(torch.ones(3))
        trip.arm()
        with pytest.warns(UserWarning, match="runs eagerly from now on"):
            line = self._first_line(g)
        assert line.startswith(
            "CudaGraphModule(fn): state eager (a capture failed, on_capture_failure='eager'), GraphStats(")

    def test_every_eager_phase_has_a_reason_and_no_other_does(self):
        for phase in Phase:
            assert (phase.reason is not None) == (phase.state is State.EAGER)
        assert {phase.reason for phase in Phase} - {None} == set(EagerReason)
