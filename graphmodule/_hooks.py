"""Module hooks: Python that every eager call runs, and a replay would not.

A hook on a module the graph runs (``register_forward_pre_hook``, ``register_forward_hook``,
the full backward hooks, and the global ``register_module_forward_hook`` family) runs its
Python at every eager call: it appends to a log, stores an activation, counts. A replay runs
no Python, so such a hook would run once, at capture. Hooks present at capture are refused,
naming the module and the hook (:func:`refuse`), except those that only compute tensors the
graph records and keep no Python state (:func:`pure`: torch's old-style ``weight_norm``,
``spectral_norm`` and pruning hooks, tensordict's ``select_out_keys``, FSDP2's forward hooks); backward hooks only
where the capture records autograd (grad mode), since only a backward runs them. The weights
the first three keep from an earlier call are detached before warmup calls and captures
(:func:`detach_hook_weights`: their autograd graph ties autograd to another stream). Hooks added
or removed after the capture make the graph stale (:class:`HookWatch`, read by
:class:`~graphmodule._stale.Watch`).

A hook added or removed anywhere moves torch's ``RemovableHandle.next_id`` (every
registration takes an id): a check reads that one number, and compares the hook dicts only
after it moved. A hook written straight into a hook dict, without its ``register_*``
function, goes unseen until then.

    >>> import torch
    >>> from graphmodule._hooks import HookWatch
    >>> net = torch.nn.Linear(2, 2)
    >>> watch = HookWatch([(net, "module")], backward=False)
    >>> handle = net.register_forward_hook(lambda m, i, o: None)
    >>> watch.same(), watch.changes()[0][0]
    (False, 'module')
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn.modules import module as _nn_module
from torch.utils.hooks import RemovableHandle

from ._discover import Discovery
from ._errors import UnsupportedError

__all__ = ["HookDict", "HookWatch", "describe_hook", "detach_hook_weights", "hook_dicts", "pure", "refuse"]


class _Kind(NamedTuple):
    attribute: str  # the module's dict of such hooks
    name: str
    register: str  # what registers one on a module
    global_attribute: str  # torch.nn.modules.module's dict of such hooks on every module
    global_register: str
    backward: bool  # run by a backward only


KINDS = (
    _Kind("_forward_pre_hooks", "forward pre-hook", "register_forward_pre_hook", "_global_forward_pre_hooks",
          "register_module_forward_pre_hook", False),
    _Kind("_forward_hooks", "forward hook", "register_forward_hook", "_global_forward_hooks",
          "register_module_forward_hook", False),
    _Kind("_backward_pre_hooks", "backward pre-hook", "register_full_backward_pre_hook",
          "_global_backward_pre_hooks", "register_module_full_backward_pre_hook", True),
    _Kind("_backward_hooks", "backward hook", "register_full_backward_hook", "_global_backward_hooks",
          "register_module_full_backward_hook", True),
)


class HookDict(NamedTuple):
    """One dict of hooks: a module's, or torch's global one."""

    hooks: dict
    kind: _Kind
    where: str  # the module's place, or "every module (global)"

    @property
    def register(self) -> str:
        return self.kind.register if self.where != _GLOBAL else self.kind.global_register


_GLOBAL = "every module (global)"


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


def detach_hook_weights(fn: Any) -> None:
    """Before a warmup call or capture in grad mode: replace the weights that ``weight_norm``,
    ``spectral_norm`` and pruning hooks on the modules ``fn`` reaches computed at an earlier
    call (or when they were applied), which each module keeps as an attribute until its hook
    computes the next one, by detached ones.

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
        >>> net.weight.grad_fn is None, held.grad_fn is None, torch.equal(net.weight, held)
        (True, False, True)
    """
    for module, _ in Discovery(fn).modules:
        for hook in list(module._forward_pre_hooks.values()):
            if isinstance(hook, _WEIGHT_HOOKS):
                name = getattr(hook, "_tensor_name", None) or hook.name
                weight = vars(module).get(name)
                if isinstance(weight, torch.Tensor) and weight.grad_fn is not None:
                    setattr(module, name, weight.detach())


def hook_dicts(modules: list[tuple[nn.Module, str]], backward: bool) -> list[HookDict]:
    """The hook dicts whose hooks the graph's modules run: each module's and, where there is
    a module, the global ones; backward hooks only if ``backward``."""
    kinds = [k for k in KINDS if backward or not k.backward]
    out = [HookDict(getattr(m, k.attribute), k, where) for m, where in modules for k in kinds]
    if modules:
        out += [HookDict(getattr(_nn_module, k.global_attribute), k, _GLOBAL) for k in kinds]
    return out


def _name(hook: Any) -> str:
    return getattr(hook, "__qualname__", None) or type(hook).__qualname__


def describe_hook(d: HookDict, hook: Any) -> str:
    return f"{d.kind.name} {_name(hook)!r} ({d.register})"


_FORWARD_ADVICE = ("remove the hook while the wrapper runs (handle.remove()), do its work on the results outside "
                   "the wrapped function, or keep that module out of the wrapped function.")
_BACKWARD_ADVICE = ("remove the hook while the wrapper runs (handle.remove()), register it on a module outside the "
                    "wrapped function, or hook the parameters' gradients (p.register_hook), which run eagerly at "
                    "every backward of a graph used as a layer.")


def refuse(owner: str, modules: list[tuple[nn.Module, str]], backward: bool) -> None:
    """Raise :class:`UnsupportedError` naming the first hook a replay would not run."""
    for d in hook_dicts(modules, backward):
        for hook in list(d.hooks.values()):
            if not pure(hook):
                raise UnsupportedError(
                    owner,
                    f"expected no Python hooks on the modules the graph runs, got {describe_hook(d, hook)} on "
                    f"{d.where}: a replay runs no Python, so the hook would run once, at capture, and never again.",
                    _BACKWARD_ADVICE if d.kind.backward else _FORWARD_ADVICE,
                )


class HookWatch:
    """The hooks of the graph's modules at capture, and whether they are still those."""

    def __init__(self, modules: list[tuple[nn.Module, str]], backward: bool):
        self.dicts = hook_dicts(modules, backward)
        self.captured = [dict(d.hooks) for d in self.dicts]
        # the place the watch reads at every call: moves whenever a hook is registered
        self.place = (vars(RemovableHandle), "next_id")

    def same(self) -> bool:
        """Whether every hook dict holds the captured hooks, in order."""
        return all(list(d.hooks.items()) == list(c.items()) for d, c in zip(self.dicts, self.captured))

    def changes(self) -> list[tuple[str, str]]:
        out = []
        for d, captured in zip(self.dicts, self.captured):
            now = d.hooks
            for key, hook in now.items():
                if captured.get(key) is not hook:
                    out.append((d.where, f"{describe_hook(d, hook)} added since the capture, which a replay would "
                                         "not run: remove it (handle.remove()) to replay"))
            for key, hook in captured.items():
                if now.get(key) is not hook:
                    out.append((d.where, f"{describe_hook(d, hook)} removed since the capture, which the graph "
                                         "replays"))
        return out
