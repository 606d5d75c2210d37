"""How the graph's results become the objects a call hands back, as eagerly.

At capture, :class:`PlanBuilder` turns every value the function produced (its output, and
what it stored into its input containers) into a recipe (see ``_recipes``): where a later
call takes each part from (the graph's buffers, the call's inputs or objects, values read
from outside). :class:`Plan` holds the graph's output tensors and gives each call its view
of them: copies that later calls never overwrite, the buffers themselves, or (with
``outputs="safe"``) the buffers lent out (``_lend``).
"""

from __future__ import annotations

import enum
import types
from typing import Any

import torch
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase, is_tensorclass
from torch import nn

from ._inputs import Span, StaticInputs, storage_base
from ._lend import DroppingLender, Lender
from ._materialized import Materialized
from ._policy import CapturePlan
from ._recipes import (
    Const,
    DictOf,
    Dressed,
    ExternalView,
    Graph,
    Input,
    LazyStackOf,
    ListOf,
    NamedTupleOf,
    ObjectOf,
    Passed,
    TensorClassOf,
    TensorDictOf,
    TupleOf,
    Unflatten,
    View,
)

__all__ = ["PlanBuilder", "Plan", "dense"]

Tensor = torch.Tensor

_NO_DISPATCH = torch._C._disabled_torch_dispatch_impl  # torch.Tensor's: no __torch_dispatch__ of its own

_SKIP_OBJECTS = (nn.Module, torch.optim.Optimizer, types.FunctionType, types.MethodType, type, types.ModuleType)


class Unsupported(Exception):
    """A value the recipes cannot rebuild (message: what and why)."""


class PlanBuilder:
    """Turns values the function produced at capture into recipes.

    Args:
        inputs: the static input buffers (to recognise inputs and views of them).
        materialized: the input tree handed to the function (to recognise its objects).
        externals: ``id(t) -> t`` of tensors the function reads from outside its
            inputs (parameters, buffers, optimizer state): returned as themselves.
    """

    def __init__(self, inputs: StaticInputs, materialized: Materialized, externals: dict[int, Tensor],
                 known: set[int] = frozenset(), places: dict[int, tuple] | None = None):
        self.inputs = inputs
        self.materialized = materialized
        self.externals = externals
        self.known = known  # ids of objects that existed before the call (returned as themselves)
        # tensors that stood for others during the capture (``_rebind``'s probes): planned as
        # those; ``met`` collects the ids of the ones found in what the function produced
        self.aliases: dict[int, Tensor] = {}
        self.met: set[int] = set()
        self._memo: dict[int, Any] = {}
        self._keep: list[Any] = []
        # storage -> the externals over it, and where each is read from (views of them are
        # made anew at each call, on the tensor found there)
        places = places or {}
        self.external_bases: dict[int, list[tuple[Tensor, tuple]]] = {}
        for t in externals.values():
            if t.numel() and id(t) in places:
                self.external_bases.setdefault(storage_base(t), []).append((t, places[id(t)]))
        self.input_index: dict[int, int] = {}
        self.input_bases: dict[int, int] = {}
        for i in inputs.tensor_index:
            buffer = inputs.leaves[i]
            self.input_index.setdefault(id(buffer), i)
            if buffer.numel():
                self.input_bases.setdefault(storage_base(buffer), i)
        self.graph: list[Tensor] = []  # tensors the graph produced, in recipe order
        self.graph_requires_grad: list[bool] = []
        self.sources: list[Tensor] = []  # the same tensors with their autograd history (see _grad)
        self._graph_index: dict[int, int] = {}
        self.stride_checked: set[int] = set()  # inputs whose views are handed back

    def plan(self, value: Any, depth: int = 0) -> Any:
        """The recipe of ``value``; one object met twice gets one recipe (built once per call)."""
        recipe = self._memo.get(id(value))
        if recipe is None:
            recipe = self._plan(value, depth)
            self._memo[id(value)] = recipe
            self._keep.append(value)
        return recipe

    def _plan(self, value: Any, depth: int) -> Any:
        if depth > 32:
            raise Unsupported("the value nests more than 32 levels deep")
        if isinstance(value, Tensor):
            return self._tensor(value)
        ref = self.materialized.refs.get(id(value))
        if ref is not None:
            return Passed(ref)
        if isinstance(value, TensorDictBase):
            return self._td(value, depth)
        if is_tensorclass(value):
            return TensorClassOf(type(value), self._td(value._tensordict, depth), dict(value._non_tensordict))
        if isinstance(value, tuple) and hasattr(type(value), "_fields"):
            return NamedTupleOf(type(value), [self.plan(v, depth + 1) for v in value])
        if isinstance(value, tuple) and hasattr(type(value), "n_sequence_fields"):  # torch.return_types
            return NamedTupleOf(type(value), [self.plan(v, depth + 1) for v in value], sequence=True)
        if type(value) is tuple:
            return TupleOf([self.plan(v, depth + 1) for v in value])
        if type(value) is list:
            return ListOf([self.plan(v, depth + 1) for v in value])
        if isinstance(value, dict) and type(value).__module__ in ("builtins", "collections"):
            extra = getattr(value, "default_factory", None)
            return DictOf(type(value), list(value.keys()), [self.plan(v, depth + 1) for v in value.values()], extra)
        if self._fresh_object(value):
            attrs = list(vars(value).items())
            return ObjectOf(value, [(name, self.plan(v, depth + 1)) for name, v in attrs])
        return Const(value)

    def _tensor(self, t: Tensor) -> Any:
        if self.aliases and id(t) in self.aliases:
            self.met.add(id(t))
            t = self.aliases[id(t)]
        index = self.input_index.get(id(t))
        if index is not None:
            return Input(index)
        if id(t) in self.externals:
            return Const(t)
        if type(t) is not Tensor or t.is_conj() or t.is_neg():
            return self._dressed(t)
        base = storage_base(t) if t.numel() else None
        if base is not None and base in self.input_bases:
            i = self.input_bases[base]
            buffer = self.inputs.leaves[i]
            if t.dtype != buffer.dtype:
                raise Unsupported(
                    f"an output is a view of an input with another dtype ({t.dtype} of {buffer.dtype})"
                )
            self.stride_checked.add(i)
            return View(i, tuple(t.shape), tuple(t.stride()), t.storage_offset() - buffer.storage_offset(),
                        buffer.requires_grad and not t.requires_grad)
        if base is not None and base in self.external_bases:
            return self._external_view(t, self.external_bases[base])
        j = self._graph_index.get(id(t))
        if j is None:
            j = self._graph_index[id(t)] = len(self.graph)
            self.graph.append(t.detach())
            self.graph_requires_grad.append(t.requires_grad)
            self.sources.append(t)
        return Graph(j)

    def graph_indices(self, tensors: list[Any]) -> tuple[int, ...] | None:
        """The graph index of each of ``tensors``, where each is a graph output (else ``None``)."""
        index = tuple(self._graph_index.get(id(t)) for t in tensors)
        return None if None in index else index

    def _external_view(self, t: Tensor, over: list[tuple[Tensor, tuple]]) -> ExternalView:
        """A view of a parameter, buffer or other tensor read from outside the inputs: made
        anew at each call, on the tensor read then (eagerly, ``p.t()`` is a new view each call)."""
        same = [(e, place) for e, place in over if e.dtype == t.dtype]
        external, (container, key) = (same or over)[0]
        # another dtype (torch.view_as_real of a complex parameter): viewed as that dtype first
        dtype = None if external.dtype == t.dtype else t.dtype
        return ExternalView(container, key, dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset(),
                            external.requires_grad and not t.requires_grad)

    def _dressed(self, t: Tensor) -> Any:
        """A tensor the graph's plain buffers cannot be: with a lazy conjugate or negative bit, of
        a subclass, an ``nn.Parameter``. Its plain memory is planned as any tensor's; each call
        rebuilds the rest around it."""
        cls = type(t)
        if cls.__torch_dispatch__ is not _NO_DISPATCH:
            if not hasattr(cls, "__tensor_flatten__"):
                raise Unsupported(f"the function returned a {cls.__name__}, a tensor subclass with its own "
                                  "__torch_dispatch__ and no __tensor_flatten__, which graphmodule cannot rebuild")
            names, context = t.__tensor_flatten__()
            return Unflatten(cls, list(names), [self.plan(getattr(t, name)) for name in names], context,
                             tuple(t.shape), tuple(t.stride()))
        # a new Parameter is a leaf made at each call; a subclass keeps its autograd history
        plain = t.detach() if isinstance(t, nn.Parameter) else t.as_subclass(Tensor) if cls is not Tensor else t
        conj, neg = plain.is_conj(), plain.is_neg()
        if conj:
            plain = plain.conj()  # the memory as it is, without the bit
        if neg:
            plain = torch._neg_view(plain)
        self._keep.append(plain)  # (its id is a key of the memo tables while planning)
        recipe_cls = None if cls is Tensor else nn.Parameter if cls is nn.Parameter else cls
        return Dressed(self._tensor(plain), conj, neg, recipe_cls, t.requires_grad)

    def _td(self, td: TensorDictBase, depth: int) -> Any:
        ref = self.materialized.refs.get(id(td))
        if ref is not None:
            return Passed(ref)
        if isinstance(td, LazyStackedTensorDict):
            return LazyStackOf(td.stack_dim, [self._td(sub, depth + 1) for sub in td.tensordicts])
        if type(td) is not TensorDict and not getattr(type(td), "_is_non_tensor", False):
            raise Unsupported(f"the function returned a {type(td).__name__}, which graphmodule cannot rebuild")
        if getattr(type(td), "_is_non_tensor", False):
            return Const(td)
        # nested TensorDicts through plan() too: one met twice (in the result and in an
        # input it was written into) is one object, as eagerly
        entries = [(name, self.plan(v, depth + 1)) for name, v in td.items()]
        names = tuple(td.names) if td._has_names() else None
        return TensorDictOf(td.batch_size, td.device, names, entries, td.is_locked)

    def _fresh_object(self, value: Any) -> bool:
        """An object the function created (eagerly a new one each call): copied per call.

        Objects that existed before the call (a module, a config object) are returned as
        themselves, as are immutable ones.
        """
        return (
            hasattr(value, "__dict__")
            and id(value) not in self.known
            and not isinstance(value, (*_SKIP_OBJECTS, enum.Enum))
        )


class Plan:
    """What the graph produced, and how a call's result and effects are built from it.

    ``values()`` gives this call's view of the graph's tensors, as ``outputs`` (the capture's
    plan, ``_policy``) says: copies that later calls never overwrite (``outputs.clone``), or
    the buffers themselves; with a ``lender`` (``outputs.lend``), the buffers lent out (see
    ``_lend``).
    """

    def __init__(self, graph: list[Tensor], requires_grad: list[bool], outputs: CapturePlan,
                 drops: list[tuple[Tensor, Tensor]] | None = None, enables_grad: bool = False,
                 drop_index: tuple[int, ...] | None = None):
        self.graph = graph
        self.outputs, self.clone = outputs, outputs.clone
        self.drops = bool(drops)  # (a train step that drops the .grad it binds: a capture again may lend them)
        # a train step that enables grad inside a call under torch.no_grad(): its outputs
        # require grad also where the call's grad mode is off, as eagerly
        self.enables_grad = enables_grad
        # outputs sharing memory (or overlapping themselves, as expanded tensors do) are
        # copied as one block of bytes, rebuilt with their strides
        groups: dict[int, list[int]] = {}
        for j, t in enumerate(graph):
            if t.numel():
                groups.setdefault(storage_base(t), []).append(j)
        self.shared = [m for m in groups.values() if len(m) > 1 or not dense(graph[m[0]])]
        shared = {j for members in self.shared for j in members}
        self.single = [j for j in range(len(graph)) if j not in shared]
        self.grad = [j for j, rg in enumerate(requires_grad) if rg]
        # outputs="safe": the graph's buffers are lent out, and never replayed over while
        # a caller holds them (see _lend); ``drops``: the .grad a train step drops at its start
        # (released before asking whether a caller holds a result, see _rebind; ``drop_index``:
        # the graph output each of those .grad is, where each is one). A graph returning copies
        # (``outputs.lend_drops``) still lends them: the step drops them at its next call, so a
        # copy of each would be made for nothing
        self.lender = None
        if outputs.lend:
            self.lender = DroppingLender(graph, drops, index=drop_index) if drops else Lender(graph)
        elif outputs.lend_drops and drops and drop_index and not self.shared:
            # (no output shares memory with another: the copies never alias a lent .grad)
            copied = frozenset(range(len(graph))) - frozenset(drop_index)
            self.lender = DroppingLender(graph, drops, copied, index=drop_index)

    def values(self) -> list[Tensor]:
        graph = self.graph
        lender = self.lender
        if lender is not None:
            out = lender.values()
        elif not self.clone or not graph:
            out = list(graph)
        elif not self.shared:
            if len(graph) == 1:
                out = [graph[0].clone()]
            else:
                out = [torch.empty_like(t) for t in graph]
                torch._foreach_copy_(out, graph)
                _fresh_versions(out)
        else:
            out = list(graph)
            if self.single:
                fresh = [torch.empty_like(graph[j]) for j in self.single]
                torch._foreach_copy_(fresh, [graph[j] for j in self.single])
                for j, t in zip(self.single, fresh):
                    out[j] = t
            for members in self.shared:
                _copy_shared(graph, members, out)
            _fresh_versions(out)  # (every output is a copy: one of the single ones or of a shared block)
        if self.grad:
            _attach_no_backward(out, self.grad, self.enables_grad)
        return out


def _fresh_versions(copies: list[Tensor]) -> None:
    """A call's copies get a fresh result's version counter (0), as eagerly: the copy into each
    counted one write. (One call for the list: torch 2.11 and later take sequences.)"""
    torch._C._autograd._unsafe_set_version_counter(tuple(copies), (0,) * len(copies))


def dense(t: Tensor) -> bool:
    """Whether ``t`` covers its memory without gaps or overlaps (``empty_like`` keeps its strides)."""
    if t.is_contiguous():
        return True
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _copy_shared(graph: list[Tensor], members: list[int], out: list[Tensor]) -> None:
    span = Span([(j, graph[j]) for j in members])  # one copy of the bytes they share
    made: dict[int, Tensor] = {}
    for j in members:
        t = graph[j]
        if id(t) not in made:
            made[id(t)] = span.view(t)
        out[j] = made[id(t)]


class _NoBackward(torch.autograd.Function):
    """Marks a replay's outputs as depending on gradients, and refuses to backpropagate
    (a train step's outputs; graphs used as layers backpropagate, see ``_grad``)."""

    @staticmethod
    def forward(ctx, anchor, *values):
        return tuple(v.view_as(v) for v in values)

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(
            "graphmodule: gradients cannot flow back through a CUDA graph replay of a function "
            "that runs backward itself (a train step: it changed a .grad, or freed its outputs' "
            "graph). The output you backpropagated through came from such a CudaGraphModule "
            "call; eagerly it would have required grad. Return loss.detach() from the step, or "
            "compute the loss outside the wrapped function: a wrapped block whose outputs you "
            "backpropagate through is captured with its backward."
        )


_ANCHORS: dict[torch.device, Tensor] = {}


def _attach_no_backward(out: list[Tensor], index: list[int], enables_grad: bool = False) -> None:
    if not torch.is_grad_enabled():
        if enables_grad:
            with torch.enable_grad():
                _attach_no_backward(out, index)
        return
    device = out[index[0]].device
    anchor = _ANCHORS.get(device)
    if anchor is None:
        anchor = _ANCHORS[device] = torch.zeros((), device=device, requires_grad=True)
    wrapped = _NoBackward.apply(anchor, *[out[j] for j in index])
    for j, t in zip(index, wrapped):
        out[j] = t

