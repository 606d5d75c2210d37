"""Recipes: how each part of a call's result is made from the graph's buffers and the call.

At capture, every value the function produced (its output, and what it stored into its
input containers) is turned into a *recipe* (see ``_outputs.PlanBuilder``): a small tree of
the records below that says, for each part, where a later call takes it from:

- a tensor the graph produced (:class:`Graph`): from this call's view of the graph's
  buffers; several outputs sharing memory share one copy, so they alias as they did;
- one of the call's inputs (:class:`Input`), a view of one (:class:`View`, rebuilt on the
  caller's tensor so writes through it reach the caller), or a container or TensorDict the
  caller passed (:class:`Passed`): the caller's own object;
- a value the function read from outside its inputs, such as a parameter (:class:`Const`):
  that same value; a view of one (:class:`ExternalView`): a new view at each call, as eagerly;
- a tensor with what the graph's plain buffers lose (:class:`Dressed`): a lazy conjugate or
  negative bit, a tensor subclass, ``nn.Parameter``; a wrapper subclass that flattens into
  plain tensors (``DTensor``, :class:`Unflatten`): rebuilt around them;
- containers, TensorDicts, tensorclasses, dataclasses and other objects holding such parts:
  rebuilt around them (:class:`TupleOf` ... :class:`LazyStackOf`).

Each record is a frozen dataclass with slots (read as fast as a tuple) whose class carries
its :class:`Kind`. Recipes compare by identity: one object met twice is one recipe.

    >>> build(TupleOf([Graph(0), Const("a")]), values=["out"], leaves=[], objs={}, tree=None)
    ('out', 'a')
"""

from __future__ import annotations

import copy
import enum
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from tensordict import LazyStackedTensorDict, TensorDict
from torch import nn

from ._materialized import Ref, resolve

__all__ = ["Kind", "build", "collect", "dress", "passed_recipes", "undress"]


class Kind(enum.Enum):
    """What a recipe makes."""

    CONST = "a value read from outside the inputs, returned as itself"
    GRAPH = "a tensor the graph produced"
    INPUT = "one of the call's input tensors"
    VIEW = "a view of one of the call's input tensors"
    PASSED = "a container or TensorDict the caller passed"
    TUPLE = "a tuple"
    LIST = "a list"
    DICT = "a dict (or OrderedDict, defaultdict)"
    NAMEDTUPLE = "a namedtuple"
    TD = "a TensorDict the function made"
    TC = "a tensorclass the function made"
    OBJECT = "an object the function made (copied per call)"
    LAZY = "a lazily stacked TensorDict"
    EXTERNAL_VIEW = "a view of a tensor read from outside the inputs (a parameter, a buffer)"
    DRESSED = "a tensor with a lazy conjugate or negative bit, of a subclass, or an nn.Parameter"
    UNFLATTEN = "a wrapper tensor subclass rebuilt from its plain tensors (__tensor_unflatten__)"


# (module-level names: reading an enum member through its class costs ~100 ns a call)
CONST, GRAPH, INPUT, VIEW, PASSED = Kind.CONST, Kind.GRAPH, Kind.INPUT, Kind.VIEW, Kind.PASSED
TUPLE, LIST, DICT, NAMEDTUPLE, TD, TC, OBJECT, LAZY = (
    Kind.TUPLE, Kind.LIST, Kind.DICT, Kind.NAMEDTUPLE, Kind.TD, Kind.TC, Kind.OBJECT, Kind.LAZY)
EXTERNAL_VIEW, DRESSED, UNFLATTEN = Kind.EXTERNAL_VIEW, Kind.DRESSED, Kind.UNFLATTEN


_record = dataclass(frozen=True, slots=True, eq=False)  # (identity, not value, equality)


@_record
class Const:
    value: Any
    kind: ClassVar[Kind] = CONST


@_record
class Graph:
    index: int  # into the graph's outputs (Plan.graph)
    kind: ClassVar[Kind] = GRAPH


@_record
class Input:
    index: int  # into the call's leaves
    kind: ClassVar[Kind] = INPUT


@_record
class View:
    index: int  # the input leaf viewed
    shape: tuple
    stride: tuple
    offset: int  # in elements, from the leaf's own storage offset
    detached: bool = False  # (x.detach(): no autograd history, whatever the leaf's)
    kind: ClassVar[Kind] = VIEW


@_record
class ExternalView:
    container: Any  # where the viewed tensor is read from (a module's _parameters...)
    key: Any
    dtype: Any  # the view's, where it differs (torch.view_as_real of a complex parameter), else None
    shape: tuple
    stride: tuple
    offset: int  # the storage offset, in elements
    detached: bool = False  # (p.detach() of a parameter: no autograd history)
    kind: ClassVar[Kind] = EXTERNAL_VIEW


@_record
class Dressed:
    inner: Any  # the recipe of the plain tensor: its memory, strides, no lazy bit
    conj: bool
    neg: bool
    cls: type | None  # the subclass, or nn.Parameter (None: torch.Tensor)
    requires_grad: bool  # an nn.Parameter's
    kind: ClassVar[Kind] = DRESSED


@_record
class Unflatten:
    cls: type
    names: list  # of the inner tensors (__tensor_flatten__)
    parts: list  # their recipes
    context: Any
    shape: tuple
    stride: tuple
    kind: ClassVar[Kind] = UNFLATTEN


@_record
class Passed:
    ref: Ref  # where the caller's object sits in the call
    kind: ClassVar[Kind] = PASSED


@_record
class TupleOf:
    items: list
    kind: ClassVar[Kind] = TUPLE


@_record
class ListOf:
    items: list
    kind: ClassVar[Kind] = LIST


@_record
class DictOf:
    cls: type
    keys: list
    values: list
    default_factory: Any  # a defaultdict's, else None
    kind: ClassVar[Kind] = DICT


@_record
class NamedTupleOf:
    cls: type
    items: list
    sequence: bool = False  # a structseq (torch.return_types.max...): built from one sequence
    kind: ClassVar[Kind] = NAMEDTUPLE


@_record
class TensorDictOf:
    batch_size: Any
    device: Any
    names: tuple | None
    entries: list  # (name, recipe)
    locked: bool
    kind: ClassVar[Kind] = TD


@_record
class TensorClassOf:
    cls: type
    td: TensorDictOf
    non_tensor: dict
    kind: ClassVar[Kind] = TC


@_record
class ObjectOf:
    template: Any  # copied (copy.copy) per call
    attrs: list  # (name, recipe)
    kind: ClassVar[Kind] = OBJECT


@_record
class LazyStackOf:
    stack_dim: int
    items: list
    kind: ClassVar[Kind] = LAZY


def build(recipe: Any, values: list, leaves: Any, objs: dict, tree: Any, memo: dict | None = None) -> Any:
    """The value a recipe describes, for one call; ``memo`` makes one object per recipe."""
    kind = recipe.kind
    if kind is GRAPH:
        return values[recipe.index]
    if kind is INPUT:
        return leaves[recipe.index]
    if kind is CONST:
        return recipe.value
    if kind is PASSED:
        made = memo.get(id(recipe)) if memo is not None else None  # resolved before the effects
        return made if made is not None else resolve(recipe.ref, tree, objs)
    if memo is None:
        memo = {}
    made = memo.get(id(recipe))
    if made is None:
        made = memo[id(recipe)] = _make(recipe, values, leaves, objs, tree, memo)
    return made


def _make(recipe: Any, values: list, leaves: Any, objs: dict, tree: Any, memo: dict) -> Any:
    kind = recipe.kind
    if kind is VIEW:
        leaf = leaves[recipe.index]
        if recipe.detached:
            leaf = leaf.detach()
        return leaf.as_strided(recipe.shape, recipe.stride, leaf.storage_offset() + recipe.offset)
    if kind is EXTERNAL_VIEW:
        viewed = recipe.container[recipe.key]
        if recipe.detached:
            viewed = viewed.detach()
        if recipe.dtype is not None:  # (view_as_real keeps the autograd history view(dtype) drops)
            viewed = torch.view_as_real(viewed) if viewed.is_complex() and viewed.dtype.to_real() == recipe.dtype \
                else viewed.view(recipe.dtype)
        return viewed.as_strided(recipe.shape, recipe.stride, recipe.offset)
    parts = [build(r, values, leaves, objs, tree, memo) for r in children(recipe)]
    if kind is DRESSED:
        return dress(recipe, parts[0])
    if kind is UNFLATTEN:
        return recipe.cls.__tensor_unflatten__(dict(zip(recipe.names, parts)), recipe.context, recipe.shape,
                                               recipe.stride)
    if kind is TUPLE:
        return tuple(parts)
    if kind is LIST:
        return parts
    if kind is DICT:
        items = zip(recipe.keys, parts)
        return recipe.cls(recipe.default_factory, items) if recipe.default_factory is not None else recipe.cls(items)
    if kind is NAMEDTUPLE:
        return recipe.cls(parts) if recipe.sequence else recipe.cls(*parts)
    if kind is TD:
        source = {name: part for (name, _), part in zip(recipe.entries, parts)}
        td = TensorDict._new_unsafe(source=source, batch_size=recipe.batch_size, device=recipe.device)
        if recipe.names is not None:
            td.names = list(recipe.names)
        return td.lock_() if recipe.locked else td
    if kind is TC:
        return recipe.cls._from_tensordict(parts[0], non_tensordict=dict(recipe.non_tensor))
    if kind is OBJECT:
        obj = copy.copy(recipe.template)
        for (name, _), part in zip(recipe.attrs, parts):
            object.__setattr__(obj, name, part)
        return obj
    if kind is LAZY:
        return LazyStackedTensorDict(*parts, stack_dim=recipe.stack_dim)
    raise AssertionError(f"unknown recipe {recipe!r}")  # pragma: no cover


def dress(recipe: Dressed, plain: torch.Tensor) -> torch.Tensor:
    """``plain`` with the lazy bits and the class ``recipe`` records."""
    out = plain
    if recipe.conj:
        out = out.conj()
    if recipe.neg:
        out = torch._neg_view(out)
    cls = recipe.cls
    if cls is nn.Parameter:
        return nn.Parameter(out, requires_grad=recipe.requires_grad)
    return out if cls is None else out.as_subclass(cls)


def undress(recipe: Dressed, value: torch.Tensor) -> torch.Tensor:
    """The plain tensor ``value`` was made from (its bits cleared, a plain ``Tensor``)."""
    out = value.as_subclass(torch.Tensor) if recipe.cls is not None else value
    if recipe.conj:
        out = out.conj()  # (conj of a conjugate view: the memory as it is, without the bit)
    if recipe.neg:
        out = torch._neg_view(out)
    return out


def children(recipe: Any) -> list:
    """The recipes directly inside ``recipe``, in the order its parts are built."""
    kind = recipe.kind
    if kind in (TUPLE, LIST, NAMEDTUPLE, LAZY):
        return recipe.items
    if kind is DRESSED:
        return [recipe.inner]
    if kind is UNFLATTEN:
        return recipe.parts
    if kind is DICT:
        return recipe.values
    if kind is TD:
        return [r for _, r in recipe.entries]
    if kind is TC:
        return [recipe.td]
    if kind is OBJECT:
        return [r for _, r in recipe.attrs]
    return []


def passed_recipes(recipe: Any) -> list[Passed]:
    """The :class:`Passed` recipes inside ``recipe``: objects of the call the result holds."""
    if recipe.kind is PASSED:
        return [recipe]
    return [found for child in children(recipe) for found in passed_recipes(child)]


def collect(recipe: Any, value: Any, out: dict[int, Any]) -> None:
    """The tensors at the recipe's :class:`Graph` places in ``value`` (what a twin copies out, ``_twin``)."""
    kind = recipe.kind
    if kind is GRAPH:
        out.setdefault(recipe.index, value)
    elif kind in (TUPLE, LIST, NAMEDTUPLE):
        for r, v in zip(recipe.items, value):
            collect(r, v, out)
    elif kind is DICT:
        for r, v in zip(recipe.values, value.values()):
            collect(r, v, out)
    elif kind is TD:
        for name, r in recipe.entries:
            collect(r, value.get(name), out)
    elif kind is TC:
        collect(recipe.td, value._tensordict, out)
    elif kind is OBJECT:
        for name, r in recipe.attrs:
            collect(r, getattr(value, name), out)
    elif kind is LAZY:
        for r, v in zip(recipe.items, value.tensordicts):
            collect(r, v, out)
    elif kind is DRESSED:
        collect(recipe.inner, undress(recipe, value), out)
    elif kind is UNFLATTEN:
        names, _ = value.__tensor_flatten__()
        inner = dict(zip(names, (getattr(value, name) for name in names)))
        for name, r in zip(recipe.names, recipe.parts):
            collect(r, inner[name], out)

