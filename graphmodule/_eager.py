"""A signature served without a graph: :class:`EagerEntry`.

Without CUDA (the eager runner), or after a capture that failed with
``on_capture_failure="eager"``, each signature still gets an entry among the wrapper's
graphs, with the signature (``InputSpec``, modes) and the watch of what the function reads
that a graph would have: :func:`~graphmodule._entry.decide`, the index, ``max_graphs``,
eviction and staleness are those of graphs, and a call runs the function eagerly on its own
arguments. So a wrapper without CUDA accepts and refuses the calls a GPU would.
"""

from __future__ import annotations

from typing import Any

from tensordict import TensorDictBase

from ._dispatch import stand_in
from ._entry import NOT_SERVED, REPLAY, decide
from ._errors import WITHOUT_GRAPH, Mismatch
from ._spec import InputSpec
from ._stale import Watch

__all__ = ["EagerEntry"]


class EagerEntry:
    """A signature among the wrapper's graphs whose calls run the function eagerly on their
    own arguments (made by ``_graphs.Graphs.eager``)."""

    when = WITHOUT_GRAPH
    noun = "signature (no CUDA graph: calls run eagerly)"
    layer = None
    handle = None
    requires = ()
    plain = True  # (decide: nothing beyond the signature and the watch to check)
    capture_bytes = 0
    capture_seconds = 0.0

    def __init__(self, *, spec: InputSpec, watch: Watch, runner: Any, module: Any, stats: Any,
                 returns_input_td: bool) -> None:
        self.spec, self.mode = spec, spec.mode
        self.watch, self.runner, self.module, self.stats = watch, runner, module, stats
        self.returns_input_td = returns_input_td
        self.outputs = _EAGER_OUTPUTS

    def replay(self, leaves: Any, objs: dict, tree: Any) -> Any:
        """The function's own result for the call, run eagerly."""
        self.stats.eager_calls += 1
        args, kwargs = tree
        module = self.module
        return self.runner.run_eager(lambda: module(*args, **kwargs))

    def written_keys(self) -> None:
        """Unknown: no capture saw what the function writes."""
        return None

    def through_stand_in(self, td: TensorDictBase, in_keys: list, mode: Any) -> Any:
        """As :meth:`Entry.through_stand_in` (where the stand-in would match, the call is
        served): the module runs eagerly on ``td``."""
        slot = self.spec.lone_slot
        stand = stand_in(td, in_keys, slot.batch_size) if slot is not None else None
        if stand is None or decide(self, (stand,), {}, mode)[0] is not REPLAY:
            return NOT_SERVED
        return self.replay(None, {0: td}, ((td,), {}))

    def extra_mismatches(self, leaves: Any, paths: list[str] | None, objs: dict) -> list[Mismatch]:
        return []

    def release(self) -> None:
        pass


class _EagerOutputs:
    """What an :class:`EagerEntry` has for output sets: none, its results are the function's."""

    @staticmethod
    def serve(entry: EagerEntry, leaves: Any, objs: dict, tree: Any) -> Any:
        """As ``OutputSets.serve``: the entry's call (run eagerly)."""
        return entry.replay(leaves, objs, tree)

    @staticmethod
    def describe() -> str:
        return "outputs: the function's own results (run eagerly)"


_EAGER_OUTPUTS = _EagerOutputs()
