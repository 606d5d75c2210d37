"""What a call rebinds outside its arguments: ``.grad`` and attributes, which a replay would not.

A replay runs no Python. A whole train step with ``optimizer.zero_grad()`` inside
(``set_to_none=True``, torch's default) drops every ``p.grad`` and its backward binds new ones;
a step may also store its loss on a module (``self.last_loss = loss.detach()``). At capture
those are bound to the graph's memory, and replays would leave them there: one object
overwritten at every call (a gradient you kept changes), stale once another graph of the step
exists, missing after a ``zero_grad()`` between calls. So the capture compares what the
objects the function reads held before and after it (:class:`Bindings`) and turns what the
function rebound into effects (:class:`~graphmodule._effects.GradOp`,
:class:`~graphmodule._effects.AttrOp`) whose values are planned as results are: lent or copied
per call by the output sets, bound after each replay of every graph.

``.grad`` of each leaf requiring grad that the function reads (a parameter), by what the
capture did with the tensor bound at the call (:class:`GradUse`):

- ``KEPT``: accumulated into in place, or read (``zero_grad(set_to_none=False)``, no
  ``zero_grad`` at all, an optimizer step that found ``None``, the actor's backward adding into
  the critic's gradients); the graph reads that tensor's memory (or its absence), so every call
  must find a tensor over the same memory (any object: another graph lends a new one over its
  buffer at each call), or ``None``: ``_gradwatch.Required``;
- ``FRESH``: ``None`` at the call (``zero_grad()`` between calls), a new gradient after:
  ``None`` is required, the new one bound after each replay;
- ``CONSUMED``: accumulated into or read, then dropped (an accumulation cycle's last call:
  backward, ``opt.step()``, ``opt.zero_grad()``): its memory is required, ``None`` bound after;
- ``DROPPED``: a tensor at the call, dropped before anything read it, a new one (or ``None``)
  after: bound after each replay. Whether it was read is told by the parameter itself: an
  optimizer step updates it in place, so a step that updated it before its backward first gave
  it a new gradient (``opt.step()`` before ``zero_grad()``, then a backward) read the old
  gradient where the next call finds the one the graph bound: refused. Before a lender asks
  whether a result is held, such a ``.grad`` is bound to a one-element placeholder
  (``_lend.DroppingLender``): the last call's binding is the step's to drop, not a result you hold. (A gradient set by Python rather than
  accumulated by the backward, FSDP2's sharded ones, is taken to be dropped unread.)

Whether each required ``.grad`` is ``None`` is part of what a graph serves: a call finding
the other state (gradient accumulation) is another graph's (``max_graphs``); one finding a
gradient over other memory makes the graph capture again over it (``_gradwatch.Required``).

Attributes: every entry of the ``__dict__`` of the modules and objects the function reads, and
of the modules' ``_buffers``. One rebound to a tensor, an object or ``None`` is bound after
each replay; to another Python value (a counter) is refused, as other Python state the
function changes is. A tensor held there before the call may be read by the function before it
rebinds it (``self.mean = 0.9 * self.mean + 0.1 * x``), which a replay would not redo: during
the capture each such tensor is replaced by a *probe* (a subclass noting every torch function
it meets) and restored after; a rebound one that was used is refused. Code compiled by
``torch.compile`` would recompile for a probe: there, rebinding a tensor is refused.
"""

from __future__ import annotations

import enum
from operator import is_
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from ._discover import _SCALARS, Discovery
from ._pyeffects import _Shallow, refill
from ._effects import AttrOp, GradOp
from ._errors import UnsupportedError
from ._gradwatch import Required
from ._materialized import Outside
from ._recipes import GRAPH, Const

__all__ = ["Bindings", "GradUse", "Rebinds"]

Tensor = torch.Tensor
_ABSENT = object()


class GradUse(enum.Enum):
    """What a capture did with the ``.grad`` bound at the call (see the module docstring)."""

    KEPT = "accumulated into or read: the same tensor (or None) must be bound at every call"
    FRESH = "None at the call, a new gradient after: None is required, the new one bound after each replay"
    DROPPED = "dropped unread, a new gradient (or None) after: bound after each replay"
    CONSUMED = ("accumulated into or read, then dropped (an optimizer step, then zero_grad()): the memory the "
                "graph reads must be bound at every call, None bound after each replay")


KEPT, FRESH, DROPPED, CONSUMED = GradUse.KEPT, GradUse.FRESH, GradUse.DROPPED, GradUse.CONSUMED
class _Probe(Tensor):
    """A tensor attribute while a capture runs: notes each torch function that uses it (its
    value, shape or any property), which then runs on the plain tensor."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for leaf in tree_leaves((args, kwargs)):
            if type(leaf) is _Probe:
                _used(leaf)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


def _used(probe: _Probe, used: bool = True) -> bool:
    """Mark ``probe`` used (``used``); whether it was."""
    if used:
        probe.__dict__["graphmodule_used"] = True
    return probe.__dict__.get("graphmodule_used", False)


class Rebinds:
    """What a capture rebound outside its arguments, as the entry replays it.

    Attributes:
        ops: the effects binding ``.grad`` and attributes after each replay.
        drops: ``(tensor, placeholder)`` of the ``.grad`` the step drops at its start: bound to
            the placeholder before a lender asks whether a result is held (``_lend``).
        required: what each call's ``.grad`` must be (:class:`Required`).
        places: ``(id(dict), key)`` of the attributes rebound (not watched: each call binds them).
    """

    def __init__(self) -> None:
        self.ops: list[GradOp | AttrOp] = []
        self.drops: list[tuple[Tensor, Tensor]] = []
        self.required = Required()
        self.places: frozenset = frozenset()


class Bindings:
    """Taken just before a capture from what the function reads (``found``): the ``.grad`` of
    its leaves that require grad, and the content of its modules' and objects' dicts; then
    :meth:`close` right after the capture, and :meth:`rebinds` once the outputs are planned."""

    def __init__(self, found: Discovery) -> None:
        labels = found.labels()
        self.tensors = [t for t in found.externals.values() if t.is_leaf and t.requires_grad]
        self.labels = [labels.get(id(t), f"a tensor of shape {tuple(t.shape)}") for t in self.tensors]
        self.grads = [t.grad for t in self.tensors]
        self.versions = [(t._version, None if g is None else g._version) for t, g in zip(self.tensors, self.grads)]
        self.optimizers = found.optimizers
        # the parameter's version when its .grad was first accumulated into by the capture
        self.first: dict[int, int] = {}
        self._hooks = [t.register_post_accumulate_grad_hook(self._accumulated)
                       for t, g in zip(self.tensors, self.grads) if g is not None]
        # the parameters whose .grad bound at the call an optimizer step read: seen by the step
        # itself, since a fused step leaves the parameters' versions as they were
        self._bound = {id(t): g for t, g in zip(self.tensors, self.grads) if g is not None}
        self.read_by_step: set[int] = set()
        self._hooks += [opt.register_step_pre_hook(self._stepping) for opt in self.optimizers]
        self.dicts = found.dicts
        self.entry_dicts = found.entry_dicts
        self.before = [dict(d) for d, _ in found.dicts]
        self.held = [(id(d), key, value, label, _Shallow.of(value)) for d, key, value, label in found.held]
        # tensors held in those dicts, each replaced by a probe for the capture
        self.compiled = found.compiled
        self.probes: list[tuple[dict, Any, Tensor, Tensor]] = []  # (dict, key, tensor, probe)
        if not self.compiled:
            for d, _ in found.dicts:
                for key, value in list(d.items()):
                    if type(value) is Tensor:  # (as_subclass: an alias, gradients flow through it)
                        probe = value.as_subclass(_Probe)
                        d[key] = probe
                        self.probes.append((d, key, value, probe))
        self.aliases = {id(probe): t for _, _, t, probe in self.probes}

    def _accumulated(self, t: Tensor) -> None:
        self.first.setdefault(id(t), t._version)

    def _stepping(self, opt: Any, args: Any, kwargs: Any) -> None:
        bound = self._bound
        for group in opt.param_groups:
            for p in group["params"]:
                if p.grad is not None and p.grad is bound.get(id(p)):
                    self.read_by_step.add(id(p))

    def close(self) -> None:
        """After the capture: the hooks removed, every probe replaced by its tensor again."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        probes = {id(probe): t for _, _, t, probe in self.probes}
        for d, key, t, probe in self.probes:
            if d.get(key, _ABSENT) is probe:
                d[key] = t
        for d, _ in self.dicts:  # a probe the function stored elsewhere: it read the attribute
            for key, value in list(d.items()):
                if id(value) in probes:
                    _used(value)
                    d[key] = probes[id(value)]

    def undo(self) -> None:
        """After a capture that failed (and :meth:`close`): the ``.grad`` and attributes the
        call bound, and the containers it changed, put back as they were before it. A failed
        CUDA capture ran none of its kernels: a gradient it bound is memory never computed,
        which the eager run of the call that follows would add into (or which a refused call
        would leave bound)."""
        for t, grad in zip(self.tensors, self.grads):
            if t.grad is not grad:
                t.grad = grad
        for (d, _), before in zip(self.dicts, self.before):
            for key, was, _ in _changed(before, d):
                if was is _ABSENT:
                    d.pop(key, None)
                else:
                    d[key] = was
        for _, _, value, _, shallow in self.held:
            if not shallow.same(_Shallow.of(value)):
                refill(value, shallow)

    # -- after the capture ---------------------------------------------------------------
    def python_changes(self) -> list[str]:
        """Attributes rebound to Python values other than ``None`` (a counter), or deleted:
        what a replay cannot redo, in the words of ``PythonEffects``."""
        out = []
        for (d, label), before in zip(self.dicts, self.before):
            for key, was, now in _changed(before, d):
                where = self._where(d, label, key)
                if now is _ABSENT:
                    out.append(f"{where} was deleted")
                elif isinstance(now, _SCALARS) and now is not None:
                    out.append(f"{where} was rebound ({_show(was)} → {now!r})")
        for _, _, value, label, shallow in self.held:
            if not shallow.same(_Shallow.of(value)):
                out.append(f"{label} ({type(value).__name__}) was modified in place")
        return out

    def _where(self, d: dict, label: str, key: Any) -> str:
        """``self.metrics['loss']`` for an entry of a dict held as an attribute, else
        ``self.weight``."""
        return f"{label}[{key!r}]" if id(d) in self.entry_dicts else f"{label}.{key}"

    def excuse(self, places: set[tuple[int, Any]]) -> None:
        """Take the containers held at ``places`` (``(id(dict), key)``) as they are now: what
        a hook marked with ``allow_hook`` changed there is not the function's change."""
        self.held = [(d, key, value, label, _Shallow.of(value) if (d, key) in places else shallow)
                     for d, key, value, label, shallow in self.held]

    def rebinds(self, owner: str, builder: Any) -> Rebinds:
        """What the capture rebound, planned with the outputs' ``builder``; raises
        :class:`UnsupportedError` for what a replay cannot redo."""
        out = Rebinds()
        grads = self._grads(owner, builder, out)
        if grads:
            recipes = [r for _, r, _ in grads]
            graph_index = frozenset(r.index for r in recipes) if all(r.kind is GRAPH for r in recipes) else None
            out.ops.append(GradOp(Outside(tuple(t for t, _, _ in grads)), recipes, [label for _, _, label in grads],
                                  graph_index))
        places = []
        for (d, label), before in zip(self.dicts, self.before):
            for key, was, now in _changed(before, d):
                where = self._where(d, label, key)
                if isinstance(was, Tensor):
                    self._check_read(owner, where, d, key, was)
                out.ops.append(AttrOp(Outside(d), key, builder.plan(now), where))
                places.append((id(d), key))
        # a probe met in the outputs or the effects: the function handed the old tensor on
        for d, key, t, probe in self.probes:
            if id(probe) in builder.met and (id(d), key) in places:
                raise UnsupportedError(owner, _read_what(self._where(d, _label(self.dicts, d), key)), _READ_ADVICE)
        out.places = frozenset(places)
        return out

    def _check_read(self, owner: str, where: str, d: dict, key: Any, was: Tensor) -> None:
        probe = next((p for dd, k, t, p in self.probes if dd is d and k == key and t is was), None)
        if probe is None:
            why = ("compiled code, which a probe would make recompile" if self.compiled
                   else f"a {type(was).__name__}, which a probe cannot stand for")
            raise UnsupportedError(
                owner,
                f"the function rebinds {where}, which held a tensor before the call, and graphmodule cannot "
                f"tell whether the function reads that tensor first ({why}); a replay would read the tensor of "
                "the capture.",
                _READ_ADVICE,
            )
        if _used(probe, False):
            raise UnsupportedError(owner, _read_what(where), _READ_ADVICE)

    def _grads(self, owner: str, builder: Any, out: Rebinds) -> list[tuple[Tensor, Any, str]]:
        """The ``.grad`` rebound, as ``(tensor, recipe, place)``; what each call must find
        bound, and what is dropped at its start, into ``out``."""
        rebound = []
        # the optimizers the capture stepped (one of their parameters was updated in place):
        # they read every parameter's .grad, None included
        updated = {id(t) for t, (version, _) in zip(self.tensors, self.versions) if t._version != version}
        updated |= self.read_by_step
        stepped: set[int] = set()
        for opt in self.optimizers:
            params = [id(p) for group in opt.param_groups for p in group["params"]]
            if not updated.isdisjoint(params):
                stepped.update(params)
        for k, t in enumerate(self.tensors):
            use = self._use(owner, k, id(t) in stepped)
            if use is None:
                continue
            before, after, label = self.grads[k], t.grad, self.labels[k]
            if use is KEPT:
                out.required.add(t, before, label)
                continue
            rebound.append((t, Const(None) if after is None else builder.plan(after), f"{label}.grad"))
            if use is FRESH or use is CONSUMED:
                out.required.add(t, before, label)
            elif type(t) in (Tensor, torch.nn.Parameter):  # DROPPED
                out.drops.append((t, torch.empty((), dtype=t.dtype, device=t.device).expand(t.shape)))
        return rebound

    def _use(self, owner: str, k: int, stepped: bool) -> GradUse | None:
        """What the capture did with tensor ``k``'s ``.grad`` (``None``: nothing, and it reads
        none); raises where it read the gradient bound at the call and then rebound it."""
        t, before, (version, grad_version) = self.tensors[k], self.grads[k], self.versions[k]
        after, updated = t.grad, t._version != version or id(t) in self.read_by_step
        if after is before:
            written = before is not None and before._version != grad_version
            return KEPT if written or updated or (before is None and stepped) else None
        if before is None:
            return FRESH
        first = self.first.get(id(t))
        read = (grad_version != before._version  # written in place, then dropped
                or id(t) in self.read_by_step  # an optimizer step read it
                or (after is not None and after.grad_fn is not None)  # backward(create_graph=True) added to it
                or (first is not None and first != version)  # updated before its new gradient
                or (first is None and after is None and updated))  # updated, then its gradient dropped
        if read and after is None:
            return CONSUMED  # read where it was bound at the call, then dropped: that memory is required
        if read:
            raise UnsupportedError(
                owner,
                f"the function reads {self.labels[k]}.grad as bound before the call (set by an earlier backward) "
                "and then binds another gradient there (an optimizer step before zero_grad()); a replay would read "
                "the gradient tensor of the capture, not the one bound at the call.",
                "keep the gradients in one tensor (zero_grad(set_to_none=False)), or run zero_grad() and the "
                "backward before the optimizer step inside the function.",
            )
        return DROPPED


def _changed(before: dict, d: dict) -> list[tuple[Any, Any, Any]]:
    """``(key, before, now)`` of the entries of ``d`` rebound, added or deleted since ``before``."""
    if before.keys() == d.keys() and all(map(is_, before.values(), d.values())):
        return []  # (C-level passes: the common case)
    out = [(key, was, d.get(key, _ABSENT)) for key, was in before.items() if d.get(key, _ABSENT) is not was]
    out += [(key, _ABSENT, now) for key, now in d.items() if key not in before]
    return out


def _show(value: Any) -> str:
    return "unset" if value is _ABSENT else repr(value) if isinstance(value, _SCALARS) else f"a {type(value).__name__}"


def _label(dicts: list[tuple[dict, str]], d: dict) -> str:
    return next(label for dd, label in dicts if dd is d)


def _read_what(where: str) -> str:
    return (f"the function reads {where} and then rebinds it to a new tensor; a replay would read the tensor of "
            "the capture, not the one bound at the call.")


_READ_ADVICE = ("update the tensor in place (x.copy_(new), x.mul_(0.9).add_(y)), or keep it outside the wrapped "
                "function.")
