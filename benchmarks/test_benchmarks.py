"""pytest-benchmark suite: every workload under every variant, per-call time.

On a GPU each round times ``CALLS`` back-to-back calls (``out = call()``: each result is
held until the next call returns, as in a loop; ``graphmodule_dropped``'s call drops it) and
one synchronisation (``side_by_side.py`` divides by ``CALLS``). A round returns nothing, so
that no result outlives its round (pytest-benchmark keeps a round's return value through the
next: the held rows would hold two). Without CUDA the suite runs in a short mode: the GPU-only
variants are skipped and graphmodule runs its eager fallback, so the suite keeps working in CI
without timing anything meaningful.
"""

import os
import warnings

import pytest
import torch

from workloads import VARIANTS, WORKLOADS, run_context, variant

HAS_CUDA = torch.cuda.is_available()
CALLS = int(os.environ.get("GRAPHMODULE_BENCH_CALLS", "200" if HAS_CUDA else "2"))
ROUNDS = int(os.environ.get("GRAPHMODULE_BENCH_ROUNDS", "15" if HAS_CUDA else "1"))
GPU_ONLY = {"floor", "floor_clone", "compile", "tensordict"}


@pytest.mark.parametrize("variant_name", VARIANTS)
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_bench(benchmark, workload, variant_name):
    if not HAS_CUDA and variant_name in GPU_ONLY:
        pytest.skip("GPU-only variant")
    if not HAS_CUDA and workload in ("policy_b16384", "sac_update_b256"):
        pytest.skip("too slow for the short CPU mode")
    device = torch.device("cuda" if HAS_CUDA else "cpu")
    case = WORKLOADS[workload](device)
    with run_context(case), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no-CUDA fallback warnings; compile chatter
        call = variant(variant_name, case)
        if call is None:
            pytest.skip("no floor for this workload (its floor is its plain twin's)")
        for _ in range(case.warmup + 3):  # warmup, capture, first replays
            call()
        sync = torch.cuda.synchronize if HAS_CUDA else (lambda: None)
        sync()

        def many():
            out = None
            for _ in range(CALLS):
                out = call()  # as a loop does: the last result is held while the next call runs
            sync()
            del out

        benchmark.extra_info.update(calls=CALLS, workload=workload, variant=variant_name)
        benchmark.pedantic(many, rounds=ROUNDS, iterations=1, warmup_rounds=1)
