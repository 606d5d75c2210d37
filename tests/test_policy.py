"""The output policy and the plan of a capture (``_policy``): one table of what each policy
asks of each capture, the plan once captured, and the first state of a graph's output sets.

A new policy adds its rows here (and a member and a branch in ``_policy``)."""

import pytest
import torch

from graphmodule import CudaGraphModule
from graphmodule._options import Options
from graphmodule._outputsets import OutputState, first_state
from graphmodule._policy import Capture, CapturePlan, Facts, OutputPolicy, plan_capture

SAFE, CLONE, STATIC = OutputPolicy
FIRST, LENDING, COPYING, COPYING_ALL, CHECKING = Capture

# (policy, facts) -> (clone, lend, alone, beside, lend_later, lend_drops)
PLANS = [
    # a first capture: "safe" lends from memory of its own...
    (SAFE, Facts(FIRST), (True, True, True, False, False, False)),
    (SAFE, Facts(FIRST, layer=True), (True, True, True, False, False, False)),
    # ...unless the pool holds a graph: copies until the next call captures it again to lend
    (SAFE, Facts(FIRST, pool_in_use=True), (True, False, False, False, True, False)),
    # (a likely layer lends at once, in a pool of its own: its activations outlive the replay)
    (SAFE, Facts(FIRST, layer=True, pool_in_use=True), (True, True, True, False, False, False)),
    # (a torch that cannot tell whether a result is held: copies)
    (SAFE, Facts(FIRST, lendable=False), (True, False, False, False, False, False)),
    (SAFE, Facts(FIRST, layer=True, pool_in_use=True, lendable=False), (True, False, True, False, False, False)),
    (CLONE, Facts(FIRST), (True, False, False, False, False, False)),
    (CLONE, Facts(FIRST, pool_in_use=True), (True, False, False, False, False, False)),
    (CLONE, Facts(FIRST, layer=True), (True, False, True, False, False, False)),
    (STATIC, Facts(FIRST), (False, False, False, False, False, False)),
    (STATIC, Facts(FIRST, pool_in_use=True), (False, False, False, False, False, False)),
    (STATIC, Facts(FIRST, layer=True), (False, False, True, False, False, False)),
    # captured again to lend: a twin beside the graph; a layer's whole, in a pool of its own
    (SAFE, Facts(LENDING), (True, True, False, True, False, False)),
    (SAFE, Facts(LENDING, pool_in_use=True), (True, True, False, True, False, False)),
    (SAFE, Facts(LENDING, layer=True), (True, True, True, False, False, False)),
    (SAFE, Facts(LENDING, lendable=False), (True, False, False, True, False, False)),
    # captured again to return copies (every set held)...
    (SAFE, Facts(COPYING), (True, False, False, False, False, False)),
    (SAFE, Facts(COPYING, layer=True), (True, False, True, False, False, False)),
    # ...a train step's: the .grad it drops still lent, from memory of its own (a layer's .grad
    # are its backward's: nothing to lend)
    (SAFE, Facts(COPYING, drops=True), (True, False, True, False, False, True)),
    (SAFE, Facts(COPYING, drops=True, lendable=False), (True, False, False, False, False, False)),
    (SAFE, Facts(COPYING, drops=True, layer=True), (True, False, True, False, False, False)),
    # ...and copies of everything where such a .grad was kept past its step
    (SAFE, Facts(COPYING_ALL), (True, False, False, False, False, False)),
    (SAFE, Facts(COPYING_ALL, layer=True), (True, False, True, False, False, False)),
    # without CUDA, the simulated capture that checks a signature: its one result is the call's
    *[(policy, Facts(CHECKING, layer=layer, pool_in_use=True), (True, False, False, False, False, False))
      for policy in OutputPolicy for layer in (False, True)],
]


@pytest.mark.parametrize("policy, facts, expected", PLANS, ids=lambda v: getattr(v, "name", None))
def test_plan_of_a_capture(policy, facts, expected):
    plan = plan_capture(policy, facts)
    assert (plan.clone, plan.lend, plan.alone, plan.beside, plan.lend_later, plan.lend_drops) == expected
    assert (plan.policy, plan.capture) == (policy, facts.capture)


def test_every_policy_and_capture_has_rows():
    assert {(p, f.capture) for p, f, _ in PLANS} >= {(p, c) for p in OutputPolicy for c in (FIRST, CHECKING)}
    assert {f.capture for _, f, _ in PLANS} == set(Capture)


def test_a_plan_is_a_frozen_record():
    plan = plan_capture(SAFE, Facts(FIRST))
    with pytest.raises(AttributeError):
        plan.lend = False
    assert plan == plan_capture(SAFE, Facts(FIRST)) and hash(plan) == hash(plan_capture(SAFE, Facts(FIRST)))


# (plan facts, outputs, layer) -> (lend, lend_later) once captured
SETTLED = [
    (Facts(FIRST), True, False, (True, False)),
    (Facts(FIRST), False, False, (False, False)),  # nothing returned: nothing to lend
    (Facts(FIRST), True, True, (True, False)),
    (Facts(FIRST, pool_in_use=True), True, False, (False, True)),
    (Facts(FIRST, pool_in_use=True), True, True, (False, False)),  # a layer does not wait to lend
    (Facts(FIRST, pool_in_use=True), False, False, (False, False)),
    (Facts(LENDING), False, False, (False, False)),
]


@pytest.mark.parametrize("facts, outputs, layer, expected", SETTLED)
def test_plan_once_captured(facts, outputs, layer, expected):
    plan = plan_capture(SAFE, facts).settled(outputs=outputs, layer=layer)
    assert (plan.lend, plan.lend_later) == expected


def test_a_plan_settled_unchanged_is_itself():
    plan = plan_capture(CLONE, Facts(FIRST))
    assert plan.settled(outputs=True, layer=True) is plan


@pytest.mark.parametrize("plan, state", [
    (CapturePlan(SAFE, FIRST, clone=True, lend=True, alone=True), OutputState.LENDING),
    (CapturePlan(SAFE, FIRST, clone=True, lend=False, alone=False, lend_later=True), OutputState.LEND_LATER),
    (CapturePlan(SAFE, COPYING, clone=True, lend=False, alone=False), OutputState.COPYING),
    (CapturePlan(CLONE, FIRST, clone=True, lend=False, alone=False), OutputState.COPYING),
    (CapturePlan(STATIC, FIRST, clone=False, lend=False, alone=False), OutputState.STATIC),
])
def test_first_state_of_the_output_sets(plan, state):
    assert first_state(plan) is state


class TestPolicy:
    @pytest.mark.parametrize("text", ["safe", "clone", "static"])
    def test_built_from_the_option_string(self, text):
        assert OutputPolicy(text).value == text

    def test_options_accept_the_strings_and_name_them_in_the_error(self):
        assert [Options(outputs=p.value).outputs for p in OutputPolicy] == ["safe", "clone", "static"]
        with pytest.raises(ValueError) as info:
            Options(outputs="copy")
        assert str(info.value) == "outputs must be one of 'clone', 'safe', 'static' (got 'copy')."

    @pytest.mark.parametrize("outputs", ["safe", "clone", "static"])
    def test_each_policy_as_its_plan_says(self, outputs):
        """Through the wrapper: "static" hands out the graph's buffer (the next call overwrites
        it), the others results later calls leave as they were."""
        g = CudaGraphModule(lambda x: x * 2, warmup=1, backend="simulate", outputs=outputs)
        for _ in range(2):
            g(torch.zeros(3))
        first = g(torch.ones(3))
        second = g(torch.full((3,), 2.0))
        assert second.tolist() == [4.0] * 3
        assert first.tolist() == ([4.0] * 3 if outputs == "static" else [2.0] * 3)
        assert (first is second) == (outputs == "static")
