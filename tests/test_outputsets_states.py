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
