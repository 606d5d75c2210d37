"""OutputSets: where a graph's results come from, as ``explain()`` reports it, call by call.

``test_lend`` checks that results held every way keep their values; these tests follow the
state machine of ``_outputsets`` through its transitions, and that it keeps no reference to
the wrapper (a graph would otherwise keep its wrapper alive until the collector runs).
"""

import gc
import weakref

import pytest
import torch

from graphmodule import CudaGraphModule


def f(x):
    return x * 2 + 1


def _outputs(g, n=0):
    return [line.strip() for line in g.explain().splitlines() if line.strip().startswith("outputs:")][n]


def _state(g, n=0):
    return _outputs(g, n).split()[1].rstrip(",")


def _captured(fn=f, **options):
    g = CudaGraphModule(fn, warmup=1, backend="simulate", **options)
    g(torch.zeros(4))
    g(torch.zeros(4))
    return g


@pytest.mark.parametrize("outputs, state", [("safe", "LENDING"), ("clone", "COPYING"), ("static", "STATIC")])
def test_the_first_state_follows_the_outputs_option(outputs, state):
    assert _state(_captured(outputs=outputs)) == state


def test_results_held_move_the_sets_from_lending_through_twins_to_copies():
    g = _captured()
    seen, kept = [], []
    for i in range(5):
        kept.append(g(torch.full((4,), float(i))))  # every result held
        seen.append(_outputs(g).split(" (")[0])
    assert seen == ["outputs: LENDING", "outputs: TWINS, 2 sets", "outputs: FULL, 3 sets", "outputs: COPYING",
                    "outputs: COPYING"]
    assert g.stats.twin_captures == 2 and g.stats.copy_recaptures == 1 and g.stats.graphs == 1
    for i, out in enumerate(kept):
        torch.testing.assert_close(out, f(torch.full((4,), float(i))))


def test_a_free_set_is_replayed_without_a_capture():
    g = _captured()
    a = g(torch.ones(4))
    b = g(torch.ones(4))  # `a` held: a twin
    del a
    c = g(torch.ones(4))  # `b` held, the first set free
    assert _outputs(g).startswith("outputs: TWINS, 2 sets") and g.stats.twin_captures == 1
    torch.testing.assert_close(b, c)


def test_a_new_signature_in_a_used_pool_lends_from_its_second_call():
    g = _captured(max_graphs=2)
    x = torch.ones(3)
    g(x)  # its warmup
    g(x)  # its capture: copies, the pool already held a graph
    assert _state(g) == "LEND_LATER" and _state(g, 1) == "LENDING"
    g(x)
    assert _state(g) == "LENDING" and g.stats.lending_captures == 1


def test_explain_says_what_each_state_means():
    assert _outputs(_captured()) == ("outputs: LENDING (lent from the graph's buffers; when a caller holds them "
                                     "at a call, a twin is captured)")


def _drive(g):
    kept = [g(torch.full((4,), float(i))) for i in range(5)]  # twins, then a graph returning copies
    assert g.stats.copy_recaptures == 1
    return kept


@pytest.mark.parametrize("options", [{}, {"max_graphs": 2}])
def test_a_wrapper_is_freed_without_the_collector(options):
    """Output sets capture again through the wrapper, which they hold weakly: deleting the
    wrapper frees it (and its graphs) at once, with results still held."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        g = _captured(**options)
        kept = _drive(g)
        if options:
            g(torch.ones(3))
            g(torch.ones(3))  # a graph lending later
        ref = weakref.ref(g)
        del g
        assert ref() is None
        torch.testing.assert_close(kept[0], f(torch.zeros(4)))
    finally:
        if enabled:
            gc.enable()


# -- the machine alone (pure: states, actions, outcomes) ------------------------------------
from graphmodule._outputsets import (  # noqa: E402
    AFTER,
    ON_HELD,
    OUTPUT_SETS,
    Action,
    Outcome,
    OutputSets,
    OutputState,
)

S = OutputState


@pytest.mark.parametrize("state, action", [
    (S.LEND_LATER, Action.LEND_NOW), (S.LENDING, Action.TWIN), (S.TWINS, Action.TWIN), (S.FULL, Action.COPIES),
    (S.EAGER_WHILE_HELD, Action.EAGER),
])
def test_the_action_of_a_call_that_finds_every_set_held(state, action):
    assert OutputSets(state).on_held() is action


def test_states_with_one_set_never_held_back_have_no_action():
    # (COPYING's one set is held back where it lends the .grad a train step drops, and one is kept)
    assert set(ON_HELD) == set(S) - {S.STATIC, S.RELEASED}
    assert ON_HELD[S.COPYING] is Action.COPIES_ALL


# (state, action, outcome, sets there are after) -> (state, new graph, next action of the same call)
STEPS = [
    (S.LEND_LATER, Action.LEND_NOW, Outcome.MADE, 1, (S.LENDING, True, None)),
    (S.LEND_LATER, Action.LEND_NOW, Outcome.FAILED, 1, (S.COPYING, False, None)),
    (S.LENDING, Action.TWIN, Outcome.MADE, 2, (S.TWINS, False, None)),
    (S.TWINS, Action.TWIN, Outcome.MADE, OUTPUT_SETS, (S.FULL, False, None)),
    (S.LENDING, Action.TWIN, Outcome.REPLACES, 1, (S.FULL, True, None)),
    (S.LENDING, Action.TWIN, Outcome.FAILED, 1, (S.FULL, False, Action.COPIES)),
    (S.TWINS, Action.TWIN, Outcome.FAILED, 2, (S.FULL, False, Action.COPIES)),
    (S.FULL, Action.COPIES, Outcome.MADE, 3, (S.COPYING, True, None)),
    (S.FULL, Action.COPIES, Outcome.FAILED, 3, (S.EAGER_WHILE_HELD, False, Action.EAGER)),
    (S.COPYING, Action.COPIES_ALL, Outcome.MADE, 1, (S.COPYING, True, None)),
    (S.COPYING, Action.COPIES_ALL, Outcome.FAILED, 1, (S.EAGER_WHILE_HELD, False, Action.EAGER)),
]


@pytest.mark.parametrize("state, action, outcome, sets, expected", STEPS)
def test_the_step_after_each_outcome(state, action, outcome, sets, expected):
    machine = OutputSets(state)
    step = machine.after(action, outcome, sets)
    assert tuple(step) == expected
    # these sets move, unless the step is a new graph's (the old graph is released then)
    assert machine.state is (state if step.new_graph else step.state)


def test_every_outcome_of_every_action_has_a_step():
    assert {(a, o) for _, a, o, _, _ in STEPS} == set(AFTER)
    assert {a for a, _ in AFTER} == set(Action) - {Action.EAGER}  # (an eager call has no outcome)


def test_a_move_not_in_the_table_is_refused():
    with pytest.raises(AssertionError, match="no transition COPYING -> LENDING"):
        OutputSets(S.COPYING).move(S.LENDING)
