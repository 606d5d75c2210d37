"""The fuzz runner shared by the differential tests: hypothesis settings and the environment knobs.

Environment (see ``tests/test_differential.py`` for the full list): ``GM_FUZZ_EXAMPLES``,
``GM_FUZZ_BACKEND``, ``GM_FUZZ_SEED``, ``GM_FUZZ_SHRINK_RUNS``, ``GM_FUZZ_ALL_BUGS``,
``GM_FUZZ_SECONDS``, ``GM_FUZZ_PROGRESS``, ``GM_FUZZ_PROFILE``, ``GM_FUZZ_OUTPUTS``.
"""

import os
import time

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, seed, settings

__all__ = ["BACKEND", "DEVICE", "EXAMPLES", "OUTPUTS", "cuda_backend_or_skip", "run_fuzz"]

BACKEND = os.environ.get("GM_FUZZ_BACKEND", "simulate")
OUTPUTS = os.environ.get("GM_FUZZ_OUTPUTS", "clone")
DEVICE = "cuda" if BACKEND == "cuda" else "cpu"
EXAMPLES = int(os.environ.get("GM_FUZZ_EXAMPLES", "150"))
SEED = os.environ.get("GM_FUZZ_SEED")
ALL_BUGS = os.environ.get("GM_FUZZ_ALL_BUGS", "0") == "1"
SHRINK_RUNS = int(os.environ.get("GM_FUZZ_SHRINK_RUNS", "200"))  # bounds the time a failure takes
PROFILE = os.environ.get("GM_FUZZ_PROFILE")  # a path: cProfile of the cases after the 20th, written there
PROGRESS = os.environ.get("GM_FUZZ_PROGRESS")  # a path: the count so far, rewritten every 100 cases
SECONDS = float(os.environ.get("GM_FUZZ_SECONDS", "0"))  # > 0: stop a fuzz test cleanly after this long
if PROGRESS:  # a long run's stacks on SIGUSR1 (scripts/gpu_fuzz.sh sends it before stopping a worker)
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1, all_threads=True)

def _settings(n: int) -> settings:
    return settings(
        max_examples=n,
        deadline=None,
        derandomize=SEED is None,  # CI: the same cases on every run
        database=None,
        print_blob=False,
        # GM_FUZZ_ALL_BUGS=1: shrink one repro per kind of difference (slow: minutes)
        report_multiple_bugs=ALL_BUGS,
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


def run_fuzz(name: str, strategy, check, n: float, backend: str, device: str, capsys) -> None:
    """Run ``check`` on ``n`` generated cases; when one fails, shrink it within SHRINK_RUNS more runs."""
    n = max(1, round(n))
    budget = n + SHRINK_RUNS
    deadline = time.monotonic() + SECONDS if SECONDS > 0 else None
    count = [0]
    failures: dict[str, BaseException] = {}

    @_settings(n)
    @given(strategy)
    def inner(case):
        key = repr(case)
        if key in failures:  # hypothesis replays the smallest failure at the end
            raise failures[key]
        if count[0] >= budget:  # shrinking budget spent: keep the smallest failure found so far
            return
        if deadline is not None and time.monotonic() > deadline and not failures:
            # a long run's time is up: end the session cleanly (a signal may land mid-capture)
            pytest.exit(f"GM_FUZZ_SECONDS={SECONDS:g} reached", returncode=0)
        count[0] += 1
        if profiler is not None and count[0] == 20:  # imports and first captures done
            profiler.enable()
        if PROGRESS and count[0] % 100 == 0:
            with open(PROGRESS, "w") as f:
                f.write(f"[differential] {name}: {count[0]} cases run (backend={backend}, in progress)\n")
        try:
            check(case, backend, device)
        except Exception as exc:
            failures[key] = exc
            raise

    if SEED is not None:
        inner = seed(int(SEED))(inner)
    profiler = None
    if PROFILE:
        import cProfile
        profiler = cProfile.Profile()
    try:
        inner()
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(PROFILE)
        with capsys.disabled():
            print(f"\n[differential] {name}: {count[0]} cases run (backend={backend})", flush=True)


def cuda_backend_or_skip() -> None:
    if BACKEND == "cuda" and not torch.cuda.is_available():
        pytest.skip("GM_FUZZ_BACKEND=cuda needs a CUDA GPU")
