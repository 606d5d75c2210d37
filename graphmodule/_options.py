"""A wrapper's options, one frozen value (its state is the life cycle's: ``_lifecycle``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ._policy import OutputPolicy

__all__ = ["AUTO_GRAPHS", "Options"]

#: ``max_graphs=None`` (the default): the most graphs a wrapper keeps for calls that differ only in
#: Python values and modes (as ``torch.compile`` records up to 8 variants of a function by default)
AUTO_GRAPHS = 8


_CHOICES = {
    "outputs": tuple(sorted(policy.value for policy in OutputPolicy)),
    "capture_error_mode": ("thread_local", "global", "relaxed"),
    "on_capture_failure": ("raise", "eager"),
    "on_stale": ("raise", "recapture"),
    "on_graph_limit": ("raise", "evict"),
    "backend": ("auto", "cuda", "simulate", "eager"),
}


@dataclasses.dataclass(frozen=True)
class Options:
    """The keyword-only options of :class:`~graphmodule.CudaGraphModule`.

    See its docstring for what each does; ``repr`` of a wrapper shows those that differ
    from these defaults.

    ``max_graphs``: ``None`` (the default) keeps a graph for each call that differs from the
    graphs held only in Python values (non-tensor arguments) and modes, up to
    :data:`AUTO_GRAPHS`, and refuses a call whose tensors differ (shape, dtype, device...);
    an int ``N`` keeps up to ``N`` graphs of any signatures.

    >>> Options(max_graphs=2).changed()
    [('max_graphs', 2)]
    """

    outputs: str = "safe"
    capture_error_mode: str = "thread_local"
    on_capture_failure: str = "raise"
    on_stale: str = "raise"
    max_graphs: int | None = None
    on_graph_limit: str = "raise"
    pool: Any = None
    backend: str = "auto"
    debug: bool = False

    def __post_init__(self) -> None:
        for name, allowed in _CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                choices = ", ".join(repr(a) for a in allowed)
                raise ValueError(f"{name} must be one of {choices} (got {value!r}).")
        limit = self.max_graphs
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ValueError(f"max_graphs must be None (a graph per Python value and mode, up to {AUTO_GRAPHS}) "
                             f"or an int >= 1 (got {limit!r}).")
        if not isinstance(self.debug, bool):
            raise ValueError(f"debug must be True or False (got {self.debug!r}).")

    @property
    def graph_limit(self) -> int:
        """The most graphs a wrapper holds: ``max_graphs``, or :data:`AUTO_GRAPHS` by default."""
        return AUTO_GRAPHS if self.max_graphs is None else self.max_graphs

    def changed(self) -> list[tuple[str, Any]]:
        """``(name, value)`` of the options that differ from their defaults, in order."""
        return [
            (f.name, getattr(self, f.name))
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not f.default and getattr(self, f.name) != f.default
        ]
