"""A graph's replay laid out once, for the calls nearly every program makes: the input copy,
the replay and the result in one frame, with nothing decided again at each call.

``Entry._replay`` is the general replay: it copies the call's inputs into the graph's buffers
(``StaticInputs.copy_from``), replays, and builds the result and the effects from the plan
(``Entry.finish``), asking at each call which of those it needs. Most graphs need the same
small part of it every time: one result, from the graph's buffers (a policy's action, a
loss); or a TensorDict module's results, written into the call's TensorDict, which it
returns. :func:`laid_out` makes that part into one function per graph, with what it reads
(the buffer, the runner's replay, the lent result) bound once; other graphs (layers, several
results, effects on other objects) keep the general replay.

A laid-out replay holds none of its entry's fields that change (the entry holds it: no
reference cycle, and a released entry drops it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from tensordict import TensorDict

from ._recipes import GRAPH

if TYPE_CHECKING:
    from ._entry import Entry

__all__ = ["laid_out"]

Run = Callable[["Entry", Any, dict, Any], Any]


def laid_out(entry: Entry, general: Run) -> Run | None:
    """``entry``'s replay laid out, called as ``run(entry, leaves, objs, tree)``; ``None`` where
    its calls need the general one (``general``: the fallback of a laid-out replay whose call
    turns out not to be the common one)."""
    if entry.layer is not None:  # (a layer's results join its backward: _grad)
        return None
    if entry.single:
        return _one_result(entry)
    return _written_results(entry, general)


def _copy_in(entry: Entry) -> tuple[Any, Any, Callable[[Any], None]]:
    """``(buffer, index, copy_from)``: the one buffer and the call's leaf copied into it, where
    the graph has one input tensor and nothing else to copy (else ``None``s); the general copy."""
    inputs = entry.inputs
    buffer, index = inputs.one if inputs.one is not None else (None, None)
    return buffer, index, inputs.copy_from


def _one_result(entry: Entry) -> Run | None:
    """One result, the graph's first buffer: lent (``outputs="safe"``), cloned or the buffer."""
    lender, out, clone = entry.plan.lender, entry.plan.graph[0], entry.plan.clone
    lent = lender.lone if lender is not None else None
    if lender is not None and lent is None:  # (a result without memory: the lender clones it)
        return None
    buffer, index, copy_from = _copy_in(entry)
    replay, handle = entry.runner.replay, entry.handle

    def run(_: Entry, leaves: Any, objs: dict, tree: Any) -> Any:
        if buffer is not None:
            source = leaves[index]
            if source is not buffer:  # (a producer wrote straight into the buffer)
                buffer.copy_(source)
        else:
            copy_from(leaves)
        replay(handle)
        if lent is not None:
            return lent.data  # (Lender.values' lent tensor, without the list)
        return out.clone() if clone else out

    return run


def _written_results(entry: Entry, general: Run) -> Run | None:
    """A TensorDict module's call (``Entry.writes_only``): the graph's results written at the
    root of the call's TensorDict, which is returned; each entry written a result of the graph.
    A TensorDict of another class, or locked, takes the general replay (which checks writes)."""
    plan, ops = entry.plan, entry.effects.ops
    if entry.writes_only is None or plan.grad or len(ops) != 1 or ops[0].target.path:
        return None
    writes = [(name, recipe.index) for name, recipe in ops[0].writes if recipe.kind is GRAPH]
    if len(writes) != len(ops[0].writes):
        return None
    lender, values = plan.lender, plan.values
    # one result lent, written once: as Lender.values would give it, without the list
    lent = lender.lone if lender is not None and len(writes) == 1 else None
    name = writes[0][0] if lent is not None else None
    buffer, index, copy_from = _copy_in(entry)
    replay, handle = entry.runner.replay, entry.handle

    def run(this: Entry, leaves: Any, objs: dict, tree: Any) -> Any:
        td = objs[0]
        if type(td) is not TensorDict or td._is_locked:
            return general(this, leaves, objs, tree)
        if buffer is not None:
            source = leaves[index]
            if source is not buffer:
                buffer.copy_(source)
        else:
            copy_from(leaves)
        replay(handle)
        entries = td._tensordict  # (as Effects.apply writes into a TensorDict it may write raw)
        if lent is not None:
            entries[name] = lent.data
        else:
            results = values()
            for key, j in writes:
                entries[key] = results[j]
        return td

    return run
