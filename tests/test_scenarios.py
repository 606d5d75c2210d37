"""Differential scenarios: programs with state across calls, through the wrapper and plainly.

Every focus registered by a ``tests/differential/scenario_*.py`` module is fuzzed here
(``test_scenario_fuzz[focus]``; on a GPU also with real CUDA graphs), with the knobs of
``tests/differential/fuzz.py`` (``GM_FUZZ_EXAMPLES``, ``GM_FUZZ_BACKEND``, ...). Each focus
gets ``GM_FUZZ_EXAMPLES`` times :data:`SHARE` cases. See ``tests/differential/scenarios.py``
for what is compared.

A focus named ``xfail_...`` draws programs that today's code gets wrong (issue #26): it runs
as a strict expected failure (``test_scenario_fuzz_known_failures``), so that it turns red
once fixed, when the fix renames it. ``pytest --runxfail`` prints what it finds.
"""

import importlib
import pkgutil

import pytest

import tests.differential as package
from tests.differential.fuzz import BACKEND, DEVICE, EXAMPLES, cuda_backend_or_skip, run_fuzz
from tests.differential.scenarios import REGISTRY, check_scenario

for _info in pkgutil.iter_modules(package.__path__):
    if _info.name.startswith("scenario_"):
        importlib.import_module(f"{package.__name__}.{_info.name}")

SHARE = 0.2  # of GM_FUZZ_EXAMPLES, per focus
KNOWN_CASES = 30  # at least, for a known failure: too few cases could miss it (a strict xpass)
FOCI = sorted(focus for focus in REGISTRY if not focus.startswith("xfail_"))
KNOWN = sorted(focus for focus in REGISTRY if focus.startswith("xfail_"))
KNOWN_REASON = "#26: this focus's generator finds silent differences of today's code; its fix renames the focus"


def _cases(focus: str) -> float:
    return EXAMPLES * SHARE if focus in FOCI else max(EXAMPLES * SHARE, KNOWN_CASES)


@pytest.mark.parametrize("focus", FOCI)
def test_scenario_fuzz(focus, capsys):
    cuda_backend_or_skip()
    run_fuzz(f"scenario {focus}", REGISTRY[focus](), check_scenario, EXAMPLES * SHARE, BACKEND, DEVICE, capsys)


@pytest.mark.xfail(strict=True, reason=KNOWN_REASON)
@pytest.mark.parametrize("focus", KNOWN)
def test_scenario_fuzz_known_failures(focus, capsys):
    cuda_backend_or_skip()
    run_fuzz(f"scenario {focus}", REGISTRY[focus](), check_scenario, _cases(focus), BACKEND, DEVICE, capsys)


@pytest.mark.cuda
@pytest.mark.parametrize("focus", FOCI + [pytest.param(f, marks=pytest.mark.xfail(strict=True, reason=KNOWN_REASON))
                                          for f in KNOWN])
def test_scenario_fuzz_on_cuda_graphs(focus, capsys):
    if BACKEND == "cuda":
        pytest.skip("GM_FUZZ_BACKEND=cuda: test_scenario_fuzz runs on the GPU already")
    run_fuzz(f"cuda scenario {focus}", REGISTRY[focus](), check_scenario, _cases(focus), "cuda", "cuda", capsys)


PLANTED = {
    "output:value": "out = out + 1",
    "state:length": "world['log'].append(1.0)",
    "identity": "out = world.setdefault('cached', out.clone()).copy_(out)",
}


@pytest.mark.parametrize("kind", sorted(PLANTED))
def test_the_harness_sees_a_planted_difference(kind):
    """A wrapped world that differs from the plain one in one observable way is reported."""
    from tests.differential.scenarios import Scenario, run_scenario

    src = f"""
def build():
    return {{"fn": lambda x: x * 2, "log": []}}

def step(world, f, i):
    out = f(torch.full((2,), float(i)))
    if isinstance(f, CudaGraphModule) and i >= 2:
        {PLANTED[kind]}
    return out

def observe(world):
    return world["log"]
"""
    outcome = run_scenario(Scenario(src=src, steps=5), "simulate", "cpu")
    assert [d.kind for d in outcome.diffs][:1] == [kind], outcome.report() if outcome.diffs else "no difference"


@pytest.mark.parametrize("at,change,reported", [
    (1, "torch.nextafter(out, out + 1)", True),  # every layout so far the same: bit for bit
    (2, "torch.nextafter(out, out + 1)", False),  # another layout than before: the last bits may differ
    (3, "torch.nextafter(out, out + 1)", False),  # (its graph may have been captured from either)
    (2, "out + 1e-3", True),  # and a wrong value is still one
])
def test_steps_of_another_layout_are_compared_up_to_the_last_bits(at, change, reported):
    """A step whose ``LAYOUTS`` entry is not that of every step before may round otherwise than
    eager (its graph computes in its capture's layout): the harness accepts the last bits there
    only."""
    from tests.differential.scenarios import Scenario, run_scenario

    src = f"""
LAYOUTS = ["row-major", "row-major", "x transposed", "row-major"]

def build():
    return {{"fn": lambda x: x * 3}}

def step(world, f, i):
    out = f(torch.full((2,), i + 0.1))
    if isinstance(f, CudaGraphModule) and i == {at}:
        out = {change}
    return out
"""
    outcome = run_scenario(Scenario(src=src, steps=4, warmup=1), "simulate", "cpu")
    assert [d.kind for d in outcome.diffs][:1] == (["output:value"] if reported else []), outcome.report()
