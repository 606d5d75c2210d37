"""One captured graph as one value, the one decision whether a call replays it, and the
single replay path every call takes.

An :class:`Entry` holds what a capture produced: the signature calls must match
(``spec``, ``mode``), the static input buffers, the effects on inputs, the plan of
outputs, what the graph reads from outside its inputs (``watch``) and the runner's
handle. :func:`decide` says whether a call replays it (the hot path and the slow path
both ask it); the capturing call and every later call end in :meth:`Entry.finish`.
Where no graph was captured, an ``_eager.EagerEntry`` stands in its place.
"""

from __future__ import annotations

import enum
from typing import Any

import torch
from tensordict import TensorDictBase

from ._dispatch import add_required, stand_in
from ._scope import SCOPE
from ._effects import TD, Effects
from ._errors import Mismatch
from ._graphentry import GraphEntry, Outputs
from ._inputs import StaticInputs
from ._materialized import SLOT, SLOT_OBJ, resolve
from ._mode import saves_inputs
from ._outputs import Plan
from ._recipes import GRAPH, PASSED, build, passed_recipes
from ._refuse import call_mismatches
from ._run import laid_out
from ._slots import _is_node
from ._spec import InputSpec
from ._stale import Watch

__all__ = ["NOT_SERVED", "Entry", "Verdict", "decide"]


class Verdict(enum.Enum):
    """What a call does with a graph (see :func:`decide`)."""

    REPLAY = "replay the graph"
    OTHER = "not this graph's call: the inputs' structure, tensors, constants or modes differ"
    STALE = "something the graph reads from outside its inputs changed"
    REFUSED = ("the inputs' aliasing, strides or nested TensorDicts, or what a layer's backward "
               "depends on, differ from the capture")
    INLINE = "inside another wrapper's capture: run inline, recorded into that capture"


REPLAY, OTHER, STALE, REFUSED, INLINE = Verdict  # (read without the class: faster)
NOT_SERVED = object()  # (Entry.through_stand_in: the graph does not take the call)


def decide(entry: Entry, args: tuple, kwargs: dict, mode: Any) -> tuple[Verdict, Any]:
    """Whether a call (``args``, ``kwargs``, and the modes it runs under) replays ``entry``,
    with the call's leaves and slot values where they match (``None`` for ``OTHER``).

    The one decision every call takes: ``CudaGraphModule.__call__`` replays on ``REPLAY``
    and hands anything else to the slow path, which asks again graph by graph and acts on
    the verdict (another graph, a stale graph, a mismatch to explain).
    """
    split = entry.spec.match(args, kwargs)
    if split is None or mode != entry.mode:
        return OTHER, None
    if not entry.watch.check():
        return STALE, split
    if not (entry.plain or entry.extra_ok(*split)):  # (split: the leaves and slot values)
        return REFUSED, split
    if SCOPE.depth and SCOPE.inside():
        return INLINE, split
    return REPLAY, split


class Entry(GraphEntry):
    """A captured graph and everything needed to replay it for a call (what every entry
    offers: ``_graphentry.GraphEntry``)."""

    # how messages say where the signature comes from ("CudaGraphModule(f) was captured with
    # other inputs than this call's"), and what explain() calls it
    when = "captured"
    noun = "graph"

    def __init__(
        self,
        *,
        spec: InputSpec,
        inputs: StaticInputs,
        effects: Effects,
        plan: Plan,
        out_recipe: Any,
        stride_checked: set[int],
        watch: Watch,
        runner: Any,
        handle: Any,
        texts: list[str],
        layer: Any = None,
        capture_bytes: int = 0,
        capture_seconds: float = 0.0,
        cuda_graph: Any = None,
        dump: Any = None,
    ):
        self.spec, self.mode = spec, spec.mode
        # a graph used as a layer: its backward graph, and the autograd node outputs join (_grad)
        self.layer = layer
        self.inputs, self.effects, self.plan, self.out_recipe = inputs, effects, plan, out_recipe
        self.watch, self.runner, self.handle = watch, runner, handle
        self.texts = texts  # printable place of each input leaf, for messages
        # device memory the graph added: what its capture added to the pool, and output
        # buffers of its own outside any pool (a twin's, see _twin)
        self.capture_bytes, self.capture_seconds = capture_bytes, capture_seconds
        # what the runner made beyond the handle (CaptureResult): the torch.cuda.CUDAGraph,
        # and what writes its structure (None where it has none)
        self.cuda_graph, self.dump = cuda_graph, dump
        self.stride_checked = sorted(stride_checked)
        self.stride_facts = [inputs.leaves[i].stride() for i in self.stride_checked]
        # inputs aliasing each other matter when the graph writes into inputs, or was
        # captured with aliasing (it copies each aliasing group once)
        self.check_alias = inputs.aliased or bool(effects.written)
        # nested TensorDicts that must (or must not) be in the caller's TensorDict for the
        # effects to be the function's (Effects.requires)
        self.requires, self.layouts = effects.requires, effects.layouts
        self.result_refs = [r for r in passed_recipes(out_recipe) if r.ref.kind is not SLOT_OBJ] if effects.ops else []
        self.extra_checks = self.check_alias or bool(self.stride_checked) or bool(self.requires)
        # captured with autograd recording (a layer, a train step): eagerly, an inference tensor
        # given as input would be refused when saved for backward; the graph's buffers would not
        self.saves_inputs = saves_inputs(spec.mode, layer, watch.externals.values())
        self.plain = layer is None and not self.extra_checks and not self.saves_inputs  # extra_ok has nothing to check
        self.single = (
            out_recipe.kind is GRAPH and out_recipe.index == 0 and len(plan.graph) == 1 and not effects.any and not plan.grad
            and layer is None
        )
        # where results come from when a caller holds the last ones: set by the signature
        # (_signature) made for a graph the wrapper holds (None for a twin)
        self.outputs: Outputs | None = None
        self.returns_input_td = (out_recipe.kind is PASSED and out_recipe.ref.kind is SLOT_OBJ
                                 and out_recipe.ref.position == 0)
        self.writes_only = self._writes_only()
        # this graph's replay, as the output sets call it (``run(entry, leaves, objs, tree)``):
        # laid out once for the common calls (_run), else the general one
        self.run = laid_out(self, Entry._replay) or Entry._replay

    def _writes_only(self) -> list | None:
        """The keys the graph writes into its TensorDict argument, where writing them and
        returning that TensorDict is all it does (a TensorDict module's call); else ``None``."""
        if not self.returns_input_td or self.effects.written:
            return None
        keys = []
        for op in self.effects.ops:
            target = op.target
            if op.kind is not TD or target.kind not in (SLOT, SLOT_OBJ) or target.position != 0:
                return None
            renamed = op.names is None or isinstance(op.names, (tuple, list))  # (else: unchanged)
            if op.deletes or op.batch_size is not None or op.moved or renamed:
                return None
            keys += [target.path + (name,) for name, _ in op.writes]
        return keys

    def through_stand_in(self, td: TensorDictBase, in_keys: list, mode: Any) -> Any:
        """A TensorDict module's call ``g(td)`` this graph does not take as it is: ``td`` has
        another batch size (the graph was captured from a keyword call's TensorDict, of batch
        size ``[]``, or the reverse), or other nested TensorDicts where the module writes.
        Where all the graph does is write entries into its TensorDict and return it, it
        replays on a stand-in laid out as at capture holding the call's ``in_keys``, then
        writes those entries into ``td`` leaf by leaf, as the module would (tensordict refuses
        one without ``td``'s batch dims, as eagerly), and returns ``td``. ``NOT_SERVED``
        otherwise."""
        keys, slot = self.writes_only, self.spec.lone_slot
        stand = stand_in(td, in_keys, slot.batch_size) if keys is not None and slot is not None else None
        if stand is None:
            return NOT_SERVED
        add_required(stand, self.requires)
        verdict, split = decide(self, (stand,), {}, mode)
        if verdict is not REPLAY:
            return NOT_SERVED
        self.replay(*split, ((stand,), {}))
        for key in keys:
            value = stand.get(key)
            if _is_node(value):  # a TensorDict the module made: eagerly, its leaves were set
                for sub, leaf in value.items(include_nested=True, leaves_only=True):
                    td.set(key + (sub if isinstance(sub, tuple) else (sub,)), leaf)
            else:
                td.set(key, value)
        return td

    def written_keys(self) -> list:
        """Keys the function writes into its first TensorDict argument (top level and nested)."""
        out = []
        for op in self.effects.ops:
            ref = op.target
            if op.kind is TD and ref.kind in (SLOT, SLOT_OBJ) and ref.position == 0:
                prefix = ref.path
                out += [prefix + (name,) if prefix else name for name, _ in op.writes]
        return out

    # -- the replay path -----------------------------------------------------------------
    def extra_ok(self, leaves: Any, objs: dict) -> bool:
        """Aliasing, strides and unread structure, where the replay depends on them
        (usually nothing to do); for a layer, what its backward graph depends on."""
        if self.layer is not None and not self.layer.ok():
            return False
        if self.saves_inputs and any(leaves[i].is_inference() for i in self.inputs.tensor_index):
            return False
        if not self.extra_checks:
            return True
        return not self.extra_mismatches(leaves, None, objs)

    def replay(self, leaves: Any, objs: dict, tree: Any) -> Any:
        """The call's result (``decide`` said ``REPLAY``), counted in the wrapper's stats: its
        signature says which output set replays (a caller may still hold the last results:
        ``out = g(x)`` in a loop holds them until this call returns)."""
        return self.outputs.serve(self, leaves, objs, tree)

    def _replay(self, leaves: Any, objs: dict, tree: Any) -> Any:
        """This graph's replay for a call: inputs copied in, the graph replayed, the result."""
        if self.layer is None:
            self.inputs.copy_from(leaves)
        else:
            with torch.no_grad():  # buffers of inputs that require grad are leaves that do
                self.inputs.copy_from(leaves)
        self.runner.replay(self.handle)
        if self.single:
            lender = self.plan.lender
            if lender is not None:
                return lender.values()[0]
            out = self.plan.graph[0]
            return out.clone() if self.plan.clone else out
        return self.finish(leaves, objs, tree)

    def finish(self, leaves: Any, objs: dict, tree: Any) -> Any:
        layer = self.layer
        values = self.plan.values() if layer is None else layer.values(self.plan, leaves)
        memo: dict = {}
        if self.effects.any:
            # objects of the call the result holds, found before the effects move any (a
            # nested TensorDict returned, then deleted from its parent)
            for recipe in self.result_refs:
                memo[id(recipe)] = resolve(recipe.ref, tree, objs)
            lender = self.plan.lender
            self.effects.apply(self.inputs, leaves, objs, tree, values, memo,
                               lender.kept if lender is not None and layer is None else frozenset())
        return build(self.out_recipe, values, leaves, objs, tree, memo)

    def release(self) -> None:
        self.runner.release(self.handle)
        self.handle = self.cuda_graph = self.dump = None
        self.run = Entry._replay  # (the laid-out one holds the handle)
        if self.layer is not None:
            self.layer.release()
        if self.outputs is not None:
            self.outputs.release(self)

    # -- cold ----------------------------------------------------------------------------
    def extra_mismatches(self, leaves: Any, paths: list[str] | None, objs: dict) -> list[Mismatch]:
        """What refuses this call beyond its signature (``_refuse.call_mismatches``)."""
        return call_mismatches(self, leaves, paths, objs)
