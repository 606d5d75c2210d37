"""``CudaGraphModule``: a state machine over warmup, capture and replay.

::

    WARMUP ──(call warmup+1)──► capture ──ok──► CAPTURED (every call: match, copy, replay)
       ▲                           │                 │ new signature, max_graphs > 1: warm up, capture
       │                           ├─fails, on_capture_failure="raise"──► FAILED (raises until reset())
       └──────── reset() ──────────┴─fails, on_capture_failure="eager"──► EAGER
                                                           no CUDA ─────► EAGER (checked, eager)

A call that matches the most recent graph takes the hot path in :meth:`__call__`; every
other call (warmup, a capture, another graph, a mismatch to explain) takes
:meth:`_slow`.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
import weakref
from threading import get_ident
from typing import Any, Callable

import torch
from tensordict import TensorDictBase
from tensordict.nn import dispatch

from ._capture import _DEPTH, capturing, collect_before_next_capture, make_runner
from ._diagnose import USER_ERROR
from ._distributed import check_capture, explain_failure, note_capture
from ._dispatch import binds_kwargs_by_name, by_key_paths, module_name, resolve_keys, sorted_kwargs
from ._entry import Entry
from ._errors import CaptureError, GraphStateError, InputMismatchError, StaleGraphError
from ._explain import describe_spec, mismatch_error
from ._grad import tracks_grad
from ._index import CallIndex
from ._lend import LEND_LATER, OUTPUT_SETS
from ._options import Options, State
from ._paths import user_stacklevel
from ._record import leaf_keys, mode_reader, read_call, record
from ._spec import InputSpec
from ._stale import Watch
from ._stats import GraphStats
from ._surface import WrapperSurface

__all__ = ["CudaGraphModule"]

log = logging.getLogger("graphmodule")


_NOTHING = object()


def _buffer_bytes(tensors: list[torch.Tensor]) -> int:
    """The memory of the storages under ``tensors``, each counted once."""
    storages = (t.untyped_storage() for t in tensors)
    return sum({s._cdata: s.nbytes() for s in storages}.values())


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
        max_graphs: graphs kept for different signatures (shapes, modes...). With the
            default 1, a call with another signature is an error.
        on_graph_limit: with ``max_graphs`` graphs held, a new signature ``"raise"``\\ s
            (default) or ``"evict"``\\ s the least recently used graph.
        pool: a memory pool shared with other graphs (``torch.cuda.graph_pool_handle()``
            or another wrapper's ``pool``); all graphs of a wrapper share its pool.
        backend: ``"auto"`` (CUDA graphs if CUDA is available, else eager with a
            warning), ``"cuda"``, ``"eager"`` (no graphs; every check still runs) or
            ``"simulate"`` (the full capture/replay machinery, with each replay
            re-running the function on the graph's buffers: tests on CPU).
        debug: keep each CUDA graph's structure for :meth:`debug_dump` (costs host memory).

    Example:
        >>> import torch, warnings
        >>> from graphmodule import CudaGraphModule
        >>> device = "cuda" if torch.cuda.is_available() else "cpu"
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")  # no CUDA: a warning, then eager calls
        ...     g = CudaGraphModule(lambda x, y: x * y + 1)
        >>> x, y = torch.ones(3, device=device), torch.full((3,), 2.0, device=device)
        >>> for _ in range(4):
        ...     out = g(x, y)
        >>> out.tolist()
        [3.0, 3.0, 3.0]
        >>> g(x, y.double())
        Traceback (most recent call last):
          ...
        graphmodule._errors.InputMismatchError: CudaGraphModule(<lambda>) was captured with other inputs than this call's (1 mismatch):
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
        max_graphs: int = Options.max_graphs,
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
        self._runner = make_runner(backend, device, capture_error_mode, pool, debug)
        self.device = self._runner.device
        self._stats = GraphStats()
        # One call at a time: calls share the graph's buffers. Reentrant, for a function
        # that calls its own wrapper while another wrapper captures it.
        self._lock = threading.RLock()
        self._thread: int | None = None
        self._stream: Any = None
        self._reset_state()

    def _reset_state(self) -> None:
        self._entries: list[Entry] = []  # most recently used first
        self._index = CallIndex()  # which entry calls of other shapes or modes matched last
        self._state = State.WARMUP
        self._eager_spec: InputSpec | None = None
        self._eager_mode: Any = None
        self._failure: CaptureError | None = None
        self._warmed = 0
        self._pending: dict[Any, int] = {}  # warmup calls of signatures not captured yet
        self._mode = None  # the ModeReader, from the first capture
        self._returned_input: bool | None = None
        self._warm_keys: list | None = None  # keys of the TensorDict the last warmup call returned
        self._layer_hint = False  # the last warmup call returned tensors that track gradients (_grad)
        # the compiled hot path's mirror of this state (_native): None until armed, False never
        self._hot: Any = None
        self._hot_misses = 0
        self._hot_served: int | None = None  # calls the state dropped before the last call served

    # -- public surface ----------------------------------------------------------------
    @property
    def state(self) -> State:
        """The current :class:`State` (compares equal to ``"warmup"``, ``"captured"``...)."""
        return self._state

    @property
    def stats(self) -> GraphStats:
        """A snapshot of the counters (see :class:`GraphStats`)."""
        stats = self._stats.copy()
        stats.graphs = len(self._entries)
        stats.graph_bytes = tuple(entry.capture_bytes for entry in self._entries)
        stats.pool_bytes = self._runner.pool_bytes() if self._entries and hasattr(self._runner, "pool_bytes") else 0
        return stats

    @property
    def pool(self) -> Any:
        """The memory pool of this wrapper's graphs (pass it as ``pool=`` to share it)."""
        return getattr(self._runner, "mempool", None) or getattr(self._runner, "pool", None)

    @property
    def graph(self) -> torch.cuda.CUDAGraph | None:
        """The most recently used captured ``torch.cuda.CUDAGraph``, if any."""
        handle = self._entries[0].handle if self._entries else None
        return handle if isinstance(handle, torch.cuda.CUDAGraph) else None

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
        if not self._entries:
            raise GraphStateError(f"{self._owner} holds no graph yet (state {self._state.value}): "
                                  "call it until it has captured, then dump.")
        if not self.options.debug:
            raise GraphStateError(f"{self._owner} was built without debug=True, so its graphs keep no "
                                  "structure to dump: build it with CudaGraphModule(..., debug=True).")
        root, ext = os.path.splitext(os.fspath(path))
        paths = [os.fspath(path)] if len(self._entries) == 1 else [f"{root}.{n}{ext}" for n in range(len(self._entries))]
        for entry, where in zip(self._entries, paths):
            self._runner.debug_dump(entry.handle, where, self._owner)
            if not os.path.exists(where):
                raise GraphStateError(f"torch wrote no file at {where} for {self._owner}'s graph.")
        return paths

    def explain(self) -> str:
        """The state and, once captured, each graph's input signature."""
        lines = [f"{self._owner}: state {self._state.value}, {self.stats}"]
        specs = [entry.spec for entry in self._entries] or ([self._eager_spec] if self._eager_spec else [])
        layers = [entry.layer for entry in self._entries] or [None]
        for n, (spec, layer) in enumerate(zip(specs, layers)):
            lines.append("captured inputs:" if len(specs) == 1 else f"graph {n} inputs:")
            text = describe_spec(spec, self._arg_names)
            lines += ["  " + line for line in text.splitlines()]
            if layer is not None:
                lines.append("  " + layer.describe())
        if self._failure is not None:
            lines.append(f"capture failed: {self._failure}")
        return "\n".join(lines)

    def reset(self) -> None:
        """Drop every graph; the next calls warm up and capture again."""
        with self._lock:  # (not while another thread's call replays them)
            self._hot = None
            for entry in self._entries:
                entry.release()
            if self._failure is not None:  # its traceback holds the failed capture's objects
                collect_before_next_capture()
            self._reset_state()

    # -- calls -------------------------------------------------------------------------
    def _python_call(self, *args: Any, **kwargs: Any) -> Any:
        # The hot path, in this one frame: the most recent graph's checks, then its replay
        # (Entry.replay); anything else goes to _slow.
        if self._is_tensordict_module and (kwargs or not args or not isinstance(args[0], TensorDictBase)):
            # keyword calls and tensordict_out go through tensordict's dispatch; a
            # TensorDict call is passed on unchanged by it, so it skips the wrapper
            return self._call_td(*args, **kwargs)
        with self._lock:
            if self._hot:  # the compiled path's mirror (_native): this call may change the state
                self._hot = None
            if get_ident() != self._thread:
                self._switch_thread()
            entries = self._entries
            if entries:
                entry = entries[0]
                if kwargs and self._sort_kwargs:
                    kwargs = sorted_kwargs(kwargs)
                split = entry.spec.match(args, kwargs)
                mode = self._mode.read()
                if (split is None or mode != entry.mode) and len(entries) > 1:
                    # another signature: the graph calls of these shapes and modes matched last
                    entry = self._index.find(args, kwargs, mode, entries)
                    split = entry.spec.match(args, kwargs) if entry is not None else None
                if (
                    split is not None
                    and mode == entry.mode
                    and entry.watch.check()
                    and (entry.plain or entry.extra_ok(split[0], split[1]))
                    and not (_DEPTH[0] and capturing())
                ):
                    if entry is not entries[0]:
                        entries.remove(entry)
                        entries.insert(0, entry)
                    self._stats.replays += 1
                    return entry.replay(split[0], split[1], (args, kwargs))
            return self._slow(args, kwargs)

    # (enable_native() sets a C function that serves the commonest calls and hands the
    # others to _python_call, see _native)
    __call__ = _python_call

    @dispatch(source="in_keys", dest="out_keys", auto_batch_size=False)
    def _call_td(self, tensordict, *args: Any, tensordict_out=None, **kwargs: Any) -> Any:
        if tensordict_out is None and not kwargs and isinstance(tensordict, TensorDictBase):
            return self(tensordict, *args)  # a TensorDict first, no keywords: the hot path
        if tensordict_out is not None:
            kwargs["tensordict_out"] = tensordict_out
        with self._lock:  # keywords beside the TensorDict, or no TensorDict: the full path
            if get_ident() != self._thread:
                self._switch_thread()
            return self._slow((tensordict, *args), kwargs)

    def _switch_thread(self) -> None:
        """Another thread calls: order its stream after the last caller's, whose replay and
        copies may still be running on the GPU when this call writes the same buffers."""
        self._thread = get_ident()
        device = self.device
        if device is None or not torch.cuda.is_available():
            return
        stream = torch.cuda.current_stream(device)
        if self._stream is not None and self._stream != stream:
            stream.wait_stream(self._stream)
        self._stream = stream

    def _slow(self, args: tuple, kwargs: dict) -> Any:
        if capturing():  # called inside another wrapper's capture: record inline into it
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
        if self._state is State.EAGER:
            return self._eager_call(args, kwargs)
        mode = self._mode.read() if self._mode is not None else None
        for n, entry in enumerate(self._entries):
            split = entry.spec.match(args, kwargs)
            if split is None or entry.mode != mode:
                continue
            if not entry.watch.check():
                return self._stale(entry, args, kwargs)
            found = entry.extra_mismatches(split[0], entry.texts, split[1])
            if found:
                self._stats.input_mismatches += 1
                raise InputMismatchError(self._owner, found)
            if len(self._entries) > 1:
                self._index.remember(args, kwargs, mode, entry, self._entries)
            self._entries.insert(0, self._entries.pop(n))
            self._stats.replays += 1
            return entry.replay(split[0], split[1], (args, kwargs))
        if self._entries:
            if len(self._entries) >= self.options.max_graphs and self.options.on_graph_limit == "raise":
                self._raise_mismatch(self._entries[0], args, kwargs, mode)
            return self._new_signature(args, kwargs)
        if self._warmed < self.warmup:
            return self._warmup_call(args, kwargs)
        return self._capture(args, kwargs)

    def _warmup_call(self, args: tuple, kwargs: dict) -> Any:
        out = self._runner.run_eager(lambda: self.module(*args, **kwargs))
        self._layer_hint = tracks_grad(out)
        self._warmed += 1
        self._stats.warmup_calls += 1
        if self._returned_input is None and self._is_tensordict_module and args:
            self._returned_input = out is args[0]
        self._warm_keys = leaf_keys(out)
        return out

    def _new_signature(self, args: tuple, kwargs: dict) -> Any:
        """A call that matches no graph, with room for another (or eviction): warm up, capture."""
        tree = (args, kwargs)
        layout, leaves, _, _ = read_call(self._owner, tree, self._by_key(kwargs), self._arg_names, self.device)
        key = InputSpec(layout, leaves, self._mode.read()).key
        count = self._pending.get(key, 0)
        if count < self.warmup:
            self._pending[key] = count + 1
            self._stats.warmup_calls += 1
            out = self._runner.run_eager(lambda: self.module(*args, **kwargs))
            self._layer_hint = tracks_grad(out)
            return out
        self._pending.pop(key, None)
        if len(self._entries) >= self.options.max_graphs:
            evicted = self._entries.pop()
            evicted.release()
            self._stats.evictions += 1
            log.info("%s: evicted its least recently used graph for a new signature", self._owner)
        return self._capture(args, kwargs)

    def _by_key(self, kwargs: dict) -> dict:
        return by_key_paths(self.in_keys, "tensordict_out" in kwargs)

    def _capture(self, args: tuple, kwargs: dict) -> Any:
        tree = (args, kwargs)
        layout, leaves, objs, texts = read_call(self._owner, tree, self._by_key(kwargs), self._arg_names,
                                                self.device)
        watch = Watch(self.module)
        reader = self._mode or mode_reader(watch)
        mode = reader.read()
        if not self._runner.captures:
            self._mode = reader
            self._eager_spec, self._eager_mode = InputSpec(layout, leaves, mode), mode
            self._state = State.EAGER
            self._stats.eager_calls += 1
            return self.module(*args, **kwargs)
        # outputs="safe" where the pool already holds a graph (another signature's, another
        # wrapper's): results lent from this capture's memory could sit where that graph
        # writes its temporaries. This call returns copies; the next one captures it again
        # with its results copied out of the pool (a twin of it, see _twin), which lends them.
        lend = self._lend
        lend_later = lend and not self._layer_hint and self._runner.pool_in_use()
        try:
            check_capture(self._owner, watch.modules)  # a DDP step that cannot be captured (_distributed)
            entry, _ = record(owner=self._owner, module=self.module, runner=self._runner, layout=layout,
                              leaves=leaves, mode=mode, clone=self._clone, lend=lend and not lend_later, texts=texts,
                              objs=objs, eager_keys=self._warm_keys if not self._entries else None,
                              alone=self._layer_hint)
        except CaptureError as err:
            err = explain_failure(err, watch.modules)  # DDP's part in it, if any (_distributed)
            if err.cause != USER_ERROR:
                return self._capture_failed(err, layout, leaves, mode, reader, args, kwargs)
            # The function raised while it was captured, with no sign of the capture being to
            # blame. Run the call eagerly: it raises as it would have (with the same partial
            # effects on the arguments), and the wrapper is unchanged.
            out = self._runner.run_eager(lambda: self.module(*args, **kwargs))
            # It did not raise eagerly: the capture was to blame after all.
            return self._capture_failed(err, layout, leaves, mode, reader, args, kwargs, ran=out)
        self._mode = reader
        self._entries.insert(0, entry)
        self._state = State.CAPTURED
        note_capture(self)  # released before its process groups are destroyed (_distributed)
        self._stats.captures += 1
        self._stats.replays += 1
        self._stats.capture_seconds = self._runner.capture_seconds
        entry.capture_bytes = self._runner.capture_bytes
        log.info("%s: captured graph %d in %.1f ms (%d held)", self._owner, self._stats.captures,
                 1e3 * self._runner.capture_seconds, len(self._entries))
        if entry.plan.lender is not None:
            entry.renew = self._renewer()
        out = entry.finish(leaves, objs, tree)
        if lend_later and entry.layer is None and entry.plan.graph:
            # its next replay finds the results "held" and renews (_renew): the lending capture
            entry.plan.lender = LEND_LATER
            entry.renew = self._renewer()
        return out

    def _renewer(self) -> Callable[..., Any]:
        """What an entry lending its outputs calls when the caller still holds them
        (outputs="safe", see _lend), holding no reference to the wrapper or the entry (an
        entry would otherwise outlive its last use)."""
        ref = weakref.ref(self)

        def renew(entry: Entry, leaves: Any, objs: dict, tree: Any) -> Any:
            wrapper = ref()
            if wrapper is None:  # unreachable while the wrapper calls; kept for safety
                raise GraphStateError("the wrapper of this graph is gone")
            return wrapper._renew(entry, leaves, objs, tree)

        return renew

    def _renew(self, entry: Entry, leaves: Any, objs: dict, tree: Any) -> Any:
        """A caller holds the results of every output set of ``entry``: the call needs
        buffers nobody holds. Up to :data:`OUTPUT_SETS` sets, a new one (a *twin*); past
        that, a graph returning copies replaces them all (a loop that keeps that many
        results keeps results)."""
        if entry.plan.lender is LEND_LATER:
            return self._capture_lending(entry, leaves, objs, tree)
        if entry.held_eager:
            return self._eager_while_held(tree)
        if not entry.sets_done and 1 + len(entry.others) < OUTPUT_SETS:
            made = self._capture_twin(entry, leaves, objs, tree)
            if made is not _NOTHING:
                return made
            entry.sets_done = True
        return self._capture_copying(entry, leaves, objs, tree)

    def _record_again(self, entry: Entry, leaves: Any, objs: dict, lend: bool, like: Entry | None = None) -> Entry:
        """``entry``'s call captured again: a lending one (``lend``), or a graph returning copies.

        A lending capture copies its results, inside its graph, into buffers of its own
        beside ``like``'s graph, laid out as ``like``'s results (``_twin``); a layer's, whose
        activations must outlive the replay until its backward, is a whole capture in a pool
        of its own."""
        if entry.layer is not None:
            like = None
        return record(owner=self._owner, module=self.module, runner=self._runner, layout=entry.spec.layout,
                      leaves=list(leaves), mode=entry.mode, clone=True, lend=lend, texts=entry.texts,
                      objs=objs, alone=entry.layer is not None, like=like)[0]

    def _record_lending(self, entry: Entry, leaves, objs, failed: str) -> Entry | None:
        """``entry``'s call captured again beside it, its results copied into buffers of its
        own, which it lends; ``None`` (logged as ``failed``) if that capture failed or cannot
        lend (the caller keeps ``entry``)."""
        try:
            lending = self._record_again(entry, leaves, objs, lend=True, like=entry)
        except Exception as err:  # noqa: BLE001 - entry's graph is still good
            log.info("%s: %s (%s)", self._owner, failed, str(err).splitlines()[0] if str(err) else type(err).__name__)
            collect_before_next_capture()
            return None
        if lending.plan.lender is None:
            lending.release()
            return None
        lending.renew = entry.renew
        return lending

    def _lending_bytes(self, lending: Entry) -> int:
        """What a lending capture costs: its output buffers (outside any pool), and what the
        capture added to the pool."""
        return self._runner.capture_bytes + _buffer_bytes(lending.plan.graph)

    def _capture_twin(self, entry: Entry, leaves, objs, tree) -> Any:
        """The same call captured again, with buffers of its own; its result, or ``_NOTHING``
        if that failed.

        A function that rebinds state it reads (``group["lr"] = lr0 * alpha``) left that
        state as the twin's capture made it, which ``entry``'s graphs do not read: the twin
        then replaces them, and no set is added again.
        """
        twin = self._record_lending(entry, leaves, objs, "no further output set")
        if twin is None:
            return _NOTHING
        self._stats.twin_captures += 1
        self._stats.twin_bytes += self._lending_bytes(twin)
        if not entry.watch.check():
            twin.sets_done = True
            self._entries[self._entries.index(entry)] = twin
            entry.release()  # results it lent keep its memory (see _lend)
            log.info("%s: the function rebinds state its graph reads; its second capture replaces the "
                     "first", self._owner)
            return twin.finish(leaves, objs, tree)
        entry.others.append(twin)
        log.info("%s: captured another output set in %.1f ms (results of the last call were still held)",
                 self._owner, 1e3 * self._runner.capture_seconds)
        return twin.finish(leaves, objs, tree)

    def _capture_lending(self, entry: Entry, leaves, objs, tree) -> Any:
        """``entry`` returns copies, captured in a pool that held another graph (see _capture):
        capture its call again, in the same pool, with its results copied out of the pool
        into buffers of its own, and lend those from now on. If that fails, ``entry`` stays,
        returning copies."""
        entry.plan.lender = None
        lending = self._record_lending(entry, leaves, objs, "results stay copies")
        if lending is None:
            return entry._replay(leaves, objs, tree)
        self._stats.lending_captures += 1
        lending.capture_bytes = self._lending_bytes(lending)
        self._entries[self._entries.index(entry)] = lending
        entry.release()  # it returned copies: nothing of its memory is lent
        log.info("%s: captured again in %.1f ms to lend its results from buffers outside the shared pool",
                 self._owner, 1e3 * self._runner.capture_seconds)
        return lending.finish(leaves, objs, tree)

    def _capture_copying(self, entry: Entry, leaves, objs, tree) -> Any:
        """The caller holds results of every output set of ``entry``: capture the call once
        more, returning copies from then on; if that fails, run such calls eagerly."""
        try:
            fresh = self._record_again(entry, leaves, objs, lend=False)
        except Exception as err:  # noqa: BLE001 - nothing replayable is free: run eagerly
            log.info("%s: no graph returning copies (%s); calls made while results are held run eagerly",
                     self._owner, str(err).splitlines()[0] if str(err) else type(err).__name__)
            collect_before_next_capture()
            entry.held_eager = True
            return self._eager_while_held(tree)
        self._stats.copy_recaptures += 1
        sets = 1 + len(entry.others)
        self._entries[self._entries.index(entry)] = fresh
        entry.release()  # its graphs: results they lent keep their memory
        log.info("%s: results of %d calls were held at once; this call now returns copies "
                 "(captured again in %.1f ms)", self._owner, sets, 1e3 * self._runner.capture_seconds)
        return fresh.finish(leaves, objs, tree)

    def _eager_while_held(self, tree: Any) -> Any:
        """A call made while every output set's results are held, where no graph returning
        copies could be captured: the function's own results, run eagerly."""
        args, kwargs = tree
        self._stats.eager_calls += 1
        return self._runner.run_eager(lambda: self.module(*args, **kwargs))

    def _capture_failed(self, err, layout, leaves, mode, reader, args, kwargs, ran: Any = _NOTHING) -> Any:
        """A failed capture; ``ran`` is the call's result if it already ran eagerly."""
        self._stats.capture_failures += 1
        log.warning("%s: capture failed (%s)", self._owner, err.cause)
        if self.options.on_capture_failure == "raise":
            self._failure = err
            self._state = State.FAILED
            if ran is _NOTHING:
                raise err
            warnings.warn(f"{err}\nThe call ran eagerly instead; later calls raise until reset().",
                          UserWarning, stacklevel=user_stacklevel())
            return ran
        warnings.warn(f"{err}\n{self._owner} runs eagerly from now on (on_capture_failure='eager').",
                      UserWarning, stacklevel=user_stacklevel())
        self._mode = reader
        self._eager_spec, self._eager_mode = InputSpec(layout, leaves, mode), mode
        self._state = State.EAGER
        self._stats.eager_calls += 1
        if ran is not _NOTHING:
            return ran
        return self._runner.run_eager(lambda: self.module(*args, **kwargs))

    def _eager_call(self, args: tuple, kwargs: dict) -> Any:
        spec = self._eager_spec
        mode = self._mode.read()
        if spec.match(args, kwargs) is None or mode != self._eager_mode:
            self._raise_mismatch_spec(spec, self._eager_mode, args, kwargs, mode)
        self._stats.eager_calls += 1
        return self._runner.run_eager(lambda: self.module(*args, **kwargs))

    def _stale(self, entry: Entry, args: tuple, kwargs: dict) -> Any:
        changes = entry.watch.changes()
        if self.options.on_stale == "raise" or not changes:
            raise StaleGraphError(self._owner, changes or [("state", "changed")])
        self._stats.recaptures += 1
        log.info("%s: dropping a stale graph (%s)", self._owner, "; ".join(f"{w}: {c}" for w, c in changes))
        self._entries.remove(entry)
        entry.release()
        if not self._entries:
            self._state, self._warmed = State.WARMUP, 0
            return self._slow(args, kwargs)
        return self._new_signature(args, kwargs)

    # -- errors ------------------------------------------------------------------------
    def _raise_mismatch(self, entry: Entry, args: tuple, kwargs: dict, mode: Any) -> None:
        self._raise_mismatch_spec(entry.spec, entry.mode, args, kwargs, mode)

    def _raise_mismatch_spec(self, spec: InputSpec, captured_mode: Any, args, kwargs, mode) -> None:
        self._stats.input_mismatches += 1
        modes = self._mode.mismatches(captured_mode, mode) if mode != captured_mode else []
        raise mismatch_error(self._owner, spec, (args, kwargs), self._arg_names, modes, self._is_tensordict_module)
