"""Capturing one call: from ``(args, kwargs)`` to an :class:`~graphmodule._entry.Entry`.

The cold path a call takes once per graph:

1. read the call's structure (``Layout``) and refuse what a graph cannot take
   (missing keys; tensors on another device, sparse tensors: ``_refuse.unreadable``), then
   what its replays could not reproduce (``_refuse.before_capture``);
2. copy the inputs into static buffers and hand the function fresh containers over them
   (under grad mode, buffers of inputs that require grad require grad too);
3. snapshot what the function may change (buffers' versions, bytes and layouts, containers,
   Python state it reads, ``.grad`` and attributes: ``_rebind``), capture, and compare; the
   modules' hooks run under a snapshot of their own around each call (``_hookeffects``), so that
   what one changes is refused naming it;
4. turn the output and the effects into recipes; outputs that track gradients get a
   backward graph (a layer, see ``_grad``) unless the function ran backward itself.

Anything found that a replay could not reproduce raises before the graph is used.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, NamedTuple

import torch
from torch.nn.utils import parametrize as _parametrize

from ._discover import Discovery
from ._effects import ContainerSnapshot, Effects
from ._entry import Entry
from ._errors import UnsupportedError
from ._grad import capture_layer
from ._gradtrace import Marks, track_inputs
from ._hookeffects import HookEffects
from ._hooks import detach_hook_weights
from ._inputs import StaticInputs
from ._materialized import SLOT, SLOT_OBJ, Materialized
from ._mode import ModeReader
from ._outputs import Plan, PlanBuilder, Unsupported
from ._policy import CapturePlan
from ._paths import leaf_texts
from ._rebind import Bindings
from ._refuse import before_capture, unreadable
from ._slots import _is_node
from ._spec import InputSpec
from ._stale import PythonEffects, Watch
from ._tree import Layout
from ._twin import CopyOut

__all__ = ["CallRead", "read_call", "record", "mode_reader"]


class CallRead(NamedTuple):
    """A call about to be captured, as read."""

    tree: Any  # (args, kwargs)
    layout: Layout
    leaves: list
    objs: dict  # the TensorDicts and tensorclasses at the call's slots
    texts: list[str]  # printable place of each leaf


def read_call(owner: str, tree: Any, by_key: dict, arg_names, device: torch.device | None) -> CallRead:
    """The layout, leaves and slot values of a call about to be captured; raises what a
    capture cannot take."""
    layout = Layout.capture(tree, by_key, owner, arg_names)
    leaves, objs = layout.leaves(tree)
    texts = leaf_texts(layout.leaf_paths(), arg_names)
    unreadable(owner, leaves, texts, device)  # (_refuse)
    return CallRead(tree, layout, leaves, objs, texts)


def leaf_keys(out: Any) -> list | None:
    """The leaf keys of a returned TensorDict, in order (None for anything else)."""
    return list(out.keys(include_nested=True, leaves_only=True)) if _is_node(out) else None


def _same_returned_keys(owner: str, out: Any, eager_keys: list | None, materialized: Materialized,
                        callers: dict) -> None:
    """A TensorDict returned by the capturing call holds the keys the last warmup (eager)
    call's did. A module given a TensorDict read by key sees only its in_keys at capture;
    one that copies other entries into its result (TensorDictSequential with
    ``tensordict_out`` copies nested TensorDicts whole) would return fewer keys than eagerly."""
    keys = leaf_keys(out)
    if eager_keys is None or keys is None or not materialized.by_key:
        return
    expected = eager_keys
    ref = materialized.refs.get(id(out))
    if ref is not None:
        position = ref.position if ref.kind is SLOT_OBJ or (ref.kind is SLOT and not ref.path) else None
        if position not in materialized.by_key or materialized.slot_paths[position] == (0, 0):
            return  # an input read whole, or the module's input TensorDict: its keys are the caller's
        # tensordict_out: what the caller's held before the call is not in the stand-in
        held = set(leaf_keys(callers[position]))
        expected = [k for k in eager_keys if k not in held]
    if keys != expected:
        missing = [k for k in eager_keys if k not in keys]
        raise UnsupportedError(
            owner,
            f"run eagerly, the call returned a TensorDict with keys {eager_keys}; from the graph's inputs "
            f"(the module's in_keys) it returns {keys}"
            + (f": {missing} come from entries the module reads or copies without naming them in "
               "its in_keys" if missing else "") + ".",
            "name every key the module reads or copies in its in_keys (TensorDictSequential given "
            "tensordict_out copies nested TensorDicts whole), or call it without tensordict_out.",
        )


def _same_layouts(owner: str, inputs: StaticInputs, before: list[tuple], texts: list[str]) -> None:
    """No input changed its shape, strides or offset in place: a replay copies each call's
    tensors into the buffers, whose metadata it cannot change on the caller's tensor."""
    relaid = inputs.relaid(before)
    if relaid:
        i, was, now = relaid[0]
        raise UnsupportedError(
            owner,
            f"{texts[i]} changed its shape or strides in place ({_layout(was)} → {_layout(now)}); a replay "
            "copies each call's tensors into fixed buffers and cannot change the caller's tensor's shape.",
            "use the out-of-place form (x = x.t(), x = x.unsqueeze(0)) and return the result.",
        )


def _rebuildable_views(owner: str, indices: set[int], leaves: list, inputs: StaticInputs, texts: list[str]) -> None:
    """A returned view of an input is rebuilt on the caller's tensor with the strides it has on
    the graph's buffer, which is dense: the capturing call's tensor must have those strides (a
    slice's gaps or an expanded tensor's zero strides would give other elements, or none)."""
    for i in sorted(indices):
        if leaves[i].stride() != inputs.leaves[i].stride():
            raise UnsupportedError(
                owner,
                f"the function returns a view of {texts[i]}, passed with strides {leaves[i].stride()}; a replay "
                f"rebuilds that view on your tensor with the strides of the graph's dense copy of it "
                f"({inputs.leaves[i].stride()}), which would read other elements of yours.",
                "pass that input dense (x.contiguous()), or return a copy of the view (.clone()).",
            )


def _layout(layout: tuple) -> str:
    shape, stride, offset = layout
    return f"shape {shape}, stride {stride}" + (f", offset {offset}" if offset else "")


def global_settings() -> dict[str, Any]:
    """torch's global state a function may set and leave set, by the call that sets it."""
    return {
        "torch.set_grad_enabled": torch.is_grad_enabled(),
        "torch.set_default_dtype": torch.get_default_dtype(),
        "torch.use_deterministic_algorithms": f"{torch.are_deterministic_algorithms_enabled()}"
        + (" (warn_only=True)" if torch.is_deterministic_algorithms_warn_only_enabled() else ""),
    }


@contextlib.contextmanager
def _own_parametrize_cache() -> Iterator[None]:
    """A capture inside ``torch.nn.utils.parametrize.cached()`` caches the parametrized
    tensors it computes in a cache of its own, dropped after it: the graph records their
    computation, as a capture outside the region does, and replays it at every call. The
    region's cached tensors were computed by another call (a warmup call): read by the graph,
    they would be read at every replay, after the region ended and the parameters changed."""
    if not _parametrize._cache_enabled:
        yield
        return
    region, _parametrize._cache = _parametrize._cache, {}
    try:
        yield
    finally:
        _parametrize._cache = region


def _same_settings(owner: str, before: dict[str, Any]) -> None:
    """The capturing call left torch's global state as it found it: eagerly each call sets it
    again, a replay (GPU work only) would not."""
    after = global_settings()
    changed = [f"{name}: {before[name]} before the call, {after[name]} after it"
               for name in before if before[name] != after[name]]
    if changed:
        raise UnsupportedError(
            owner,
            "expected torch's global state as before the call after it, got " + "; ".join(changed)
            + ": the function sets it and leaves it set, which each eager call does and a replay would not.",
            "set it outside the wrapped function, or inside it in a with-block that restores it "
            "(torch.no_grad(), torch.enable_grad()) or with a try/finally that sets it back.",
        )


def _outputs_as_eagerly(owner: str, builder: PlanBuilder, grad: bool, trains: Marks | None) -> bool:
    """Whether the graph's outputs require grad where the call's grad mode is off (a train step
    that enables grad inside a call under torch.no_grad(): its outputs require grad and refuse
    backward, as eagerly after its backward); raises for what a replay cannot give them as the
    capturing call did: the autograd history of a tensor made under torch.enable_grad() inside
    a call under torch.no_grad() that is not a train step (a replay runs no autograd), an
    inference tensor made under torch.inference_mode() entered inside the function (a replay's
    outputs are its buffers, normal tensors, as are its views of them)."""
    enables_grad = not grad and any(builder.graph_requires_grad)
    if enables_grad and not (trains is not None and trains.trained()):
        raise UnsupportedError(
            owner,
            "expected outputs that do not require grad from a call under torch.no_grad(), got outputs that "
            "require grad (the function enables grad inside, torch.enable_grad()): a replay runs no autograd, "
            "so its results would not track gradients as the eager call's do.",
            "call the wrapper with grad enabled (its outputs then track gradients through the graph), or "
            "leave torch.enable_grad() out of the wrapped function.",
        )
    if not torch.is_inference_mode_enabled() and any(t.is_inference() for t in builder.graph):
        raise UnsupportedError(
            owner,
            "expected normal tensors as outputs of a call outside torch.inference_mode(), got inference tensors "
            "(the function enters torch.inference_mode() inside): a replay's outputs are normal tensors, and "
            "views of them keep their base, which the eager call's would not.",
            "call the wrapper under torch.inference_mode() (its outputs are inference tensors then), or use "
            "torch.no_grad() inside the function.",
        )
    return enables_grad


def _undo(hooks: HookEffects, bindings: Bindings, python: PythonEffects) -> None:
    """After a capture that failed: what the call bound and changed in Python put back (the
    runner put back the memory it wrote), so that the call runs eagerly next, or is refused,
    as if not made (a ``.grad`` it bound would be memory a CUDA capture never computed)."""
    hooks.close()
    bindings.close()
    bindings.undo()
    python.undo()


def mode_reader(watch: Discovery) -> ModeReader:
    return ModeReader([m for m, _ in watch.modules], [label for _, label in watch.modules])


class _Ready(NamedTuple):
    """What a capture prepared: what exists before it, the inputs handed to the function, and
    the snapshots its effects are found against."""

    before: Discovery
    inputs: StaticInputs
    tracked: list[int]  # inputs that require grad (grad enabled)
    marks: Marks | None
    trains: Marks | None
    materialized: Materialized
    containers: ContainerSnapshot
    python: PythonEffects
    snapshots: tuple  # the inputs' versions, bytes and layouts


def _prepare(owner: str, module: Callable[..., Any], call: CallRead, mode: tuple, grad: bool,
             found: Discovery | None) -> _Ready:
    """Before a capture: what the function reads, refused where a capture cannot take it, and
    the inputs it is handed."""
    # what exists before the capture: parameters, state... (and the backward hooks a train step runs);
    # a walk only: the entry's Watch, checked at every call, is taken after the capture
    before = found if found is not None and not grad else Discovery(module, backward_hooks=grad)
    # weights a weight_norm hook computed at an earlier call, detached first (_hooks); found again then
    if grad and detach_hook_weights(module, before.modules):
        before = Discovery(module, backward_hooks=grad)
    before_capture(owner, mode, before, list(zip(call.texts, call.leaves)))  # (_refuse: the eager path's too)
    inputs = StaticInputs(call.layout, call.leaves)
    tracked = track_inputs(owner, inputs, call.leaves, call.texts) if grad else []
    marks = Marks(before.externals.values(), [inputs.leaves[i] for i in tracked]) if grad else None
    # (grad disabled: to tell a train step that enables grad inside, see _outputs_as_eagerly)
    # (none under inference mode, where nothing requires grad)
    trains = marks or (None if torch.is_inference_mode_enabled() else Marks(before.externals.values(), []))
    materialized = Materialized(inputs, callers=call.objs)
    return _Ready(before, inputs, tracked, marks, trains, materialized, ContainerSnapshot(materialized),
                  PythonEffects(before.functions), (inputs.versions(), inputs.snapshot(), inputs.layouts()))


def _capture(owner: str, module: Callable[..., Any], runner: Any, ready: _Ready, plan: CapturePlan,
             twin: CopyOut | None, like: Entry | None) -> tuple[Any, HookEffects, Bindings, dict]:
    """The runner's capture of the call (a ``twin``: beside ``like``'s graph), under effect
    discovery: ``(captured, hooks, bindings, settings)``; what the call bound and changed in
    Python put back if it failed."""
    args, kwargs = ready.materialized.tree
    body = lambda: module(*args, **kwargs)  # noqa: E731
    # the hooks a call runs, each run under effect discovery (first: Bindings' own are not judged)
    hooks = HookEffects(ready.before.hook_dicts())
    bindings = Bindings(ready.before)  # .grad and attributes, to find what the function rebinds
    settings = global_settings()  # torch's global state: a replay would not set it again
    try:
        with _own_parametrize_cache():
            if twin is None:
                captured = runner.capture(body, owner, alone=plan.alone)
            else:
                captured = runner.capture(twin.wrap(body), owner, alone=plan.alone, beside=like.handle)
    except BaseException:
        _undo(hooks, bindings, ready.python)
        raise
    hooks.close()  # (before the probes go: what a refused hook changed is put back as it was)
    bindings.close()
    return captured, hooks, bindings, settings


def _refuse_changes(owner: str, call: CallRead, ready: _Ready, out: Any, eager_keys: list | None,
                    hooks: HookEffects, bindings: Bindings, settings: dict) -> None:
    """What the capturing call changed that a replay would not change again, refused."""
    hooks.refuse(owner)
    _same_settings(owner, settings)
    hooks.excuse(ready.python, bindings)
    _same_layouts(owner, ready.inputs, ready.snapshots[2], call.texts)
    _same_returned_keys(owner, out, eager_keys, ready.materialized, call.objs or {})
    changed = ready.python.changes() + bindings.python_changes()
    if changed:
        raise UnsupportedError(
            owner,
            "the function changes Python state, which a replay (GPU work only) would not: "
            + "; ".join(changed) + ".",
            "keep that state outside the wrapped function (update it after the call), or "
            "hold it in a tensor the function updates in place.",
        )


class _Built(NamedTuple):
    """What a capture's outputs and effects became."""

    effects: Effects
    out_recipe: Any
    builder: PlanBuilder
    rebinds: Any  # Bindings.rebinds
    layer: Any  # _grad.Layer, or None
    plan: Plan


def _build(owner: str, runner: Any, call: CallRead, ready: _Ready, out: Any, bindings: Bindings, grad: bool,
           outputs: CapturePlan, twin: CopyOut | None) -> _Built:
    """The recipes of the capture's outputs and effects, its layer (a backward graph) and its
    plan of outputs; raises what a replay could not reproduce."""
    inputs = ready.inputs
    written = inputs.written(*ready.snapshots[:2])
    builder = PlanBuilder(inputs, ready.materialized, ready.before.externals, ready.before.known,
                          ready.before.places())
    builder.aliases = bindings.aliases
    try:
        effects = Effects(written, ready.containers.changes(), ready.materialized, builder)
        out_recipe = builder.plan(out)
        _rebuildable_views(owner, builder.stride_checked, call.leaves, inputs, call.texts)
        rebinds = bindings.rebinds(owner, builder)  # (after the outputs: they may hold what it rebinds)
        effects.rebind(rebinds.ops)
    except Unsupported as exc:
        raise UnsupportedError(owner, f"{exc}.", "return tensors, containers of tensors, "
                               "TensorDicts, tensorclasses or plain objects holding them.") from None
    enables_grad = _outputs_as_eagerly(owner, builder, grad, ready.trains)
    layer = capture_layer(owner=owner, runner=runner, watch=ready.before, inputs=inputs, tracked=ready.tracked,
                          marks=ready.marks, sources=builder.sources, requires_grad=builder.graph_requires_grad,
                          texts=call.texts, outputs=outputs)
    graph = builder.graph if twin is None else twin.outputs(builder.graph)
    settled = outputs.settled(outputs=bool(graph), layer=layer is not None)
    plan = Plan(graph, builder.graph_requires_grad if layer is None else [], settled, drops=rebinds.drops,
                enables_grad=enables_grad, drop_index=builder.graph_indices([t.grad for t, _ in rebinds.drops]))
    return _Built(effects, out_recipe, builder, rebinds, layer, plan)


def record(*, owner: str, module: Callable[..., Any], runner: Any, call: CallRead, mode: tuple, plan: CapturePlan,
           eager_keys: list | None = None, like: Entry | None = None, spec: InputSpec | None = None,
           found: Discovery | None = None) -> tuple[Entry, Materialized]:
    """Capture ``module`` on ``call`` (its layout, leaves, slot values and places; not its tree)
    as ``plan`` says (``_policy``); returns the entry and what the function was handed.

    ``like``: with ``plan.beside``, the graph of this call captured beside (its results copied
    into buffers of its own, laid out as ``like``'s, see ``_twin``). ``spec``: the signature the
    graph serves (another graph's, for a capture made from that graph's layout), else the one
    ``call`` has. ``found``: a walk from ``module`` (without backward hooks) taken since the
    last Python ran: with grad disabled, the walk a capture takes first.

    Raises the runner's :class:`~graphmodule.CaptureError`, or :class:`UnsupportedError`
    for an effect or output a replay could not reproduce (the graph is released then).
    """
    spec = spec or InputSpec(call.layout, call.leaves, mode)
    grad = torch.is_grad_enabled()
    ready = _prepare(owner, module, call, mode, grad, found)
    twin = CopyOut(like, ready.materialized) if plan.beside else None
    captured, hooks, bindings, settings = _capture(owner, module, runner, ready, plan, twin, like)
    try:
        _refuse_changes(owner, call, ready, captured.out, eager_keys, hooks, bindings, settings)
        built = _build(owner, runner, call, ready, captured.out, bindings, grad, plan, twin)
    except BaseException:
        runner.release(captured.handle)
        raise
    layer = built.layer
    entry = Entry(
        spec=spec, inputs=ready.inputs, effects=built.effects,
        plan=built.plan, out_recipe=built.out_recipe, stride_checked=built.builder.stride_checked,
        # after the capture: what the replays must keep reading (backward hooks where the graph
        # runs a backward itself; a layer's backward graph watches its own, see _grad)
        watch=Watch(module, backward_hooks=grad and layer is None, rebound=built.rebinds),
        runner=runner, handle=captured.handle, texts=call.texts, layer=layer,
        # a layer's backward capture counts too; a twin's buffers (outside any pool) too
        capture_bytes=captured.bytes + (layer.capture_bytes if layer is not None else 0)
        + (twin.nbytes if twin is not None else 0),
        capture_seconds=captured.seconds + (layer.capture_seconds if layer is not None else 0.0),
        cuda_graph=captured.cuda_graph, dump=captured.dump,
    )
    return entry, ready.materialized
