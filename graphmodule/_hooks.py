"""Hooks: Python that every eager call runs, and a replay would not.

A hook on what the graph runs (its modules' hooks and torch's global module hooks; where it runs
a backward, its parameters' ``register_hook`` and ``register_post_accumulate_grad_hook``; the
step hooks of its optimizers and torch's global ones: ``_hookdicts``) runs its Python at every
eager call; a replay runs none. Hooks are judged by what they do, as the function is:

- what a hook reads is found by the walk from the function (``_discover``: its closures,
  globals and ``self``, and the attributes its code reads off its module), and watched after
  the capture, as what the function reads;
- what it changes is found while the capture runs it (``_hookeffects.HookEffects``: a snapshot of
  the Python state it can change around each of its calls). A hook that changed Python state
  (appended to a list, counted, stored a Python value) is refused naming it, its changes put
  back; one that only computes tensors (recorded by the capture: a gradient scaled, an average
  of the weights updated after each step), reads or warns is served. Its warning is raised at
  the warmup calls and the capture, which run the function eagerly.
- :func:`allow_hook` marks a hook whose Python effects may run at the warmup calls and the
  capture only.

Backward hooks are judged where the graph runs the backward itself (a train step); a graph
used as a layer refuses module backward hooks (``_grad``: its backward replays apart from the
capture) and runs its parameters' hooks eagerly. torch's own hooks that compute a weight from
parameters (:func:`pure`) are served without the run. The weights they keep from an earlier
call are detached before warmup calls and captures (:func:`detach_hook_weights`: their autograd
graph ties autograd to another stream). Hooks added or removed after the capture make the
graph stale (``_hookdicts.HookWatch``, read by :class:`~graphmodule._stale.Watch`).
"""

from __future__ import annotations

import dis
import types
from typing import Any, NamedTuple, TypeVar

import torch

__all__ = ["allow_hook", "allowed", "attributes_read", "detach_hook_weights", "pure"]


def _weight_hook_types() -> tuple[type, ...]:
    from torch.nn.utils.prune import BasePruningMethod
    from torch.nn.utils.spectral_norm import SpectralNorm
    from torch.nn.utils.weight_norm import WeightNorm

    return WeightNorm, SpectralNorm, BasePruningMethod


# hooks that recompute a module's weight attribute from its parameters before each forward
_WEIGHT_HOOKS = _weight_hook_types()


def _pure_types() -> tuple[type, ...]:
    types: list[type] = list(_WEIGHT_HOOKS)
    try:
        from tensordict.nn.common import _OutKeysSelect
    except ImportError:  # pragma: no cover - another tensordict
        pass
    else:
        types.append(_OutKeysSelect)
    return tuple(types)


_PURE = _pure_types()


def _pure_owner_types() -> tuple[type, ...]:
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState
    except ImportError:  # pragma: no cover - a torch without FSDP2
        return ()
    return (FSDPState,)


# objects whose bound methods are pure hooks: FSDP2's pre/post-forward hooks all-gather and
# free the sharded parameters (collectives the graph records); a captured whole train step
# replays bit for bit as eagerly (multi-GPU guide)
_PURE_OWNERS = _pure_owner_types()


def pure(hook: Any) -> bool:
    """Whether ``hook`` only computes tensors (recorded by the capture, replayed faithfully) and
    keeps no Python state: the weight of old-style ``weight_norm``/``spectral_norm`` and of
    pruning, recomputed from their parameters before each forward (the module's ``weight``
    attribute then holds the graph's own buffer, refreshed by every replay), and tensordict's
    ``select_out_keys``, whose change to the output TensorDict is replayed as an effect; and
    FSDP2's forward hooks, whose collectives the graph records."""
    return isinstance(hook, _PURE) or isinstance(getattr(hook, "__self__", None), _PURE_OWNERS)


def detach_hook_weights(fn: Any, modules: list | None = None) -> bool:
    """Before a warmup call or capture in grad mode: replace the weights that ``weight_norm``,
    ``spectral_norm`` and pruning hooks on the modules ``fn`` reaches computed at an earlier
    call (or when they were applied), which each module keeps as an attribute until its hook
    computes the next one, by detached ones. ``modules``: those modules as ``(module, place)``,
    where a walk from ``fn`` already found them (a capture's). Whether it replaced any.

    Such a weight's autograd graph keeps its parameters' gradient accumulators (autograd's
    AccumulateGrad nodes) alive, and each runs on the stream it was made on: for the weight
    computed when the hook was applied, the default stream. The warmup calls and the capture,
    on the side stream, would reuse them: each warmup's backward warns of a stream mismatch, and
    the capture's backward graph makes the default stream wait on the capture (CUDA: "operation
    would make the legacy stream depend on a capturing blocking stream"). Without that graph
    they go, and the call makes its own on its stream. The attribute is replaced, not detached
    in place: a tensor you hold keeps its graph, and with it those accumulators (the hook
    recomputes the attribute at every forward anyway).

        >>> import torch
        >>> from graphmodule._hooks import detach_hook_weights
        >>> net = torch.nn.utils.spectral_norm(torch.nn.Linear(2, 2))
        >>> _ = net(torch.ones(1, 2))
        >>> held = net.weight  # the forward's weight, with its graph
        >>> detach_hook_weights(net)
        True
        >>> net.weight.grad_fn is None, held.grad_fn is None, torch.equal(net.weight, held)
        (True, False, True)
    """
    from ._discover import Discovery

    detached = False
    for module, _ in Discovery(fn).modules if modules is None else modules:
        for hook in list(module._forward_pre_hooks.values()):
            if isinstance(hook, _WEIGHT_HOOKS):
                name = getattr(hook, "_tensor_name", None) or hook.name
                weight = vars(module).get(name)
                if isinstance(weight, torch.Tensor) and weight.grad_fn is not None:
                    setattr(module, name, weight.detach())
                    detached = True
    return detached


# -- the opt-in: a hook whose Python effects may run at the warmup calls and the capture only --
_ALLOWED = "__graphmodule_allow_hook__"

H = TypeVar("H")


def allow_hook(hook: H) -> H:
    """Mark ``hook`` (a module hook, a tensor hook on a parameter, an optimizer step hook) as
    one whose Python effects a replay may skip: a graph is captured with it, it runs at the
    warmup calls and at the capture (which run the function eagerly), and not at replays.
    Returns ``hook``, so it also serves as a decorator.

    Without the mark, a hook that changes Python state (appends to a list, counts, stores
    Python values on an object) is refused at capture, since a replay would skip what every
    eager call does; with it, you accept that. What the hook computes with tensors is recorded
    by the capture and replayed, as for any hook; what it reads is watched. A method is marked
    for every object of its class.

        >>> import torch
        >>> from graphmodule import CudaGraphModule, allow_hook
        >>> seen = []
        >>> @allow_hook
        ... def note_shape(module, args):
        ...     seen.append(tuple(args[0].shape))
        >>> net = torch.nn.Linear(3, 3)
        >>> handle = net.register_forward_pre_hook(note_shape)
        >>> g = CudaGraphModule(net, warmup=1, backend="simulate")
        >>> with torch.no_grad():
        ...     _ = g(torch.ones(2, 3)); _ = g(torch.ones(2, 3))  # a warmup call, the capture
        >>> seen
        [(2, 3), (2, 3)]
    """
    target = hook.__func__ if isinstance(hook, types.MethodType) else hook
    try:
        setattr(target, _ALLOWED, True)
    except (AttributeError, TypeError):
        raise TypeError(f"allow_hook expected a function, a method or a callable object it can mark, got "
                        f"{type(hook).__name__} {hook!r}: wrap it in a function (def hook(*args): ...).") from None
    return hook


def allowed(hook: Any) -> bool:
    """Whether ``hook`` was marked with :func:`allow_hook`."""
    return bool(getattr(hook, _ALLOWED, False))


class Reads(NamedTuple):
    """The attributes a hook's code reads off the module it is given and off its ``self``."""

    module: frozenset
    bound: Any  # the object bound as the hook's self (None for a function)
    bound_names: frozenset


_NO_READS = Reads(frozenset(), None, frozenset())


def attributes_read(hook: Any) -> Reads:
    """The attributes ``hook``'s bytecode loads straight off its module parameter
    (``module.x``) and off its ``self``: what it reads that the module walk may not watch (a
    private attribute, a Python value on a plain object). ``getattr(module, name)`` and reads
    through other names are not seen."""
    if isinstance(hook, types.MethodType) and isinstance(hook.__func__, types.FunctionType):
        fn, self = hook.__func__, hook.__self__
    elif isinstance(hook, types.FunctionType):
        fn, self = hook, None
    elif isinstance(getattr(type(hook), "__call__", None), types.FunctionType) and hasattr(hook, "__dict__"):
        fn, self = type(hook).__call__, hook
    else:
        return _NO_READS
    code = fn.__code__
    params = code.co_varnames[:code.co_argcount]
    first = 1 if self is not None else 0
    module = params[first] if len(params) > first else None
    names = _loads_off(code, {module, params[0] if self is not None and params else None} - {None})
    return Reads(frozenset(names.get(module, ())), self,
                 frozenset(names.get(params[0], ())) if self is not None and params else frozenset())


def _loads_off(code: types.CodeType, variables: set) -> dict[str, set[str]]:
    """``variable -> attribute names`` loaded right after loading that local variable."""
    out: dict[str, set[str]] = {}
    last = None
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and last in variables:
            out.setdefault(last, set()).add(ins.argval)
        if ins.opname.startswith("LOAD_FAST") or ins.opname in ("LOAD_DEREF", "LOAD_CLOSURE"):
            last = ins.argval[-1] if isinstance(ins.argval, tuple) else ins.argval
        else:
            last = None
    return out
