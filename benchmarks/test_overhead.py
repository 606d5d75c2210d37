"""pytest-benchmark suite of ``overhead.py``: the wrapper's host cost per call on a replay that
does nothing, held and dropped, against the hand-written loop (any machine; the table is
``python benchmarks/overhead.py``). Run as tests (benchmarks disabled), each runs a few calls."""

import os
import warnings

import pytest
import torch

from overhead import CALLINGS, VARIANTS, WORKLOADS, case, floor_call, graphmodule_call

CALLS = int(os.environ.get("GRAPHMODULE_BENCH_CALLS", "200"))


@pytest.mark.parametrize("calling", CALLINGS)
@pytest.mark.parametrize("variant_name", VARIANTS)
@pytest.mark.parametrize("workload", WORKLOADS)
def test_overhead(benchmark, workload, variant_name, calling):
    c = case(workload)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # backend="simulate" on a machine with CUDA: none expected
        call = floor_call(c, calling == "held") if variant_name == "floor" else graphmodule_call(c)

        def held():
            out = None
            for _ in range(CALLS):
                out = call()  # held until the next call returns, as a loop holds it
            del out

        def dropped():
            for _ in range(CALLS):
                call()

        benchmark.extra_info.update(calls=CALLS, workload=workload, variant=variant_name, calling=calling)
        benchmark.pedantic(held if calling == "held" else dropped, rounds=5, iterations=1, warmup_rounds=1)


def test_graphmodule_held_calls_alternate_between_two_output_sets():
    """What the held rows time: the default outputs serve a held result's next call from the
    graph's twin, and the calls after it alternate between the two, with no capture more."""
    call = graphmodule_call(case("policy"))
    g = call.func
    with torch.no_grad():
        replays = g.stats.replays
        out = None
        for _ in range(10):
            out = call()
        del out
    assert (g.stats.captures, g.stats.twin_captures, g.stats.copy_recaptures) == (1, 1, 0)
    assert g.stats.replays == replays + 10
    assert g.explain().count("outputs: TWINS, 2 sets") == 1
