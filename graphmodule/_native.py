"""The compiled hot path: opt-in, for the calls where Python's own cost is the gap to the floor.

A replayed call of a small graph is mostly host time: the input copy and the graph launch
(the floor), then what graphmodule checks so that a replay is what the eager call would
have done (the lock, the input check, the modes, the staleness watch, whether a caller
still holds the last result), 5-9 µs of Python on a GPU host. :func:`enable_native`
compiles ``_native.cpp`` (once per machine: torch's extension cache keeps the build) and
makes ``CudaGraphModule.__call__`` a C function that runs those same checks, through the
same primitives, for the case that dominates RL loops:

- a wrapper holding one graph (``max_graphs=1``), not a TensorDict module;
- called with tensors only, each argument one tensor, positional or by keyword in the
  captured order (``policy(obs)``, ``policy(obs, hidden)``, ``policy(obs=obs)``), of one
  dtype and device;
- whose graph returns one tensor and writes nothing into its inputs, and is not a layer.

Every other call, and any call where a check is in doubt (a module's mode or a watched
dict changed since the last call, another thread, a capture in progress), goes to the
Python path unchanged, after which :func:`arm` mirrors the wrapper's state anew. So the
compiled path replays only calls the Python path would replay, and returns what it
would return.

Enable it with ``GRAPHMODULE_NATIVE=1`` in the environment (before ``import graphmodule``)
or by calling :func:`enable_native`; it needs a C++ compiler and ``ninja`` (``pip install
ninja``). Where the build fails, graphmodule warns once and keeps the Python path.

>>> import graphmodule
>>> graphmodule.enable_native()  # doctest: +SKIP
True
"""

from __future__ import annotations

import hashlib
import os
import threading
import types
import warnings
from typing import Any

import torch

from . import _capture, _stale
from ._lend import Lender, _use_count
from ._mode import Mode, _interaction_type
from ._options import State

__all__ = ["arm", "enable_native", "native_enabled"]

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_native.cpp")
_LOCK = threading.Lock()
_EXT: list[Any] = [None]
_TRIED = [False]

# A wrapper whose compiled state served fewer than this many calls before the Python path
# took a call back is "missed"; after MISSES_LIMIT misses in a row it stays on the Python path
# (calls that alternate signatures or modes would otherwise re-arm at every call).
SERVED_ENOUGH = 8
MISSES_LIMIT = 32


def native_enabled() -> bool:
    """Whether calls go through the compiled hot path."""
    return _EXT[0] is not None


def enable_native() -> bool:
    """Compile and install the compiled hot path; returns whether it is in use.

    The first build on a machine takes 30-60 s (torch's extension cache keeps it). On
    failure (no compiler, no ``ninja``) it warns once and returns ``False``: calls keep
    the Python path, which gives the same results.
    """
    with _LOCK:
        if _EXT[0] is not None or _TRIED[0]:
            return _EXT[0] is not None
        _TRIED[0] = True
        try:
            from torch.utils.cpp_extension import load

            with open(_SOURCE, "rb") as f:
                digest = hashlib.sha1(f.read() + torch.__version__.encode()).hexdigest()[:12]
            ext = load(name=f"graphmodule_native_{digest}", sources=[_SOURCE], extra_cflags=["-O2"],
                       verbose=False)
        except Exception as err:  # compiler, ninja, headers: the Python path stays
            warnings.warn(f"graphmodule: the compiled hot path could not be built ({type(err).__name__}: "
                          f"{str(err).strip().splitlines()[-1] if str(err).strip() else ''}); calls keep the "
                          "Python path, with the same results. It needs a C++ compiler and ninja "
                          "(pip install ninja).", RuntimeWarning, stacklevel=2)
            return False
        from ._module import CudaGraphModule

        ext.install(CudaGraphModule, CudaGraphModule._python_call, arm)
        _EXT[0] = ext
        return True


def disable_native() -> None:
    """Back to the Python path for every call (tests; the build stays cached)."""
    from ._module import CudaGraphModule

    with _LOCK:
        CudaGraphModule.__call__ = CudaGraphModule._python_call
        _EXT[0] = None
        _TRIED[0] = False


def served(hot: Any) -> int:
    """How many calls a compiled state replayed."""
    return _EXT[0].served(hot) if _EXT[0] is not None else 0


def arm(wrapper: Any) -> None:
    """After a call the Python path served: mirror the wrapper's state for the compiled
    path where it can serve the next calls (``wrapper._hot`` a capsule), never will
    (``False``), or not yet (``None``: a warmup, or a state it does not serve)."""
    ext = _EXT[0]
    if ext is None or wrapper._hot is not None:
        return
    with wrapper._lock:  # (another thread's Python path may be changing the state)
        _arm(ext, wrapper)


def _arm(ext: Any, wrapper: Any) -> None:
    if wrapper._hot is not None:  # armed by another thread meanwhile
        return
    if wrapper._is_tensordict_module or wrapper.options.max_graphs != 1 or not wrapper._runner.captures:
        wrapper._hot = False
        return
    if wrapper._state is State.WARMUP:
        return
    state = _mirror(wrapper) if wrapper._state is State.CAPTURED else None
    served, wrapper._hot_served = wrapper._hot_served, None  # (by the state dropped before this call)
    if state is None or (served is not None and served < SERVED_ENOUGH):
        wrapper._hot_misses += 1
    elif served is not None:
        wrapper._hot_misses = 0
    if wrapper._hot_misses > MISSES_LIMIT:
        wrapper._hot = False
        return
    if state is not None:
        wrapper._hot = ext.make(*state)


def _mirror(wrapper: Any) -> tuple[dict, list] | None:
    """What the compiled path reads, from the wrapper's only graph; None where it does not
    serve that graph's calls."""
    entries = wrapper._entries
    if len(entries) != 1 or wrapper._mode is None or wrapper._thread is None:
        return None
    entry = entries[0]
    spec = entry.spec
    if not spec.all_tensors or spec._guard is None:
        return None
    if spec.n_positional >= 1:  # g(x), g(obs, state): the arguments are the leaves
        n_pos, kwnames = spec.n_positional, None
    elif spec.flat_call is not None:  # g(obs=x): each argument one leaf, in the captured order
        n_pos, kwnames = spec.flat_call[0], spec.flat_call[1] or None
    else:
        return None
    n = len(spec.tensor_index)
    sets = []
    for e in [entry, *entry.others] if isinstance(entry.plan.lender, Lender) else [entry]:
        s = _output_set(e, n)
        if s is None:
            return None
        sets.append(s)
    reader, watch = wrapper._mode, entry.watch
    if watch._flag is None:  # no dict watchers: every place, at every call (as Watch.check)
        containers, keys, objects = watch._containers, watch._keys, watch._place_objects
    else:
        containers, keys, objects = watch._u_containers, watch._u_keys, watch._u_objects
    if not all(type(c) is types.CellType for c in watch._cells):
        return None
    grad, interaction, modes, autocast, inference = Mode(*entry.mode)
    if autocast is not None:  # (the compiled path declines calls under autocast)
        return None
    state = {
        "n": n, "n_pos": n_pos, "kwnames": kwnames, "thread": wrapper._thread, "grad": grad,
        "inference": inference,
        "acquire": wrapper._lock.acquire, "release": wrapper._lock.release, "stats": wrapper._stats,
        "depth": _capture._DEPTH, "active": _capture._ACTIVE, "guard_check": spec._guard.check,
        "mode_flag": reader._flag, "mode_reader": reader, "mode": entry.mode, "modes": modes,
        "interaction_fn": _interaction_type, "interaction": interaction,
        "watch_flag": watch._flag, "containers": list(containers), "keys": list(keys),
        "objects": list(objects), "cells": list(watch._cells), "cell_objects": list(watch._cell_objects),
        "same_addresses": _stale._same_addresses, "tobjs": watch._tobjs, "tptrs": watch._tptrs,
        "tindex": watch._tindex, "use_count": _use_count,
        # the addresses may be compared in C where every watched tensor is compared, as
        # _same_addresses does, and they match now, as its answer (this call passed the check)
        "direct_addresses": type(watch._tobjs) is list and type(watch._tptrs) is list
        and list(watch._tindex) == list(range(len(watch._tobjs))) and len(watch._tptrs) == len(watch._tobjs)
        and bool(_stale._same_addresses(watch._tobjs, watch._tptrs, watch._tindex)),
    }
    return state, sets


def _output_set(e: Any, n: int) -> dict | None:
    """One graph's buffers and result, if it is one the compiled path replays."""
    inputs = e.inputs
    if not (e.single and e.plain and e.layer is None):
        return None
    if n == 1 and inputs._one is not None and inputs._one[1] == 0:
        bufs = [inputs._one[0]]
    elif inputs.identity_copy and inputs.all_tensors and len(inputs.copy_dests) == n:
        bufs = list(inputs.copy_dests)  # one buffer per leaf, of one dtype and device
    else:
        return None
    replay, arg = e.runner.replay_call(e.handle)
    lender = e.plan.lender
    if lender is None:
        kind, out, cdata, base = (2 if e.clone else 1), e.plan.graph[0], None, None
    elif isinstance(lender, Lender) and lender._one is not None and lender._first is not None and not lender.inert:
        kind, out, cdata, base = 0, lender._first, lender._one.cdata, lender._one.base
    else:
        return None
    return {"bufs": bufs, "replay": replay, "replay_arg": arg, "kind": kind, "out": out,
            "cdata": cdata, "base": base}
