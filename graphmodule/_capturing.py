"""The ends of the wrapper's slow path: a capture and what its outcome does to the life cycle
(``_lifecycle``), and a stale graph dropped.

:class:`Capturing` is a base of :class:`~graphmodule.CudaGraphModule` (as ``_surface``'s is):

- a capture that makes a graph moves the wrapper to ``CAPTURED``; without graphs (no CUDA,
  ``backend="eager"``) the call was checked as a capture checks it, and its signature runs
  eagerly: ``EAGER``, with that reason;
- a capture that fails moves it to ``FAILED`` (``on_capture_failure="raise"``: calls raise
  until ``reset()``) or to ``EAGER`` (``"eager"``: no capture is tried again, each signature
  runs eagerly, checked as a graph's); a function that raises while captured, with no sign of
  the capture being to blame, runs eagerly to raise as it would have;
- a stale graph is dropped and its call warms up and is captured again
  (``on_stale="recapture"``), or raises :class:`~graphmodule.StaleGraphError`; once every
  graph is dropped, the wrapper warms up again (``ALL_STALE``).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from ._diagnose import USER_ERROR
from ._discover import Discovery
from ._distributed import explain_failure, note_capture
from ._entry import Entry
from ._errors import CaptureError, StaleGraphError
from ._graphs import NOT_RUN, Warming
from ._lifecycle import Event, Phase, capture_event
from ._mode import Mode
from ._optim import explain as explain_optimizers
from ._paths import user_stacklevel
from ._record import CallRead, mode_reader

__all__ = ["Capturing"]

log = logging.getLogger("graphmodule")


class Capturing:
    """The capture, its failure and staleness: methods of the wrapper (see the module docstring).

    They read the wrapper's ``module``, ``options``, ``_graphs``, ``_runner``, ``_stats`` and
    ``_mode``, move its ``_phase`` (:meth:`_move`, by the table), and go back to its slow path
    (``_slow``, ``_variant``, ``_new_signature``: ``_module``) where a stale graph's call
    needs another.
    """

    def _move(self, event: Event) -> None:
        """The only place the wrapper's phase changes (after construction): by its table."""
        self._phase = self._phase.after(event)

    def _capture(self, args: tuple, kwargs: dict, warmed: Warming | None = None) -> Any:
        call = self._graphs.read(args, kwargs)
        watch = Discovery(self.module)  # what it reads (the graph's Watch is taken by the capture)
        reader = self._mode or mode_reader(watch)
        mode = reader.read()
        if self._phase is Phase.EAGER_AFTER_FAILURE:
            return self._run_eagerly(call, reader, mode, watch, warmed=warmed)
        try:
            # (refused before it runs where the inputs, modes or a DDP step forbid it: _refuse.before_capture)
            # (without CUDA: a simulated capture checks the call, then its signature runs eagerly)
            entry = self._graphs.capture(call, mode, warmed, found=watch)
        except CaptureError as err:
            err = explain_failure(err, watch.modules)  # DDP's part in it, if any (_distributed)
            err = explain_optimizers(err, watch, self.device)  # which optimizer, and why (_optim)
            if err.cause != USER_ERROR:
                return self._capture_failed(err, call, mode, reader, watch, warmed=warmed)
            # The function raised while it was captured, with no sign of the capture being to
            # blame. Run the call eagerly: it raises as it would have (with the same partial
            # effects on the arguments), and the wrapper is unchanged.
            out = self._runner.run_eager(lambda: self.module(*args, **kwargs))
            # It did not raise eagerly: the capture was to blame after all.
            return self._capture_failed(err, call, mode, reader, watch, ran=out, warmed=warmed)
        self._graphs.warmed(warmed)
        self._first_reader(reader)
        self._move(capture_event(self._runner.kind))  # (no CUDA: the entry runs eagerly, checked)
        if entry.handle is not None:
            note_capture(self)  # released before its process groups are destroyed (_distributed)
        return entry.finish(call.leaves, call.objs, call.tree)

    def _capture_failed(self, err: CaptureError, call: CallRead, mode: Any, reader: Any, watch: Discovery,
                        ran: Any = NOT_RUN, warmed: Warming | None = None) -> Any:
        """A failed capture; ``ran`` is the call's result if it already ran eagerly."""
        self._stats.capture_failures += 1
        log.warning("%s: capture failed (%s)", self._owner, err.cause)
        if self.options.on_capture_failure == "raise":
            self._failure = err
            self._move(Event.FAILED)
            if ran is NOT_RUN:
                raise err
            warnings.warn(f"{err}\nThe call ran eagerly instead; later calls raise until reset().",
                          UserWarning, stacklevel=user_stacklevel())
            return ran
        warnings.warn(f"{err}\n{self._owner} runs eagerly from now on (on_capture_failure='eager').",
                      UserWarning, stacklevel=user_stacklevel())
        self._move(Event.FAILED_TO_EAGER)
        return self._run_eagerly(call, reader, mode, watch, ran, warmed)

    def _run_eagerly(self, call: CallRead, reader: Any, mode: Any, watch: Discovery, ran: Any = NOT_RUN,
                     warmed: Warming | None = None) -> Any:
        """After a failed capture (``EAGER_AFTER_FAILURE``): this call's signature runs eagerly
        from now on, checked as a graph's."""
        _, out = self._graphs.eager(call, mode, watch, ran)
        self._graphs.warmed(warmed)
        self._first_reader(reader)
        return out

    def _first_reader(self, reader: Any) -> None:
        """The first capture's mode reader: modes include its modules' train/eval from now on."""
        if self._mode is None and self.options.max_graphs is None:
            self._graphs.know_modules(Mode(*reader.read()).modules, self.options.on_graph_limit == "evict")
        self._mode = reader

    def _stale(self, entry: Entry, args: tuple, kwargs: dict) -> Any:
        graphs, options = self._graphs, self.options
        room = len(graphs.entries) < options.graph_limit or options.on_graph_limit == "evict"
        if room and entry.watch.other_grads():
            # .grad None where the graph found a tensor, or the reverse (gradient accumulation):
            # another graph's call, as another signature's (_gradwatch.Required)
            return self._new_signature(args, kwargs)
        changes = entry.watch.changes()
        # a gradient the graph reads bound over other memory: captured again over it
        if (options.on_stale == "raise" and not entry.watch.grads_moved()) or not changes:
            raise StaleGraphError(self._owner, changes or [("state", "changed")], entry.when)
        self._stats.recaptures += 1
        log.info("%s: dropping a stale graph (%s)", self._owner, "; ".join(f"{w}: {c}" for w, c in changes))
        graphs.drop(entry)
        if not graphs.entries:
            graphs.restart_warmup()  # (what they warmed up may have changed too)
            self._move(Event.ALL_STALE)
            return self._slow(args, kwargs)
        if options.max_graphs is None:
            return self._variant(args, kwargs, self._mode.read())
        return self._new_signature(args, kwargs)
