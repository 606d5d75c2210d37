"""What a wrapper shows besides calls: tensordict's wrapper's attributes, the module's
state dict, ``repr``, copying and pickling.

:class:`WrapperSurface` is the base of :class:`~graphmodule.CudaGraphModule`; it reads the
wrapper's counters and entries and never changes them.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

__all__ = ["WrapperSurface"]


class WrapperSurface:
    # -- what code written for tensordict's wrapper reads ------------------------------
    @property
    def counter(self) -> int:
        """Calls that ran before the graph took over (tensordict's wrapper's ``counter``;
        0 without graphs, as there)."""
        if not self._runner.captures:
            return 0
        return min(self._stats.warmup_calls + self._stats.captures, self.warmup)

    @property
    def _warmup(self) -> int:
        return self.warmup

    @property
    def _out_matches_in(self) -> bool | None:
        """Whether the TensorDict module returns its input TensorDict (None before a call)."""
        if self._entries:
            return self._entries[0].returns_input_td
        return self._returned_input

    @property
    def _selected_keys(self) -> list | None:
        """The keys a replay writes into the caller's TensorDict."""
        if self.out_keys:
            return list(self.out_keys)
        return self._entries[0].written_keys() if self._entries else None

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
