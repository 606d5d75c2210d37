"""Hooks judged by what they change: each Python hook of a graph run under effect discovery
while the capture runs it.

A replay runs no Python, so a hook that changes Python state (appends to a list, counts, stores
a Python value) would run once, at capture, and never again: :class:`HookEffects` finds that
change around each of the hook's calls, puts it back after the capture and refuses the hook
naming it, with advice for its kind; a hook marked with ``allow_hook`` (``_hooks``) is let run.
Cold: it runs at capture only.
"""

from __future__ import annotations

import functools
import operator
from typing import Any, NamedTuple

import torch
from torch import nn

from ._errors import UnsupportedError
from ._hookdicts import OPTIMIZER_KINDS, TENSOR_KINDS, HookDict, describe_hook
from ._hooks import allowed, pure

__all__ = ["HookEffects"]


_FORWARD_ADVICE = ("keep that state outside the hook (do its work on the results after the call), remove the hook "
                   "while the wrapper runs (handle.remove()), or, if running it at the warmup calls and the capture "
                   "only is what you want, mark it with graphmodule.allow_hook(hook).")
_BACKWARD_ADVICE = ("keep that state outside the hook, remove the hook while the wrapper runs (handle.remove()), "
                    "hook the parameters' gradients (p.register_hook), which run eagerly at every backward of a graph "
                    "used as a layer, or, if running it at the warmup calls and the capture only is what you want, "
                    "mark it with graphmodule.allow_hook(hook).")
_TENSOR_ADVICE = ("keep that state outside the hook (do its work on p.grad after the call), remove the hook while the "
                  "wrapper runs (handle.remove()), wrap the forward only (a graph used as a layer runs its parameters' "
                  "hooks eagerly at every backward), or, if running it at the warmup calls and the capture only is "
                  "what you want, mark it with graphmodule.allow_hook(hook).")
_OPTIMIZER_ADVICE = ("keep that state outside the hook (do its work after the call; a learning rate it sets, in a "
                     "tensor updated in place), remove the hook while the wrapper runs (handle.remove()), or, if "
                     "running it at the warmup calls and the capture only is what you want, mark it with "
                     "graphmodule.allow_hook(hook).")


def _advice(kind: Any) -> str:
    if kind in TENSOR_KINDS:
        return _TENSOR_ADVICE
    if kind in OPTIMIZER_KINDS:
        return _OPTIMIZER_ADVICE
    return _BACKWARD_ADVICE if kind.backward else _FORWARD_ADVICE


class _Judged(NamedTuple):
    """A hook run under effect discovery during a capture."""

    hook: Any
    dict: HookDict
    key: Any
    python: Any  # PythonEffects of its functions (closures, globals), snapshot taken again at each call
    dicts: list  # (dict, label): the __dict__ of its self and the objects it reaches


class Found(NamedTuple):
    """Python state one call of a hook changed."""

    judged: _Judged
    changes: list  # of _discover.Change


class HookEffects:
    """The Python hooks in a graph's hook dicts (``_hookdicts``), each run under effect
    discovery while a capture runs: a snapshot of the Python state it can change (its closures
    and globals, the ``__dict__`` of the module or optimizer it is given (and that optimizer's
    param groups), of its ``self`` and of the objects they lead to, with the lists, dicts and
    sets held there) before each of its calls, compared after it.

    What a hook changes there is what a replay, which runs no Python, would skip: found here,
    put back right after the capture (:meth:`close`; the call is refused, as if not made), and
    refused naming the hook (:meth:`refuse`); a hook marked with :func:`allow_hook` is let
    run (:meth:`excuse`). A hook that only computes tensors (recorded by the capture), reads
    Python state (watched after it) or warns changes nothing there, and is served. Rebinding
    an attribute to a tensor or an object is not counted: the capture finds it, and every
    replay binds it again, as for the function (``_rebind``).

        >>> import torch
        >>> from graphmodule._hookeffects import HookEffects
        >>> from graphmodule._hookdicts import hook_dicts
        >>> net = torch.nn.Linear(2, 2)
        >>> net.calls = 0
        >>> def count(module, args, out):
        ...     module.calls += 1
        >>> handle = net.register_forward_hook(count)
        >>> effects = HookEffects(hook_dicts([(net, "module")], backward=False))
        >>> _ = net(torch.ones(1, 2))
        >>> effects.close()  # (the hook's change put back)
        >>> [c.text for f in effects.found for c in f.changes], net.calls
        (['module.calls was rebound (0 → 1)'], 0)
    """

    def __init__(self, dicts: list[HookDict]):
        from ._discover import Discovery
        from ._pyeffects import PythonEffects

        self.found: list[Found] = []
        self._same: set[tuple[int, Any]] = set()  # attributes a hook set to the value they held
        self._where = {id(d.owner): d.where for d in dicts if not d.is_global}
        self._wrapped: list[tuple[dict, Any, Any, Any]] = []  # (hook dict, key, hook, wrapper)
        seen: dict[int, Any] = {}
        judged = []
        for d in dicts:  # every walk before any hook is wrapped
            for key, hook in list(d.hooks.items()):
                if not pure(hook):
                    found = seen.get(id(hook))
                    if found is None:
                        found = seen[id(hook)] = Discovery(hook, label="self")
                    judged.append(_Judged(hook, d, key, PythonEffects(found.functions), list(found.dicts)))
        for j in judged:
            wrapper = functools.partial(self._run, j)
            j.dict.hooks[j.key] = wrapper
            self._wrapped.append((j.dict.hooks, j.key, j.hook, wrapper))

    def _run(self, judged: _Judged, *args: Any, **kwargs: Any) -> Any:
        owner = args[0] if args and isinstance(args[0], (nn.Module, torch.optim.Optimizer)) else None
        dicts = judged.dicts
        if owner is not None:  # (the module or optimizer it is given: its attributes, a group's lr)
            where = self._where.get(id(owner), type(owner).__name__)
            groups = getattr(owner, "param_groups", None) if isinstance(owner, torch.optim.Optimizer) else None
            dicts = [(vars(owner), where), *((g, f"{where}.param_groups[{i}]") for i, g in enumerate(groups or ())),
                     *dicts]
        python, state = judged.python.again(), _DictsState(dicts)
        out = judged.hook(*args, **kwargs)
        changes = python.changed() + state.changed()
        if changes:
            self.found.append(Found(judged, changes))
        self._same.update(state.same)
        return out

    def close(self) -> None:
        """After the capture: the hooks back in their dicts, and what hooks that are not
        allowed changed put back (the latest change first)."""
        for hooks, key, hook, wrapper in self._wrapped:
            if hooks.get(key) is wrapper:
                hooks[key] = hook
        self._wrapped = []
        for found in reversed(self.found):
            if not allowed(found.judged.hook):
                for change in reversed(found.changes):
                    change.restore()

    def refuse(self, owner: str) -> None:
        """Raise :class:`UnsupportedError` naming the first hook, not allowed, that changed
        Python state."""
        for found in self.found:
            judged = found.judged
            if allowed(judged.hook):
                continue
            d = judged.dict
            texts = list(dict.fromkeys(c.text for c in found.changes))
            raise UnsupportedError(
                owner,
                f"expected the Python hooks {d.kind.scope} to change no Python state, got "
                f"{describe_hook(d, judged.hook)} on {d.where}, which changes: {'; '.join(texts)}. A replay runs "
                "no Python, so the hook would run once, at capture, and never again.",
                _advice(d.kind),
            )

    def excuse(self, python: Any, bindings: Any) -> None:
        """What allowed hooks changed, and the attributes a hook set to the Python value they
        held (no effect), taken as the state before the capture by the function's own checks
        (``python``: its ``PythonEffects``; ``bindings``: its ``_rebind.Bindings``, whose
        ``before`` copies the dicts it compares)."""
        places = {(id(c.place), c.key) for f in self.found if allowed(f.judged.hook) for c in f.changes}
        places |= self._same
        if not places:
            return
        python.excuse(places)
        bindings.excuse(places)
        for (d, _), before in zip(bindings.dicts, bindings.before):
            for key in list(set(before) | set(d)):
                if (id(d), key) in places:
                    if key in d:
                        before[key] = d[key]
                    else:
                        before.pop(key, None)


class _DictsState:
    """The entries of some ``__dict__``s, and the lists, dicts and sets they hold, before a
    hook's call; :meth:`changed`: what the call changed that a replay would skip."""

    def __init__(self, dicts: list[tuple[dict, str]]):
        from ._pyeffects import _Shallow

        self.same: list[tuple[int, Any]] = []  # places rebound to an equal Python value
        unique = list({id(d): (d, label) for d, label in dicts}.values())
        self.dicts = [(d, label, dict(d), {k: _Shallow.of(v) for k, v in d.items() if isinstance(v, _CONTAINERS)})
                      for d, label in unique]

    def changed(self) -> list:
        from ._discover import _EMPTY, _SCALARS
        from ._pyeffects import Change, _put, _same_shallow, _Shallow, _show, refill
        from ._spec import same_constant

        out = []
        for d, label, items, shallows in self.dicts:
            if items.keys() == d.keys() and all(map(operator.is_, items.values(), d.values())) and not shallows:
                continue
            for key in [*items, *(k for k in d if k not in items)]:
                was, now = items.get(key, _EMPTY), d.get(key, _EMPTY)
                where = f"{label}.{key}"
                if now is _EMPTY and was is not _EMPTY:
                    out.append(Change(d, key, f"{where} was deleted", functools.partial(_put, d, key, was)))
                elif now is not was and isinstance(now, _SCALARS) and now is not None:
                    if isinstance(was, _SCALARS) and same_constant(now, was):
                        self.same.append((id(d), key))  # (the value it held: no effect to skip)
                        continue
                    out.append(Change(d, key, f"{where} was rebound ({_show(was)} → {now!r})",
                                      functools.partial(_put, d, key, was)))
                elif now is was and key in shallows and not _same_shallow(shallows[key], _Shallow.of(now)):
                    out.append(Change(d, key, f"{where} ({type(now).__name__}) was modified in place",
                                      functools.partial(refill, now, shallows[key])))
        return out


_CONTAINERS = (list, dict, set)
