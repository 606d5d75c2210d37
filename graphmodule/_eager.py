"""A signature served without a graph: :class:`EagerEntry`.

Without CUDA (the eager runner), or after a capture that failed with
``on_capture_failure="eager"``, each signature still gets an entry among the wrapper's
graphs, with the signature (``InputSpec``, modes) and the watch of what the function reads
that a graph would have: :func:`~graphmodule._entry.decide`, the index, ``max_graphs``,
eviction and staleness are those of graphs, and a call runs the function eagerly on its own
arguments.

Without CUDA, the first call of a signature after its warmup calls is moreover captured as
``backend="simulate"`` captures it (:class:`CheckingRunner`): what a capture refuses (a host
sync, Python state the function or its hooks change, an input changed in place in shape,
torch's global state left set...) is refused with the capture's own error, and what the
capture found (the inputs the function writes, what it rebinds: ``.grad``, attributes) is
what later calls are checked against (aliasing, strides, staleness), as a graph's. That call's
result is the simulated capture's; its recorded operations are dropped at once, and later calls
run eagerly. So a wrapper without CUDA serves and refuses the calls a GPU would, with the same
messages (bar the words saying no graph was captured).
"""

from __future__ import annotations

import copy
from typing import Any, Callable

from tensordict import TensorDictBase

from ._dispatch import add_required, stand_in
from ._entry import NOT_SERVED, REPLAY, Entry, decide
from ._errors import WITHOUT_GRAPH, Mismatch
from ._graphentry import GraphEntry, Outputs
from ._gradwatch import StatesOnly
from ._policy import Capture, Facts, OutputPolicy, plan_capture
from ._record import CallRead, record
from ._runner_simulate import SimulatedRunner
from ._runners import CaptureResult
from ._scope import SCOPE
from ._simulate import excusing_optimizer_syncs
from ._spec import InputSpec
from ._stale import Watch

__all__ = ["CheckingRunner", "EagerEntry", "checked_entry"]


class CheckingRunner(SimulatedRunner):
    """The simulated capture that checks a signature without CUDA (see the module docstring).

    Host syncs inside optimizer steps are not refused: on a GPU the wrapper makes a plain
    optimizer capturable (``_optim``), which torch refuses for CPU tensors."""

    def capture(self, body: Callable[[], Any], owner: str, alone: bool = False, beside: Any = None) -> CaptureResult:
        return super().capture(excusing_optimizer_syncs(body), owner, alone, beside)


class EagerEntry(GraphEntry):
    """A signature among the wrapper's graphs whose calls run the function eagerly on their
    own arguments (made by ``_graphs.Graphs.eager``); it offers what every entry does
    (``_graphentry.GraphEntry``), each member its own."""

    when = WITHOUT_GRAPH
    noun = "signature (no CUDA graph: calls run eagerly)"
    layer = None
    handle = None
    requires = ()
    plain = True  # (decide: nothing beyond the signature and the watch to check)
    capture_bytes = 0
    capture_seconds = 0.0

    def __init__(self, *, spec: InputSpec, watch: Watch, runner: Any, module: Any, stats: Any,
                 returns_input_td: bool, checks: Entry | None = None) -> None:
        self.spec, self.mode = spec, spec.mode
        self.watch, self.runner, self.module, self.stats = watch, runner, module, stats
        self.returns_input_td = returns_input_td
        self.outputs = _EAGER_OUTPUTS
        # the simulated capture of the signature's first call (without CUDA): what calls are
        # checked against beyond the signature and the watch, as that graph's calls would be
        self.checks = checks
        self.texts = checks.texts if checks is not None else None  # (the inputs' places, for messages)
        if checks is not None:
            self.plain = checks.plain

    @classmethod
    def checked(cls, checks: Entry, *, runner: Any, module: Any, stats: Any) -> EagerEntry:
        """The signature of ``checks``, a simulated capture whose call :meth:`finish` ends."""
        return cls(spec=checks.spec, watch=checks.watch, runner=runner, module=module, stats=stats,
                   returns_input_td=checks.returns_input_td, checks=checks)

    def finish(self, leaves: Any, objs: dict, tree: Any) -> Any:
        """The result of the call :attr:`checks` captured (the simulated capture's, as on a GPU
        the capturing call's is the graph's); its recorded operations go, and from now on the
        watch is of what the function reads as that call left it, bar what it rebinds."""
        checks = self.checks
        out = checks.finish(leaves, objs, tree)
        checks.runner.release(checks.handle)
        checks.handle = checks.plan = None  # (its buffers: what the checks read are the inputs')
        rebound = checks.watch.rebound
        if rebound is not None:  # each call binds its own .grad: whether it is None is the signature
            rebound = copy.copy(rebound)
            rebound.required = StatesOnly.of(rebound.required)
        self.watch = Watch(self.module, backward_hooks=checks.watch.backward_hooks, rebound=rebound)
        return out

    def replay(self, leaves: Any, objs: dict, tree: Any) -> Any:
        """The function's own result for the call, run eagerly (in a checked signature's place,
        the wrappers it calls run inline, as a graph's replay runs their work without calling
        them)."""
        self.stats.eager_calls += 1
        args, kwargs = tree
        module = self.module
        if self.checks is None:
            return self.runner.run_eager(lambda: module(*args, **kwargs))
        return self.runner.run_eager(lambda: _inline(lambda: module(*args, **kwargs)))

    def written_keys(self) -> list | None:
        """Those the simulated capture saw the function write (None where there was none)."""
        return self.checks.written_keys() if self.checks is not None else None

    def through_stand_in(self, td: TensorDictBase, in_keys: list, mode: Any) -> Any:
        """As :meth:`Entry.through_stand_in` (where the graph would serve the call through a
        stand-in, the call is served): the module runs eagerly on ``td``."""
        checks, slot = self.checks, self.spec.lone_slot
        if checks is not None and checks.writes_only is None:
            return NOT_SERVED
        stand = stand_in(td, in_keys, slot.batch_size) if slot is not None else None
        if stand is None:
            return NOT_SERVED
        if checks is not None:
            add_required(stand, checks.requires)
        if decide(self, (stand,), {}, mode)[0] is not REPLAY:
            return NOT_SERVED
        return self.replay(None, {0: td}, ((td,), {}))

    def extra_ok(self, leaves: Any, objs: dict) -> bool:
        return self.checks.extra_ok(leaves, objs)

    def extra_mismatches(self, leaves: Any, paths: list[str] | None, objs: dict) -> list[Mismatch]:
        return self.checks.extra_mismatches(leaves, paths, objs) if self.checks is not None else []

    def release(self) -> None:
        layer = self.checks.layer if self.checks is not None else None
        if layer is not None:  # (a layer's backward graph, kept for the first call's result)
            layer.release()


def checked_entry(owner: str, module: Any, call: CallRead, mode: Any, eager_keys: list | None, checking: CheckingRunner,
                  runner: Any, stats: Any, policy: OutputPolicy, found: Any = None) -> EagerEntry:
    """Without CUDA: the signature of ``call``, captured by ``checking`` as ``backend="simulate"``
    captures it, raising what that capture raises (``_record.record``: one code refuses for both),
    then served eagerly by ``runner``; the call's result is ``entry.finish(...)`` (``found``: as
    ``record``'s)."""
    plan = plan_capture(policy, Facts(Capture.CHECKING))
    checks, _ = record(owner=owner, module=module, runner=checking, call=call, mode=mode, plan=plan,
                       eager_keys=eager_keys, found=found)
    stats.eager_calls += 1
    return EagerEntry.checked(checks, runner=runner, module=module, stats=stats)


def _inline(body: Callable[[], Any]) -> Any:
    """``body()`` as inside a capture: a wrapper it calls runs inline (``_module``)."""
    with SCOPE.capture():
        return body()


class _EagerOutputs(Outputs):
    """What an :class:`EagerEntry` has for output sets: none, its results are the function's."""

    def serve(self, entry: EagerEntry, leaves: Any, objs: dict, tree: Any) -> Any:
        """As ``Signature.serve``: the entry's call (run eagerly)."""
        return entry.replay(leaves, objs, tree)

    def describe(self) -> str:
        return "outputs: the function's own results (run eagerly)"

    def release(self, entry: EagerEntry) -> None:
        """Nothing beside the entry to release."""


_EAGER_OUTPUTS = _EagerOutputs()
