"""What every entry among a wrapper's graphs offers, declared once.

A wrapper keeps one entry per signature (``_graphs.Graphs.entries``): a captured graph
(``_entry.Entry``), or a signature served eagerly (``_eager.EagerEntry``: no CUDA, or a
failed capture). The wrapper, ``decide``, the index, the explanations and the surface read
them through :class:`GraphEntry` only; each kind subclasses it, and ``tests/test_graphentry.py``
checks that each answers every member. What a call's results are comes from the entry's
:class:`Outputs` (``_signature.Signature`` for a graph: its output sets and twins).

The dependencies run one way: ``_signature`` (output sets) → ``_entry`` (one graph) →
this module; an entry never imports what serves it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ._errors import Mismatch
    from ._spec import InputSpec
    from ._stale import Watch

__all__ = ["GraphEntry", "Outputs"]


class Outputs(Protocol):
    """Where the results of an entry's calls come from (``entry.outputs``)."""

    def serve(self, entry: Any, leaves: Any, objs: dict, tree: Any) -> Any:
        """The call's result (``decide`` said ``REPLAY``), counted in the wrapper's stats. The
        hot path: ``CudaGraphModule.__call__`` calls it."""

    def describe(self) -> str:
        """One line for ``explain()``: ``outputs: ...``."""

    def release(self, entry: Any) -> None:
        """``entry`` was released: so is what serves it beside it (its twins)."""


class GraphEntry(Protocol):
    """One signature among a wrapper's graphs, and how its calls are served."""

    # how messages say where the signature comes from ("was captured with other inputs than
    # this call's") and what explain() calls it
    when: str
    noun: str
    spec: InputSpec  # the signature calls must match (with ``mode``)
    mode: tuple
    watch: Watch  # what it reads from outside its inputs, checked at every call
    plain: bool  # ``decide`` has nothing to check beyond the signature and the watch
    texts: list[str] | None  # printable place of each input leaf, for messages
    layer: Any  # a graph used as a layer: its backward graph (``_grad.Layer``), else None
    handle: Any  # the runner's graph (None: no graph)
    requires: Any  # nested TensorDicts the call must (not) have where the function writes
    returns_input_td: bool  # a TensorDict module's call that returns its input
    capture_bytes: int
    capture_seconds: float
    outputs: Outputs | None

    def extra_ok(self, leaves: Any, objs: dict) -> bool:
        """What ``decide`` checks beyond the signature and the watch (where not ``plain``)."""

    def extra_mismatches(self, leaves: Any, paths: list[str] | None, objs: dict) -> list[Mismatch]:
        """What :meth:`extra_ok` found wrong, for the message."""

    def replay(self, leaves: Any, objs: dict, tree: Any) -> Any:
        """The call's result, served by :attr:`outputs` (``decide`` said ``REPLAY``)."""

    def finish(self, leaves: Any, objs: dict, tree: Any) -> Any:
        """The result of the call that made the entry (its capture)."""

    def through_stand_in(self, td: Any, in_keys: list, mode: Any) -> Any:
        """A TensorDict module's call of another batch size served through a stand-in laid out
        as at capture; ``_entry.NOT_SERVED`` where it cannot be."""

    def written_keys(self) -> list | None:
        """Keys the function writes into its first TensorDict argument (None: not known)."""

    def release(self) -> None:
        """Its graph goes (results lent keep their memory)."""
