"""``CudaGraphModule``: the wrapper, its construction and the hot path of a call.

Its life cycle is a table (``_lifecycle``)::

    WARMUP ──(call warmup+1)──► capture ──ok──► CAPTURED (every call: match, copy, replay)
       ▲                           │                 │ new signature with room: warm up, capture
       │                           ├─fails, on_capture_failure="raise"──► FAILED (raises until reset())
       └──────── reset() ──────────┴─fails, on_capture_failure="eager"──► EAGER (a capture failed)
                                   └─no graphs (no CUDA, backend="eager")─► EAGER (no CUDA | backend)

A new signature has room under ``max_graphs=N`` graphs, or by default where it differs from
the held graphs only in Python values and modes (``_variants``); by default each signature, the
first included, is captured after ``warmup`` calls of its own (counted by the graphs,
``_graphs.Warming``).

In ``EAGER`` a signature's "graph" is an ``EagerEntry``, which runs the function on each
call's own arguments: signatures, ``max_graphs``, eviction and staleness work as with graphs.
Without CUDA its capture is a simulated one (``_eager.CheckingRunner``), which raises what a
capture raises, so a wrapper without CUDA accepts and refuses what it would on a GPU.

A call that the most recent graph replays (``_entry.decide``) takes the hot path in
:meth:`__call__`; every other call (warmup, a capture, another graph, a stale graph, a
mismatch to explain) takes :meth:`_slow`, which asks the wrapper's graphs (``_graphs``) and
ends in a capture, its failure or a stale graph dropped (``_capturing``, which moves the
phase). A TensorDict module's keyword calls reach the hot path through the call style chosen
at construction (``_dispatch.TensorDictCalls``).
"""

from __future__ import annotations

import threading
from threading import get_ident
from typing import Any, Callable

import torch
import torch._dynamo.decorators
from tensordict import TensorDict, TensorDictBase

from ._backend import make_runner
from ._capturing import Capturing
from ._dispatch import TensorDictCalls, binds_kwargs_by_name, module_name, resolve_keys, sorted_kwargs
from ._entry import NOT_SERVED, OTHER, REFUSED, REPLAY, STALE, Entry, decide
from ._errors import CaptureError, GraphModuleError, GraphStateError, InputMismatchError
from ._explain import mismatch_error
from ._graphs import Graphs
from ._lifecycle import Event, Phase
from ._mode import global_mode
from ._options import Options
from ._policy import OutputPolicy
from ._scope import SCOPE
from ._stats import GraphStats
from ._surface import WrapperSurface
from ._variants import Room

__all__ = ["CudaGraphModule"]

# dynamo's callback in this thread: a function while code that torch.compile runs calls the
# wrapper, else None (or False: dynamo's run-only mode, which compiles nothing)
_dynamo_callback = torch._C._dynamo.eval_frame.get_eval_frame_callback
_skip_frame = torch._dynamo.decorators.skip


@torch.compiler.disable
def _compiled_off(wrapper: Any, *args: Any, **kwargs: Any) -> Any:
    """A call made where dynamo is on: the wrapper's call, and what it calls, with dynamo off."""
    return wrapper(*args, **kwargs)


class CudaGraphModule(Capturing, WrapperSurface):
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
        self._policy = OutputPolicy(outputs)
        self._owner = f"CudaGraphModule({module_name(module)})"
        # a TensorDict module's call styles (_dispatch), chosen once: None for a plain function's calls
        self._td = None if self.in_keys is None else TensorDictCalls(module, self.in_keys, self.out_keys)
        self._arg_names = ("tensordict",) if self._td is not None else ()
        self._sort_kwargs = binds_kwargs_by_name(module) and self._td is None
        self._runner = make_runner(backend, device, capture_error_mode, pool, debug)
        self.device = self._runner.device
        self._stats = GraphStats()
        # One call at a time: calls share the graph's buffers. Reentrant, for a function
        # that calls its own wrapper while another wrapper captures it.
        self._lock = threading.RLock()
        self._thread: int | None = None  # the thread that called last
        self._phase = Phase.WARMUP  # (moved by its table only, _lifecycle)
        self._reset_state()

    def _reset_state(self) -> None:
        self._graphs = Graphs(owner=self._owner, module=self.module, runner=self._runner, stats=self._stats,
                              policy=self._policy, in_keys=self.in_keys, arg_names=self._arg_names)
        self._mode = None  # the ModeReader, from the first capture
        self._failure: CaptureError | None = None  # the capture that moved it to FAILED

    # -- public surface (the rest, read-only, in _surface) ----------------------------
    def reset(self) -> None:
        """Drop every graph; the next calls warm up and capture again."""
        with self._lock:  # (not while another thread's call replays them)
            self._graphs.release()
            if self._failure is not None:  # its traceback holds the failed capture's objects
                SCOPE.collect_before_next_capture()
            self._reset_state()
            self._move(Event.RESET)

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
        td = self._td
        if td is not None and (kwargs or not args or (td.keyed and type(args[0]) is not TensorDict
                                                      and not isinstance(args[0], TensorDictBase))):
            # keyword calls, positional tensors and tensordict_out go through tensordict's
            # dispatch; a TensorDict call skips it (it would pass the TensorDict on unchanged)
            return td.call(self, args, kwargs)
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

    def _call_built(self, tensordict: Any, args: tuple, kwargs: dict, built: TensorDictBase | None) -> Any:
        """A TensorDict module's call once dispatch read it (``_dispatch.TensorDictCalls``);
        ``built``: the TensorDict dispatch built from keywords or tensors (batch size []), which
        takes the batch size of a graph its entries fit (``_dispatch.fit_batch``)."""
        td = self._td
        with self._lock:
            if built is not None and td.both_styles:
                self._graphs.fit_built(built)
            td.built = built
            try:
                if not kwargs and isinstance(tensordict, TensorDictBase):
                    return self(tensordict, *args)  # a TensorDict first, no keywords: the hot path
                if get_ident() != self._thread:  # keywords beside the TensorDict, or no TensorDict
                    self._switch_thread()
                return self._slow((tensordict, *args), kwargs)
            finally:
                td.built = None

    def _switch_thread(self) -> None:
        """Another thread calls: the runner orders its stream after the last caller's."""
        self._thread = get_ident()
        self._runner.new_caller()

    def _slow(self, args: tuple, kwargs: dict) -> Any:
        if SCOPE.inside():  # called inside another wrapper's capture: record inline into it
            self._stats.inline_calls += 1
            return self.module(*args, **kwargs)
        if self._phase is Phase.FAILED:
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
            if self._td is not None and self._td.one_tensordict(args, kwargs):
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
                out = self._at_another_batch_size(args, kwargs, mode)
                if out is not NOT_SERVED:
                    return out
                self._raise_mismatch(graphs.entries[0], args, kwargs, mode)
            return self._new_signature(args, kwargs)
        if graphs.first.calls < self.warmup:
            return graphs.warmup_call(args, kwargs, graphs.first)
        return self._capture(args, kwargs)

    def _at_another_batch_size(self, args: tuple, kwargs: dict, mode: Any) -> Any:
        """``g(td)`` of a TensorDict module where a graph has its entries under another batch size
        (captured from ``g(obs=x)``): that graph's result, else ``NOT_SERVED``."""
        if self._td is not None and self._td.one_tensordict(args, kwargs):
            return self._graphs.other_batch_size(args[0], mode)
        return NOT_SERVED

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
            if graphs.first.calls < self.warmup:
                return graphs.warmup_call(args, kwargs, graphs.first)
            return self._capture(args, kwargs)
        room = graphs.room(warming, self.options.on_graph_limit)
        if room in (Room.OTHER_TENSORS, Room.FULL) and self.options.on_graph_limit == "raise":
            if room is Room.OTHER_TENSORS:
                out = self._at_another_batch_size(args, kwargs, mode)
                if out is not NOT_SERVED:
                    return out
                self._raise_mismatch(graphs.closest(args, kwargs, mode), args, kwargs, mode)
            self._stats.input_mismatches += 1
            raise graphs.limit_error(args, kwargs, mode, self._mode)
        if warming.calls < self.warmup:
            return graphs.warmup_call(args, kwargs, warming)
        if self.options.on_graph_limit == "evict":
            graphs.make_room_for(warming)
        return self._capture(args, kwargs, warming)

    def _new_signature(self, args: tuple, kwargs: dict) -> Any:
        """A call that matches no graph, with room for another (or eviction): warm up, capture."""
        graphs = self._graphs
        warming = graphs.signature(args, kwargs, self._mode.read())
        if warming.calls < self.warmup:
            return graphs.warmup_call(args, kwargs, warming)
        graphs.warmed(warming)  # (captured below: forgotten)
        graphs.make_room(self.options.graph_limit)
        return self._capture(args, kwargs)

    def _raise_mismatch(self, entry: Entry, args: tuple, kwargs: dict, mode: Any) -> None:
        """A call that ``entry`` (the most recently used graph) does not take, where no other may."""
        self._stats.input_mismatches += 1
        modes = self._mode.mismatches(entry.mode, mode) if mode != entry.mode else []
        # a TensorDict built from keywords has no batch size of the caller's to blame
        built = self._td is not None and self._td.built_first(args)
        raise mismatch_error(self._owner, entry.spec, (args, kwargs), self._arg_names, modes,
                             self._td is not None, entry.when, built)

