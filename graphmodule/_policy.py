"""What ``outputs=`` asks of each capture, decided in one place.

:class:`OutputPolicy` is the user's choice (``"safe"``, ``"clone"``, ``"static"``).
:func:`plan_capture` turns it, with the facts of one capture (:class:`Facts`: why the graph is
captured, whether it is likely a layer, whether its memory pool already holds a graph, whether
this torch can lend), into a :class:`CapturePlan`: whether results are copied, lent now or
lent later, and where the graph's memory goes. Everything downstream reads the plan:
``_record.record`` (where the runner captures), ``_outputs.Plan`` (how results are handed
out), ``_grad.Layer`` (gradients copied, outputs saved), ``_run`` and ``_entry`` (the
replays), ``_outputsets.first_state`` (where its output sets start). A new policy is a
member here, a branch of :func:`plan_capture` and its rows in ``tests/test_policy.py``.

After the capture, :meth:`CapturePlan.settled` applies what only the capture shows (whether the
graph has outputs, whether it is a layer), so that the plan an entry keeps says what it does.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import NamedTuple

__all__ = ["Capture", "CapturePlan", "Facts", "OutputPolicy", "plan_capture"]


class OutputPolicy(enum.Enum):
    """``outputs=``: what a call's results are (built from the option's string)."""

    SAFE = "safe"  # results later calls never overwrite: the buffers lent, without a copy where it can
    CLONE = "clone"  # the same promise, a copy of every result per call
    STATIC = "static"  # the graph's own buffers, overwritten by the next call


class Capture(enum.Enum):
    """Why a graph is captured."""

    FIRST = "a signature's first capture"
    LENDING = "captured again to lend from buffers of its own (a twin, or a graph that lends later)"
    COPYING = "captured again to return copies (every output set is held); a train step's .grad still lent"
    COPYING_ALL = "captured again to return copies of everything (a .grad the copying graph lent was kept)"
    CHECKING = "without CUDA: the simulated capture that checks a signature's first call"


class Facts(NamedTuple):
    """What a capture's plan depends on besides the policy."""

    capture: Capture
    layer: bool = False  # results track gradients (a first capture: at warmup; again: the graph is a layer)
    pool_in_use: bool = False  # the memory pool already holds a graph (another signature's, another wrapper's)
    lendable: bool = True  # this torch can tell whether a lent result is held (_lend.available)
    drops: bool = False  # captured again from a train step that drops the .grad it binds (zero_grad() first)


@dataclasses.dataclass(frozen=True)
class CapturePlan:
    """How one capture hands out its results.

    ``clone``: results (and a layer's gradients) are copied at each call; ``lend``: results
    are the graph's buffers lent out, never replayed over while held (``_lend``); ``alone``:
    captured in memory no other graph writes (lent buffers must not be another graph's
    temporaries; a layer's activations must outlive the replay until its backward);
    ``beside``: captured beside the graph it is captured again from, copying its results into
    buffers of its own laid out as that graph's (a twin, ``_twin``); ``lend_later``: copies
    now, and the next call captures the graph again to lend (``_outputsets.LEND_LATER``);
    ``lend_drops``: results are copies, but the ``.grad`` a train step drops at its next call
    (``zero_grad()`` first) are lent (``_lend.DroppingLender``): nobody keeps them, and a
    copy of every gradient at every call would be made for nothing.
    """

    policy: OutputPolicy
    capture: Capture
    clone: bool
    lend: bool
    alone: bool
    beside: bool = False
    lend_later: bool = False
    lend_drops: bool = False

    def settled(self, *, outputs: bool, layer: bool) -> CapturePlan:
        """The plan once captured: nothing to lend without ``outputs`` (tensors the graph
        returns); a layer (its results join a backward graph) does not wait to lend."""
        lend = self.lend and outputs
        lend_later = self.lend_later and outputs and not layer
        if (lend, lend_later) == (self.lend, self.lend_later):
            return self
        return dataclasses.replace(self, lend=lend, lend_later=lend_later)


def plan_capture(policy: OutputPolicy, facts: Facts) -> CapturePlan:
    """The plan of one capture (see the module docstring; the table is ``tests/test_policy.py``)."""
    capture, layer = facts.capture, facts.layer
    if capture is Capture.CHECKING:  # its one result is the call's: a copy, in any memory
        return CapturePlan(policy, capture, clone=True, lend=False, alone=False)
    if capture is Capture.LENDING:  # (only "safe" captures again) a layer's in a pool of its own
        return CapturePlan(policy, capture, clone=True, lend=facts.lendable, alone=layer, beside=not layer)
    if capture is Capture.COPYING:  # (a layer's .grad are its backward's, not a step's: nothing to lend)
        lend_drops = facts.lendable and facts.drops and not layer
        return CapturePlan(policy, capture, clone=True, lend=False, alone=layer or lend_drops, lend_drops=lend_drops)
    if capture is Capture.COPYING_ALL:
        return CapturePlan(policy, capture, clone=True, lend=False, alone=layer)
    if policy is not OutputPolicy.SAFE or not facts.lendable:
        return CapturePlan(policy, capture, clone=policy is not OutputPolicy.STATIC, lend=False, alone=layer)
    # "safe" where the pool already holds a graph: results lent from this capture's memory could
    # sit where that graph writes its temporaries. This call returns copies; the next one captures
    # it again with its results copied out of the pool (a twin of it, see _twin), which lends them.
    if facts.pool_in_use and not layer:
        return CapturePlan(policy, capture, clone=True, lend=False, alone=False, lend_later=True)
    return CapturePlan(policy, capture, clone=True, lend=True, alone=True)
