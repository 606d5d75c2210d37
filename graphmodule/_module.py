"""``CudaGraphModule``: the wrapper's life cycle, a state machine over warmup, capture and replay.

::

    WARMUP ──(call warmup+1)──► capture ──ok──► CAPTURED (every call: match, copy, replay)
       ▲                           │                 │ new signature with room: warm up, capture
       │                           ├─fails, on_capture_failure="raise"──► FAILED (raises until reset())
       └──────── reset() ──────────┴─fails, on_capture_failure="eager"──► EAGER
                                                           no CUDA ─────► EAGER

A new signature has room under ``max_graphs=N`` graphs, or by default where it differs from
the held graphs only in Python values and modes (``_variants``); by default each signature, the
first included, is captured after ``warmup`` calls of its own.

In ``EAGER`` a signature's "graph" is an ``EagerEntry``, which runs the function on each
call's own arguments: signatures, ``max_graphs``, eviction and staleness work as with graphs.
Without CUDA its capture is a simulated one (``_eager.CheckingRunner``), which raises what a
capture raises, so a wrapper without CUDA accepts and refuses what it would on a GPU.

A call that the most recent graph replays (``_entry.decide``) takes the hot path in
:meth:`__call__`; every other call (warmup, a capture, another graph, a stale graph, a
mismatch to explain) takes :meth:`_slow`, which moves the state and asks the wrapper's
graphs (``_graphs``) for the rest.
"""

from __future__ import annotations

import logging
import threading
import warnings
from threading import get_ident
from typing import Any, Callable

import torch
import torch._dynamo.decorators
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase, dispatch

from ._diagnose import USER_ERROR
from ._discover import Discovery
from ._dispatch import binds_kwargs_by_name, module_name, resolve_keys, sorted_kwargs
from ._distributed import explain_failure, note_capture
from ._entry import NOT_SERVED, OTHER, REFUSED, REPLAY, STALE, Entry, decide
from ._errors import CaptureError, GraphModuleError, GraphStateError, InputMismatchError, StaleGraphError
from ._explain import mismatch_error
from ._graphs import NOT_RUN, Graphs, Warming
from ._mode import Mode, global_mode
from ._optim import explain as explain_optimizers
from ._options import Options, State
from ._paths import user_stacklevel
from ._record import CallRead, mode_reader
from ._backend import make_runner
from ._scope import SCOPE
from ._stats import GraphStats
from ._surface import WrapperSurface
from ._variants import Room

__all__ = ["CudaGraphModule"]

log = logging.getLogger("graphmodule")

# dynamo's callback in this thread: a function while code that torch.compile runs calls the
# wrapper, else None (or False: dynamo's run-only mode, which compiles nothing)
_dynamo_callback = torch._C._dynamo.eval_frame.get_eval_frame_callback
_skip_frame = torch._dynamo.decorators.skip


@torch.compiler.disable
def _compiled_off(wrapper: Any, *args: Any, **kwargs: Any) -> Any:
    """A call made where dynamo is on: the wrapper's call, and what it calls, with dynamo off."""
    return wrapper(*args, **kwargs)


class CudaGraphModule(WrapperSurface):
    """Run a function, ``nn.Module`` or TensorDict module as a CUDA graph.

    The first ``warmup`` calls run eagerly on a side stream. The next call captures a
    CUDA graph and replays it; every later call checks its inputs against the captured
    ones (structure, keys, shape, dtype, device, layout, requires_grad, non-tensor
    values, grad mode, train/eval, interaction type), checks that what the graph reads
    from outside its inputs (parameters, optimizer state and hyperparameters, closure
    variables) is unchanged, copies the inputs into the graph's buffers and replays the
    graph on the current stream, without synchronising with the host. Results, effects
    on the arguments and returned objects are those of the eager call. Called with grad
    enabled on inputs or parameters that require grad, a function that does not run
    backward itself is captured with its backward too (a layer, see ``_grad``):
    gradients flow back through the graph to the inputs and parameters, as eagerly.

    A drop-in for ``tensordict.nn.CudaGraphModule``: same arguments, same calling
    conventions (tensors, pytrees, TensorDicts, keyword arguments named after
    ``in_keys``, ``tensordict_out=``).

    Args:
        module: the callable to graph.
        warmup: eager calls before the capture (at least 1). Compiled functions need
            enough calls to finish compiling.
        in_keys: input keys, if the callable takes a TensorDict (the module's own
            ``in_keys`` win). ``[]`` marks a function that takes a TensorDict.
        out_keys: output keys of a TensorDict module (the module's own win).
        device: the CUDA device of the graph; defaults to the current device.

    Keyword-only options:
        outputs: ``"safe"`` (default): results that later calls never overwrite,
            without a copy where it can: results are the graph's own buffers lent out,
            and a graph whose results you hold is not replayed: up to three captures of
            a call alternate, then one returning copies takes over (what it cannot see,
            a raw pointer kept past its tensor, is undefined in plain torch too).
            ``"clone"``: the same promise, one copy of every result per call.
            ``"static"``: zero-copy, results are the graph's own buffers, overwritten
            by the next call; copy what you keep.
        capture_error_mode: passed to CUDA graph capture. ``"thread_local"``
            (default) lets other threads (data-loader pin-memory threads) use CUDA
            during a capture; ``"global"`` and ``"relaxed"`` as in torch.
        on_capture_failure: ``"raise"`` (default): raise a :class:`CaptureError`
            naming the cause, then refuse to run until :meth:`reset`; ``"eager"``:
            warn once and run eagerly from then on.
        on_stale: when something the graph reads by address or value was replaced
            (``layer.weight = nn.Parameter(...)``, an optimizer's float ``lr``):
            ``"raise"`` (default) a :class:`StaleGraphError` naming it, or
            ``"recapture"``: drop the graph, warm up and capture again.
        max_graphs: graphs kept for different signatures. ``None`` (default): a call that
            differs from the graphs held only in Python values (non-tensor arguments: a
            bool flag, an int, ``None`` or a value) and modes (train/eval, grad mode,
            interaction type, autocast) gets a graph of its own, up to 8; a call whose
            tensors differ (shape, dtype, device...) is an error. ``N``: up to ``N`` graphs
            of any signatures, and a call with another one is an error.
        on_graph_limit: with no room for a new signature's graph, ``"raise"`` (default),
            or ``"evict"`` the least recently used graph (with ``max_graphs=None``, a call
            whose tensors differ replaces every graph).
        pool: a memory pool shared with other graphs (``torch.cuda.graph_pool_handle()``
            or another wrapper's ``pool``); all graphs of a wrapper share its pool.
        backend: ``"auto"`` (CUDA graphs if CUDA is available, else eager with a
            warning), ``"cuda"``, ``"eager"`` (no graphs; every check still runs) or
            ``"simulate"`` (the full capture/replay machinery on any device: a replay
            runs the tensor operations the capture recorded, and no Python: tests on CPU).
        debug: keep each CUDA graph's structure for :meth:`debug_dump` (costs host memory).

    Example:
        >>> import torch, warnings
        >>> from graphmodule import CudaGraphModule
        >>> device = "cuda" if torch.cuda.is_available() else "cpu"
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")  # no CUDA: a warning, then eager calls, checked as a GPU would
        ...     g = CudaGraphModule(lambda x, y: x * y + 1)
        >>> x, y = torch.ones(3, device=device), torch.full((3,), 2.0, device=device)
        >>> for _ in range(4):
        ...     out = g(x, y)
        >>> out.tolist()
        [3.0, 3.0, 3.0]
        >>> g(x, y.double())
        Traceback (most recent call last):
          ...
        graphmodule._errors.InputMismatchError: CudaGraphModule(<lambda>) was ... with other inputs than this call's (1 mismatch):
          args[1]: expected dtype torch.float32, got torch.float64
        To fix: copying into the graph's buffer would cast silently: convert the input with .to(dtype) before the call.
    """

    def __init__(
        self,
        module: Callable[..., Any],
        warmup: int = 2,
        in_keys: Any = None,
        out_keys: Any = None,
        device: torch.device | str | int | None = None,
        *,
        outputs: str = Options.outputs,  # (the defaults are Options', in one place)
        capture_error_mode: str = Options.capture_error_mode,
        on_capture_failure: str = Options.on_capture_failure,
        on_stale: str = Options.on_stale,
        max_graphs: int | None = Options.max_graphs,
        on_graph_limit: str = Options.on_graph_limit,
        pool: Any = Options.pool,
        backend: str = Options.backend,
        debug: bool = Options.debug,
    ) -> None:
        if not callable(module):
            raise TypeError(f"module must be callable (got {type(module).__name__}).")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
            raise ValueError(f"warmup must be an int >= 1 (got {warmup!r}).")
        self.options = Options(outputs, capture_error_mode, on_capture_failure, on_stale, max_graphs,
                               on_graph_limit, pool, backend, debug)
        self.module = module
        self.warmup = warmup
        self.in_keys, self.out_keys = resolve_keys(module, in_keys, out_keys)
        self._given_device = device
        self._clone = outputs != "static"
        self._lend = outputs == "safe"
        self._owner = f"CudaGraphModule({module_name(module)})"
        self._is_tensordict_module = self.in_keys is not None
        self._arg_names = ("tensordict",) if self._is_tensordict_module else ()
        self._sort_kwargs = binds_kwargs_by_name(module) and not self._is_tensordict_module
        # a TensorDict module proper: its keyword calls and TensorDict calls share graphs (_dispatch)
        self._both_styles = isinstance(module, TensorDictModuleBase)
        self._runner = make_runner(backend, device, capture_error_mode, pool, debug)
        self.device = self._runner.device
        self._stats = GraphStats()
        # One call at a time: calls share the graph's buffers. Reentrant, for a function
        # that calls its own wrapper while another wrapper captures it.
        self._lock = threading.RLock()
        self._thread: int | None = None  # the thread that called last
        self._reset_state()

    def _reset_state(self) -> None:
        self._graphs = Graphs(owner=self._owner, module=self.module, runner=self._runner, stats=self._stats,
                              clone=self._clone, lend=self._lend, in_keys=self.in_keys, arg_names=self._arg_names)
        self._state = State.WARMUP
        self._warmed = 0  # warmup calls of the first signature
        self._mode = None  # the ModeReader, from the first capture
        self._failure: CaptureError | None = None
        self._built: TensorDictBase | None = None  # the TensorDict dispatch built for this keyword call
        self._eager_only = False  # a capture failed, on_capture_failure="eager": no more captures

    # -- public surface (the rest, read-only, in _surface) ----------------------------
    def reset(self) -> None:
        """Drop every graph; the next calls warm up and capture again."""
        with self._lock:  # (not while another thread's call replays them)
            self._graphs.release()
            if self._failure is not None:  # its traceback holds the failed capture's objects
                SCOPE.collect_before_next_capture()
            self._reset_state()

    # -- calls -------------------------------------------------------------------------
    # torch.compile around a wrapper (or around code that calls one) must not trace its
    # bookkeeping: dynamo breaks the graph at the call and runs it, and what it calls, eagerly
    # (a torch.compile'd function inside still compiles). Marked as dynamo marks a
    # torch.compiler.disable'd function (its tracer breaks the graph at the call; the frame is
    # skipped), without that decorator's wrapper, which costs a microsecond at every call: where
    # dynamo is on in this thread (code torch.compile runs), the call goes through it (_compiled_off).
    @_skip_frame
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # The hot path, in this one frame: whether the most recent graph replays the call
        # (decide), then its replay (served by the graph's output sets); anything else goes to _slow.
        if _dynamo_callback():
            return _compiled_off(self, *args, **kwargs)
        if self._is_tensordict_module and (kwargs or not args or (self.in_keys and type(args[0]) is not TensorDict
                                                                  and not isinstance(args[0], TensorDictBase))):
            # keyword calls, positional tensors and tensordict_out go through tensordict's
            # dispatch; a TensorDict call is passed on unchanged by it, so it skips the wrapper
            # (and a function reading a TensorDict, in_keys=[], is not given one built from a tensor)
            given = args[0] if args and isinstance(args[0], TensorDictBase) else kwargs.get("tensordict")
            return self._call_td(*args, _given=given, **kwargs)
        with self._lock:
            if get_ident() != self._thread:
                self._switch_thread()
            graphs = self._graphs
            entries = graphs.entries
            if entries:
                entry = entries[0]
                if kwargs and self._sort_kwargs:
                    kwargs = sorted_kwargs(kwargs)
                mode = self._mode.read()
                if graphs.switching:  # the last call switched graphs (a flag that alternates): its index first
                    hinted = graphs.index.find(args, kwargs, mode, entries)
                    if hinted is not None:
                        entry = hinted
                verdict, split = decide(entry, args, kwargs, mode)
                if verdict is OTHER and len(entries) > 1:
                    # another signature: the graph calls of these shapes, values and modes matched last
                    entry = graphs.index.find(args, kwargs, mode, entries) if entry is entries[0] else entries[0]
                    if entry is not None:
                        verdict, split = decide(entry, args, kwargs, mode)
                if verdict is REPLAY:
                    if entry is not entries[0]:
                        graphs.switching = True
                        entries.remove(entry)
                        entries.insert(0, entry)
                    elif graphs.switching:
                        graphs.switching = False
                    leaves, objs = split
                    return entry.outputs.serve(entry, leaves, objs, (args, kwargs))  # (entry.replay's work)
            return self._slow(args, kwargs)

    @dispatch(source="in_keys", dest="out_keys", auto_batch_size=False)
    def _call_td(self, tensordict, *args: Any, tensordict_out=None, _given=None, **kwargs: Any) -> Any:
        with self._lock:
            # built by dispatch from keywords or tensors (batch size []): the caller never sees
            # it, and it takes the batch size of a graph its entries fit (_dispatch.fit_batch)
            built = tensordict if tensordict is not _given and isinstance(tensordict, TensorDictBase) else None
            if built is not None and self._both_styles:
                self._graphs.fit_built(built)
            self._built = built
            try:
                if tensordict_out is None and not kwargs and isinstance(tensordict, TensorDictBase):
                    return self(tensordict, *args)  # a TensorDict first, no keywords: the hot path
                if tensordict_out is not None:
                    kwargs["tensordict_out"] = tensordict_out
                if get_ident() != self._thread:  # keywords beside the TensorDict, or no TensorDict
                    self._switch_thread()
                return self._slow((tensordict, *args), kwargs)
            finally:
                self._built = None

    def _one_tensordict(self, args: tuple, kwargs: dict) -> bool:
        """A call ``g(td)`` of a TensorDict module served in both call styles (see _graphs)."""
        return self._both_styles and len(args) == 1 and not kwargs and isinstance(args[0], TensorDictBase)

    def _switch_thread(self) -> None:
        """Another thread calls: the runner orders its stream after the last caller's."""
        self._thread = get_ident()
        self._runner.new_caller()

    def _slow(self, args: tuple, kwargs: dict) -> Any:
        if SCOPE.inside():  # called inside another wrapper's capture: record inline into it
            self._stats.inline_calls += 1
            return self.module(*args, **kwargs)
        if self._state is State.FAILED:
            raise GraphStateError(
                f"{self._owner} failed to capture its graph earlier and does not retry: "
                f"{str(self._failure).splitlines()[0]}\nFix the cause, then call reset() to "
                "warm up and capture again, or pass on_capture_failure='eager'."
            ) from self._failure
        if kwargs and self._sort_kwargs:
            kwargs = sorted_kwargs(kwargs)
        graphs = self._graphs
        mode = self._mode.read() if self._mode is not None else None
        found = graphs.find(args, kwargs, mode)
        if found.verdict is REPLAY:  # (not INLINE: a call inside a capture ran inline above)
            return found.entry.replay(found.leaves, found.objs, (args, kwargs))
        if found.verdict is STALE:
            return self._stale(found.entry, args, kwargs)
        if found.verdict is REFUSED:
            if self._one_tensordict(args, kwargs):
                # other nested TensorDicts where the module writes (g(td) after g(obs=x), or the reverse)
                out = found.entry.through_stand_in(args[0], self.in_keys, mode)
                if out is not NOT_SERVED:
                    return out
            self._stats.input_mismatches += 1
            raise InputMismatchError(self._owner, found.entry.extra_mismatches(found.leaves, found.entry.texts,
                                                                               found.objs), found.entry.when)
        if self.options.max_graphs is None:
            return self._variant(args, kwargs, mode)
        if graphs.entries:  # a signature no graph has
            if len(graphs.entries) >= self.options.max_graphs and self.options.on_graph_limit == "raise":
                if self._one_tensordict(args, kwargs):
                    # g(td) where a graph has its entries under another batch size (captured from g(obs=x))
                    out = graphs.other_batch_size(args[0], mode)
                    if out is not NOT_SERVED:
                        return out
                self._raise_mismatch(graphs.entries[0], args, kwargs, mode)
            return self._new_signature(args, kwargs)
        if self._warmed < self.warmup:
            out = graphs.warmup_call(args, kwargs, first=True)
            self._warmed += 1
            self._stats.warmup_calls += 1
            return out
        return self._capture(args, kwargs)

    def _variant(self, args: tuple, kwargs: dict, mode: Any) -> Any:
        """``max_graphs=None``: a call no graph takes warms up and is captured, counted per
        signature, where it differs from the graphs held only in Python values and modes
        (``_variants``), up to ``AUTO_GRAPHS`` signatures held or warming up; else refused
        (or, with ``on_graph_limit="evict"``, served, evicting at its capture)."""
        graphs = self._graphs
        try:
            warming = graphs.signature(args, kwargs, global_mode() if mode is None else mode)
        except GraphModuleError:  # a call no capture takes (a sparse tensor, a ragged lazy stack...)
            if graphs.entries:
                if self.options.on_graph_limit == "raise":
                    self._raise_mismatch(graphs.closest(args, kwargs, mode), args, kwargs, mode)
                raise
            # before any capture it runs its warmup calls, as eagerly; its capture raises why
            if self._warmed < self.warmup:
                self._warmed += 1
                self._stats.warmup_calls += 1
                return graphs.warmup_call(args, kwargs, first=True)
            return self._capture(args, kwargs)
        room = graphs.room(warming, self.options.on_graph_limit)
        if room in (Room.OTHER_TENSORS, Room.FULL) and self.options.on_graph_limit == "raise":
            if room is Room.OTHER_TENSORS:
                if self._one_tensordict(args, kwargs):  # see the same case in _slow
                    out = graphs.other_batch_size(args[0], mode)
                    if out is not NOT_SERVED:
                        return out
                self._raise_mismatch(graphs.closest(args, kwargs, mode), args, kwargs, mode)
            self._stats.input_mismatches += 1
            raise graphs.limit_error(args, kwargs, mode, self._mode)
        if warming.calls < self.warmup:
            out = graphs.warmup_call(args, kwargs, first=not graphs.entries, warming=warming)
            self._stats.warmup_calls += 1
            return out
        if self.options.on_graph_limit == "evict":
            graphs.make_room_for(warming)
        return self._capture(args, kwargs, warming)

    def _new_signature(self, args: tuple, kwargs: dict) -> Any:
        """A call that matches no graph, with room for another (or eviction): warm up, capture."""
        graphs = self._graphs
        if graphs.warming(args, kwargs, self._mode.read(), self.warmup):
            self._stats.warmup_calls += 1
            return graphs.warmup_call(args, kwargs, first=False)
        graphs.make_room(self.options.graph_limit)
        return self._capture(args, kwargs)

    def _capture(self, args: tuple, kwargs: dict, warmed: Warming | None = None) -> Any:
        call = self._graphs.read(args, kwargs)
        watch = Discovery(self.module)  # what it reads (the graph's Watch is taken by the capture)
        reader = self._mode or mode_reader(watch)
        mode = reader.read()
        if self._eager_only:
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
        if entry.handle is None:  # (no CUDA)
            self._state = State.EAGER
        else:
            self._state = State.CAPTURED
            note_capture(self)  # released before its process groups are destroyed (_distributed)
        return entry.finish(call.leaves, call.objs, call.tree)

    def _capture_failed(self, err: CaptureError, call: CallRead, mode: Any, reader: Any, watch: Discovery,
                        ran: Any = NOT_RUN, warmed: Warming | None = None) -> Any:
        """A failed capture; ``ran`` is the call's result if it already ran eagerly."""
        self._stats.capture_failures += 1
        log.warning("%s: capture failed (%s)", self._owner, err.cause)
        if self.options.on_capture_failure == "raise":
            self._failure = err
            self._state = State.FAILED
            if ran is NOT_RUN:
                raise err
            warnings.warn(f"{err}\nThe call ran eagerly instead; later calls raise until reset().",
                          UserWarning, stacklevel=user_stacklevel())
            return ran
        warnings.warn(f"{err}\n{self._owner} runs eagerly from now on (on_capture_failure='eager').",
                      UserWarning, stacklevel=user_stacklevel())
        self._eager_only = True
        return self._run_eagerly(call, reader, mode, watch, ran, warmed)

    def _run_eagerly(self, call: CallRead, reader: Any, mode: Any, watch: Discovery, ran: Any = NOT_RUN,
                     warmed: Warming | None = None) -> Any:
        """State.EAGER: this call's signature runs eagerly from now on, checked as a graph's."""
        _, out = self._graphs.eager(call, mode, watch, ran)
        self._graphs.warmed(warmed)
        self._first_reader(reader)
        self._state = State.EAGER
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
        if (self.options.on_stale == "raise" and not entry.watch.grads_moved()) or not changes:
            raise StaleGraphError(self._owner, changes or [("state", "changed")], entry.when)
        self._stats.recaptures += 1
        log.info("%s: dropping a stale graph (%s)", self._owner, "; ".join(f"{w}: {c}" for w, c in changes))
        self._graphs.drop(entry)
        if not self._graphs.entries:
            self._warmed = 0
            self._graphs.pending.clear()  # (what they warmed up may have changed too)
            if not self._eager_only:
                self._state = State.WARMUP
            return self._slow(args, kwargs)
        if self.options.max_graphs is None:
            return self._variant(args, kwargs, self._mode.read())
        return self._new_signature(args, kwargs)

    def _raise_mismatch(self, entry: Entry, args: tuple, kwargs: dict, mode: Any) -> None:
        """A call that ``entry`` (the most recently used graph) does not take, where no other may."""
        self._stats.input_mismatches += 1
        modes = self._mode.mismatches(entry.mode, mode) if mode != entry.mode else []
        # a TensorDict built from keywords has no batch size of the caller's to blame
        built = self._built is not None and bool(args) and args[0] is self._built
        raise mismatch_error(self._owner, entry.spec, (args, kwargs), self._arg_names, modes,
                             self._is_tensordict_module, entry.when, built)

