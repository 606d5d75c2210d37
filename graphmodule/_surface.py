"""What a wrapper shows besides calls: its state, counters, graphs and pool, ``explain()``,
tensordict's wrapper's attributes, the module's state dict, ``repr``, copying and pickling.

:class:`WrapperSurface` is the base of :class:`~graphmodule.CudaGraphModule`; it reads the
wrapper's counters and graphs and never changes them.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch

from ._errors import GraphStateError
from ._explain import describe_graphs
from ._lifecycle import Phase, State
from ._runners import Kind
from ._stats import GraphStats

__all__ = ["WrapperSurface"]


class WrapperSurface:
    # -- what the wrapper shows of its state and graphs -------------------------------
    @property
    def state(self) -> State:
        """The current :class:`State` (compares equal to ``"warmup"``, ``"captured"``...)."""
        return self._phase.state

    @property
    def stats(self) -> GraphStats:
        """A snapshot of the counters (see :class:`GraphStats`)."""
        entries = self._graphs.entries
        stats = self._stats.copy()
        stats.graphs = len(entries)
        stats.graph_bytes = tuple(entry.capture_bytes for entry in entries)
        stats.pool_bytes = self._runner.pool.bytes() if entries else 0
        return stats

    @property
    def pool(self) -> Any:
        """The memory pool of this wrapper's graphs (pass it as ``pool=`` to share it)."""
        return self._runner.pool.handle()

    @property
    def graph(self) -> torch.cuda.CUDAGraph | None:
        """The most recently used captured ``torch.cuda.CUDAGraph``, if any."""
        entries = self._graphs.entries  # (a signature served eagerly has no handle)
        return entries[0].cuda_graph if entries and entries[0].handle is not None else None

    def debug_dump(self, path: str) -> list[str]:
        """Write each held graph's structure as Graphviz (``torch.cuda.CUDAGraph.debug_dump``).

        Needs ``debug=True`` and the CUDA backend. One graph goes to ``path``; with several
        (``max_graphs``), graph ``n`` (most recently used first) goes to ``path`` with
        ``.n`` before its suffix. Returns the paths written. Graphs captured with
        ``debug=True`` keep their structure, so they can be dumped again.

        Example (on a GPU)::

            g = CudaGraphModule(net, debug=True)
            ...  # warm up and capture
            g.debug_dump("policy.dot")  # then: dot -Tsvg policy.dot -o policy.svg
        """
        kind = self._runner.kind
        if kind is not Kind.CUDA:  # (no structure, now or later)
            raise GraphStateError(f"{self._owner} records no CUDA graph ({kind.value}): there is no graph "
                                  "structure to dump; use backend='cuda' on a GPU.")
        if not self._graphs.captured():
            why = ("its capture failed and it runs eagerly (on_capture_failure='eager'): see explain()"
                   if self._phase is Phase.EAGER_AFTER_FAILURE else "call it until it has captured, then dump")
            raise GraphStateError(f"{self._owner} holds no graph yet (state {self._phase.state.value}): {why}.")
        if not self.options.debug:
            raise GraphStateError(f"{self._owner} was built without debug=True, so its graphs keep no "
                                  "structure to dump: build it with CudaGraphModule(..., debug=True).")
        return self._graphs.debug_dump(path)

    def explain(self) -> str:
        """The state (in ``eager``, why: ``state eager (no CUDA)``) and, once captured, each
        graph's input signature and where its results come from."""
        lines = [f"{self._owner}: state {self._phase.describe()}, {self.stats}"]
        lines += describe_graphs(self._graphs.entries, self._arg_names)
        if self._failure is not None:
            lines.append(f"capture failed: {self._failure}")
        return "\n".join(lines)

    # -- what code written for tensordict's wrapper reads ------------------------------
    @property
    def counter(self) -> int:
        """Calls that ran before the graph took over (tensordict's wrapper's ``counter``;
        0 without graphs, as there)."""
        if not self._runner.kind.captures:
            return 0
        return min(self._stats.warmup_calls + self._stats.captures, self.warmup)

    @property
    def _is_tensordict_module(self) -> bool:
        """Whether it wraps a TensorDict module (``in_keys`` given or its own)."""
        return self._td is not None

    @property
    def _warmup(self) -> int:
        return self.warmup

    @property
    def _out_matches_in(self) -> bool | None:
        """Whether the TensorDict module returns its input TensorDict (None before a call)."""
        entries = self._graphs.entries
        if entries:
            return entries[0].returns_input_td
        return self._graphs.returned_input

    @property
    def _selected_keys(self) -> list | None:
        """The keys a replay writes into the caller's TensorDict."""
        if self.out_keys:
            return list(self.out_keys)
        entries = self._graphs.entries
        return entries[0].written_keys() if entries else None

    def state_dict(self, *args: Any, **kwargs: Any) -> dict:
        """The wrapped module's ``state_dict`` (``{}`` if it has none)."""
        fn = getattr(self.module, "state_dict", None)
        return fn(*args, **kwargs) if fn is not None else {}

    def load_state_dict(self, state_dict: dict, *args: Any, **kwargs: Any) -> Any:
        """Load into the wrapped module; in place, so a captured graph sees the new values."""
        fn = getattr(self.module, "load_state_dict", None)
        return fn(state_dict, *args, **kwargs) if fn is not None else None

    def __repr__(self) -> str:
        parts = [repr(self.module), f"warmup={self.warmup}", f"in_keys={self.in_keys!r}",
                 f"out_keys={self.out_keys!r}", f"device={self._given_device!r}"]
        parts += [f"{name}={value!r}" for name, value in self.options.changed()]
        return f"CudaGraphModule({', '.join(parts)})"

    # A wrapper holds CUDA graphs and streams, which cannot be copied or pickled: a copy
    # is a new wrapper over a copy of the module, warming up again.
    def _ctor(self) -> dict:
        return dict(warmup=self.warmup, in_keys=self.in_keys, out_keys=self.out_keys,
                    device=self._given_device, **dict(self.options.changed()))

    def __deepcopy__(self, memo: dict) -> "WrapperSurface":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return type(self)(copy.deepcopy(self.module, memo), **copy.deepcopy(self._ctor(), memo))

    def __getstate__(self) -> dict:
        return {"module": self.module, "ctor": self._ctor()}

    def __setstate__(self, state: dict) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.__init__(state["module"], **state["ctor"])
