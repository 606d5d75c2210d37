"""The hook dicts whose Python a graph's call runs, and the watch that they still hold the
hooks of the capture.

Eagerly every call runs the hooks registered on what it uses; a replay runs none of their
Python (what they computed with tensors is recorded). The places they live in:

- the modules the graph runs: forward (pre-)hooks, full backward (pre-)hooks, and torch's
  global ``register_module_forward_hook`` family;
- the leaf tensors that require grad (parameters), where the graph runs a backward itself
  (a train step): ``register_hook`` and ``register_post_accumulate_grad_hook``;
- the optimizers it reaches: ``register_step_pre_hook``/``register_step_post_hook``, and
  torch's global ``register_optimizer_step_pre_hook``/``..._post_hook``.

:class:`HookDict` names one such dict; :func:`hook_dicts` lists a graph's. What the hooks do is
judged at capture (``_hookeffects.HookEffects``); :class:`HookWatch` says whether the dicts still
hold the captured hooks (one added or removed since makes the graph stale).

A hook registered anywhere moves torch's ``RemovableHandle.next_id`` (every ``register_*``
takes an id): a check reads that one number, and compares the hook dicts only after it
moved. A hook written straight into a hook dict, without its ``register_*`` function, goes
unseen until then.

    >>> import torch
    >>> from graphmodule._hookdicts import HookWatch, hook_dicts
    >>> p = torch.nn.Parameter(torch.zeros(2))
    >>> watch = HookWatch(hook_dicts([], backward=True, tensors=[(p, "p")]))
    >>> handle = p.register_hook(lambda grad: grad * 2)
    >>> watch.same(), watch.changes()[0][1][:38]
    (False, "tensor hook '<lambda>' (register_hook)")
"""

from __future__ import annotations

import types
from typing import Any, NamedTuple

import torch.optim.optimizer as _nn_optim
from torch.nn.modules import module as _nn_module
from torch.utils.hooks import RemovableHandle

__all__ = ["HookDict", "HookWatch", "Kind", "describe_hook", "hook_dicts"]


class Kind(NamedTuple):
    """A kind of hook: where an owner keeps such hooks, and how they are registered."""

    attribute: str  # the owner's dict of such hooks
    name: str
    register: str  # what registers one on an owner
    global_attribute: str | None  # torch's dict of such hooks on every owner (None: none)
    global_register: str | None
    backward: bool  # run by a backward only
    scope: str  # the hooks of this kind, for messages


_ON_MODULES = "on the modules the graph runs"
_ON_TENSORS = "on the tensors the graph's backward reaches"
_ON_OPTIMIZERS = "on the optimizers the graph steps"

MODULE_KINDS = (
    Kind("_forward_pre_hooks", "forward pre-hook", "register_forward_pre_hook", "_global_forward_pre_hooks",
         "register_module_forward_pre_hook", False, _ON_MODULES),
    Kind("_forward_hooks", "forward hook", "register_forward_hook", "_global_forward_hooks",
         "register_module_forward_hook", False, _ON_MODULES),
    Kind("_backward_pre_hooks", "backward pre-hook", "register_full_backward_pre_hook",
         "_global_backward_pre_hooks", "register_module_full_backward_pre_hook", True, _ON_MODULES),
    Kind("_backward_hooks", "backward hook", "register_full_backward_hook", "_global_backward_hooks",
         "register_module_full_backward_hook", True, _ON_MODULES),
)
TENSOR_KINDS = (
    Kind("_backward_hooks", "tensor hook", "register_hook", None, None, True, _ON_TENSORS),
    Kind("_post_accumulate_grad_hooks", "post-accumulate-grad hook", "register_post_accumulate_grad_hook", None,
         None, True, _ON_TENSORS),
)
OPTIMIZER_KINDS = (
    Kind("_optimizer_step_pre_hooks", "optimizer step pre-hook", "register_step_pre_hook",
         "_global_optimizer_pre_hooks", "register_optimizer_step_pre_hook", False, _ON_OPTIMIZERS),
    Kind("_optimizer_step_post_hooks", "optimizer step post-hook", "register_step_post_hook",
         "_global_optimizer_post_hooks", "register_optimizer_step_post_hook", False, _ON_OPTIMIZERS),
)

EVERY_MODULE = "every module (global)"
EVERY_OPTIMIZER = "every optimizer (global)"
_NONE = types.MappingProxyType({})  # (a tensor without hooks holds None, not a dict)


class HookDict(NamedTuple):
    """One dict of hooks: a module's, a tensor's or an optimizer's, or torch's global one
    (``owner`` is then torch's Python module that holds it)."""

    owner: Any
    kind: Kind
    where: str  # the owner's place, or EVERY_MODULE / EVERY_OPTIMIZER
    is_global: bool = False

    @property
    def hooks(self) -> Any:
        """The dict now (read each time: a tensor makes its dict at its first hook)."""
        found = getattr(self.owner, self.kind.global_attribute if self.is_global else self.kind.attribute)
        return _NONE if found is None else found

    @property
    def register(self) -> str:
        return self.kind.global_register if self.is_global else self.kind.register


def hook_dicts(modules: list[tuple[Any, str]], backward: bool, tensors: list[tuple[Any, str]] = (),
               optimizers: list[tuple[Any, str]] = ()) -> list[HookDict]:
    """The hook dicts a graph's call runs: those of ``modules`` (``(module, place)``) and,
    where there is one, torch's global module hooks (backward ones only if ``backward``);
    where ``backward`` (the graph runs a backward), those of ``tensors`` (leaves that require
    grad); those of ``optimizers`` and, where there is one, torch's global optimizer hooks."""
    out = [HookDict(m, k, where) for m, where in modules for k in MODULE_KINDS if backward or not k.backward]
    if modules:
        out += [HookDict(_nn_module, k, EVERY_MODULE, True) for k in MODULE_KINDS if backward or not k.backward]
    if backward:
        out += [HookDict(t, k, where) for t, where in tensors for k in TENSOR_KINDS]
    out += [HookDict(opt, k, where) for opt, where in optimizers for k in OPTIMIZER_KINDS]
    if optimizers:
        out += [HookDict(_nn_optim, k, EVERY_OPTIMIZER, True) for k in OPTIMIZER_KINDS]
    return out


def _name(hook: Any) -> str:
    return getattr(hook, "__qualname__", None) or type(hook).__qualname__


def describe_hook(d: HookDict, hook: Any) -> str:
    return f"{d.kind.name} {_name(hook)!r} ({d.register})"


class HookWatch:
    """The hooks of a graph's hook dicts at capture, and whether they are still those."""

    def __init__(self, dicts: list[HookDict]):
        self.dicts = dicts
        # what same() reads: each owner's attribute (a dict, or None: a tensor without hooks),
        # compared in C with what it held at capture
        self._owners = [d.owner for d in dicts]
        self._attributes = [d.kind.global_attribute if d.is_global else d.kind.attribute for d in dicts]
        self._held = [None if h is None else dict(h) for h in map(getattr, self._owners, self._attributes)]
        self.captured = [{} if h is None else h for h in self._held]
        # the place the watch reads at every call: moves whenever a hook is registered
        self.place = (vars(RemovableHandle), "next_id")

    def same(self) -> bool:
        """Whether every hook dict holds the captured hooks, in order (read after a hook was
        registered somewhere: one C-level comparison, the walk only where it differs)."""
        if list(map(getattr, self._owners, self._attributes)) == self._held:
            return True
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
