"""The input checks that refuse a call beyond its signature, in one place.

The signature (``_spec``: containers, tensor facts, constants; ``_mode``: modes) says which
graph a call is; what it says of a mismatch is ``_explain``'s. The checks here refuse a call
where eager semantics could not be reproduced otherwise:

- :func:`unreadable`: what no capture takes, refused as soon as a call is read for a capture
  (a tensor on another device than the runner's, a sparse tensor);
- :func:`before_capture`: the call about to be captured, before the function runs; the one
  function the graph path (``_record.record``: a CUDA capture, the simulated capture that
  checks a signature without CUDA, and a capture again) and the eager path
  (``_graphs.Graphs.eager``: a signature served eagerly after a failed capture) call;
- :func:`call_mismatches`: every later call of a graph (or of an eager signature checked by
  a simulated capture), against what the capture found: the aliasing, strides and nested
  TensorDicts where the graph depends on them, inference tensors it would write or save, a
  layer's backward hooks. ``Entry.extra_ok`` asks it on the hot path only where the capture
  found something to check (``Entry.plain`` false).

A new check of the inputs goes in one of these three, with its :class:`~graphmodule.MismatchKind`
(a refusal of a later call) or its ``UnsupportedError``/``CaptureError`` (a refusal before a
capture); ``tests/test_refuse.py`` tests each on both paths.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
from tensordict import TensorDictBase

from ._distributed import refuse_ddp
from ._errors import InputMismatchError, Mismatch, MismatchKind, UnsupportedError
from ._inputs import alias_groups, identity_pattern, inference_inputs, overlapping_inputs
from ._materialized import nested_paths
from ._mode import Mode, describe_autocast
from ._paths import describe
from ._slots import _is_node

if TYPE_CHECKING:
    from ._discover import Discovery
    from ._entry import Entry

__all__ = ["before_capture", "call_mismatches", "unreadable"]

Tensor = torch.Tensor


def unreadable(owner: str, leaves: Sequence[Any], texts: Sequence[str], device: torch.device | None) -> None:
    """Refuse a call no capture takes: tensors on another device than the runner's (``device``;
    ``None``: any), sparse tensors (their memory changes with their number of non-zeros)."""
    if device is not None:
        wrong = [Mismatch(text, MismatchKind.DEVICE, str(device), str(leaf.device))
                 for leaf, text in zip(leaves, texts) if isinstance(leaf, Tensor) and leaf.device != device]
        if wrong:
            raise InputMismatchError(owner, wrong, "asked to capture on " + str(device))
    for leaf, text in zip(leaves, texts):
        if isinstance(leaf, Tensor) and leaf.layout is not torch.strided:
            raise UnsupportedError(
                owner,
                f"{text} is {describe(leaf)}; a sparse tensor's memory changes with its number of non-zeros.",
                "pass a dense tensor (.to_dense()), or its indices and values as fixed-size tensors.",
            )


def before_capture(owner: str, mode: tuple, reads: Discovery, inputs: Sequence[tuple[str, Any]],
                   graph: bool = True) -> None:
    """Refuse, before the function runs, a call under ``mode`` whose replays could differ from
    its eager calls; ``reads``: what the function reads (parameters, state, modules);
    ``inputs``: ``(place, leaf)`` of the call; ``graph``: a graph is about to be captured (else
    the call runs eagerly, and only what its eager calls could not reproduce is refused).

    In order: a ``DistributedDataParallel`` step that cannot be captured (a graph only:
    ``_distributed``'s :class:`~graphmodule.CaptureError`); an inference tensor among the
    inputs where autograd may save it (eagerly torch refuses it; the graph's buffer is a normal
    tensor); autocast's cast cache where it may hold a cast of a tensor the graph reads
    (autocast casts a parameter at its first use in an autocast region and reuses that cast
    until the outermost region ends, even after the parameter changed in place; a replay casts
    at every call: refused, as ``torch.cuda.make_graphed_callables`` refuses it).
    """
    if graph:
        refuse_ddp(owner, reads.modules)
    externals, modes = reads.tensors(), Mode(*mode)
    _inference_saved(owner, modes, externals, inputs)
    _autocast_cache(owner, modes, externals, inputs)


def _inference_saved(owner: str, mode: Mode, externals: Sequence[tuple[str, Any]],
                     inputs: Sequence[tuple[str, Any]]) -> None:
    if not (mode.grad and any(t.requires_grad for _, t in (*externals, *inputs) if isinstance(t, Tensor))):
        return
    for place, t in inputs:
        if isinstance(t, Tensor) and t.is_inference():
            raise UnsupportedError(
                owner,
                f"expected a normal tensor at {place} (grad mode: autograd may save it for backward), got an "
                "inference tensor (made under torch.inference_mode()), which autograd refuses to save; the "
                "graph's buffer would be a normal tensor, and the replay would not refuse it.",
                "pass a normal tensor (x.clone() outside inference mode, or make it under torch.no_grad()), "
                "or call the wrapper under torch.no_grad() or torch.inference_mode().",
            )


def _cached_by_autocast(t: Any, devices: set) -> bool:
    """Whether autocast's cache may hold a cast of ``t`` (torch caches the casts of float32
    leaves that require grad: parameters, inputs that require grad)."""
    return (isinstance(t, Tensor) and t.is_leaf and t.requires_grad and t.dtype is torch.float32
            and t.device.type in devices)


def _autocast_cache(owner: str, mode: Mode, externals: Sequence[tuple[str, Any]],
                    inputs: Sequence[tuple[str, Any]]) -> None:
    state = mode.autocast
    if state is None or not state[1]:
        return
    devices = {device for device, _ in state[0]}
    for place, t in (*externals, *inputs):
        if _cached_by_autocast(t, devices):
            raise UnsupportedError(
                owner,
                f"expected autocast's cast cache off around a captured call, got {describe_autocast(state)} "
                f"at {place}: autocast casts {place} at its first use in the autocast region and reuses that "
                "cast until the region ends, even after it changes, while a replay casts it at every call.",
                "pass cache_enabled=False to torch.autocast (as torch.cuda.make_graphed_callables requires), "
                "or enter torch.autocast inside the wrapped function.",
            )


# -- every later call ------------------------------------------------------------------------

def call_mismatches(entry: Entry, leaves: Any, paths: list[str] | None, objs: dict) -> list[Mismatch]:
    """What refuses a call of ``entry`` whose signature matched (``decide``'s ``REFUSED``):
    each :class:`Mismatch`, with ``paths`` the places of its leaves (``None``: by index)."""
    name = (lambda i: paths[i]) if paths is not None else (lambda i: f"input leaf {i}")
    found = _unread(entry, objs)
    for i, stride in zip(entry.stride_checked, entry.stride_facts):
        if leaves[i].stride() != stride:
            found.append(Mismatch(name(i), MismatchKind.STRIDE, f"{stride} exactly (the function returns a view "
                                  "of it)", str(leaves[i].stride())))
    if entry.check_alias:
        found += _alias_mismatches(entry, leaves, name)
    written = entry.effects.written
    if written:
        found += overlapping_inputs(leaves, written, name)
    if written and not torch.is_inference_mode_enabled():
        found += inference_inputs(leaves, written, name, "the function writes into it")
    if entry.saves_inputs:
        found += inference_inputs(leaves, entry.inputs.tensor_index, name, "autograd may save it for backward")
    if entry.layer is not None:
        found += entry.layer.mismatches()
    return found


def _unread(entry: Entry, objs: dict) -> list[Mismatch]:
    """Nested TensorDicts that must (or must not) be in the caller's TensorDict for the
    effects to be the function's (``Effects.requires``, ``Effects.layouts``)."""
    found = []
    for position, (heads, paths) in entry.layouts.items():
        now = tuple(p for p in nested_paths(objs[position]) if p[0] in heads)
        if now != paths:
            found.append(Mismatch(f"the nested TensorDicts of TensorDict argument {position}", MismatchKind.UNREAD,
                                  f"{list(paths)} (as at capture: the function writes nested TensorDicts)",
                                  str(list(now))))
    for position, key, batch_size in entry.requires:  # (Requirement)
        td = objs[position]
        now = td.get(key, None) if isinstance(td, TensorDictBase) else None
        is_td = _is_node(now)
        where = f"the TensorDict's entry {key[0] if len(key) == 1 else key!r}"
        expected = "" if batch_size is None else f"a TensorDict of batch size {list(batch_size)} (the function writes into it)"
        if batch_size is None and is_td:
            found.append(Mismatch(where, MismatchKind.UNREAD, "no TensorDict (the function creates one there)",
                                  f"a TensorDict with keys {list(now.keys())} (eagerly the function's "
                                  "writes would merge into it)"))
        elif batch_size is not None and not is_td:
            found.append(Mismatch(where, MismatchKind.UNREAD, expected,
                                  "none" if now is None else type(now).__name__))
        elif batch_size is not None and now.batch_size != batch_size:
            found.append(Mismatch(where, MismatchKind.UNREAD, expected, f"batch size {list(now.batch_size)}"))
    return found


def _alias_mismatches(entry: Entry, leaves: Any, name: Callable[[int], str]) -> list[Mismatch]:
    """The call's aliasing against the capture's (``StaticInputs.pattern``): which inputs share
    memory, at which offsets and strides where they are views of one tensor, and which are
    one object."""
    inputs = entry.inputs
    found = []
    group_of: dict[int, int] = {}
    for members in alias_groups([(i, leaves[i]) for i in inputs.tensor_index]):
        for i, _ in members:
            group_of[i] = members[0][0]
    for i in inputs.tensor_index:
        t, group, captured = leaves[i], group_of[i], inputs.pattern[i]
        if group != captured:
            expected = "its own memory" if captured == i else f"the memory of {name(captured)}"
            got = "its own memory" if group == i else f"the memory of {name(group)}"
            found.append(Mismatch(name(i), MismatchKind.ALIAS, expected, got))
        elif group in inputs.span_reps:
            # views of one tensor, copied as one block of bytes read with the captured
            # offsets and strides (a tensor passed twice has one buffer: any layout copies in)
            if group != i:
                base, mine = leaves[group], inputs.leaves[group]
                offset = t.data_ptr() - base.data_ptr()
                captured_offset = inputs.leaves[i].data_ptr() - mine.data_ptr()
                if offset != captured_offset or t.stride() != inputs.leaves[i].stride():
                    found.append(Mismatch(name(i), MismatchKind.ALIAS, f"a view at byte offset {captured_offset} "
                                          f"of {name(group)}", f"byte offset {offset}"))
            elif t.stride() != inputs.leaves[i].stride():
                found.append(Mismatch(name(i), MismatchKind.STRIDE, f"{inputs.leaves[i].stride()} exactly (it "
                                      "shares memory with other inputs, copied with them as at capture)",
                                      str(t.stride())))
    if not found:  # the same memory, but one object where there were two (or the reverse)
        now = identity_pattern(leaves, inputs.tensor_index)
        for i, was, is_ in zip(inputs.tensor_index, inputs.identity, now):
            if was != is_:
                expected = "its own object" if was == i else f"the same object as {name(was)}"
                got = "its own object" if is_ == i else f"the same object as {name(is_)}"
                found.append(Mismatch(name(i), MismatchKind.ALIAS, expected, got))
    return found
