"""TensorDict modules and keyword arguments: keys, calling conventions, argument order.

A TensorDict module (anything with ``in_keys``, or a function given ``in_keys``) is
called with a TensorDict, with keyword arguments named after its ``in_keys``
(``g(obs=x)``, through tensordict's own :func:`~tensordict.nn.dispatch`), and
optionally with ``tensordict_out=``, which is passed on to the module as
tensordict's wrapper does. The TensorDict is read by key: the module's ``in_keys``
must be there, other keys are ignored; ``tensordict_out`` is written, not read.

Both call styles of one ``TensorDictModuleBase`` share its graphs: dispatch turns
``g(obs=x)`` into ``g(TensorDict(obs=x, batch_size=[]))`` (as eagerly), and that TensorDict,
which the caller never sees, takes the batch size of a graph whose entries it fits
(:func:`fit_batch`); a TensorDict of another batch size than a graph captured from keywords
is served through a stand-in of the graph's (``_entry.Entry.rebatched``).

:class:`TensorDictCalls` is that call style, chosen once at construction for a TensorDict
module (a plain function's wrapper has none): the hot path tests only whether a call needs
dispatch, and such a call reaches the wrapper as one whose TensorDict dispatch built.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Protocol

from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase, dispatch
from tensordict.utils import unravel_key

from ._paths import NestedKey, as_key, user_stacklevel

__all__ = ["resolve_keys", "module_name", "by_key_paths", "binds_kwargs_by_name", "sorted_kwargs", "fit_batch",
           "stand_in", "add_required", "TensorDictCalls"]


def _normalise(keys: Any) -> list | None:
    if keys is None:
        return None
    if isinstance(keys, (str, tuple)):
        keys = [keys]
    return [unravel_key(k) for k in keys]


def resolve_keys(module: Any, in_keys: Any, out_keys: Any) -> tuple[list | None, list | None]:
    """The ``in_keys``/``out_keys`` to use, as tensordict's wrapper picks them.

    The module's own keys win; explicit keys that differ are ignored with a warning.
    ``out_keys`` defaults to ``[]`` when ``in_keys`` is given.
    """
    chosen = {}
    for name, given in (("in_keys", in_keys), ("out_keys", out_keys)):
        own = getattr(module, name, None)
        if own is not None:
            given_list = _normalise(given)
            if given_list and given_list != _normalise(own):
                warnings.warn(
                    f"CudaGraphModule ignores {name}={given!r}: the module has its own "
                    f"{name}={own!r}, which it uses instead. Leave {name} unset to silence this warning.",
                    UserWarning,
                    stacklevel=user_stacklevel(),
                )
            chosen[name] = own
        else:
            chosen[name] = given
    if chosen["out_keys"] is None and chosen["in_keys"] is not None:
        chosen["out_keys"] = []
    return chosen["in_keys"], chosen["out_keys"]


def module_name(module: Any) -> str:
    """A short name for messages: the function's or the class's name."""
    inner = getattr(module, "_orig_mod", None) or getattr(module, "_torchdynamo_orig_callable", None)
    target = inner if inner is not None else module
    return getattr(target, "__name__", None) or type(target).__name__


def by_key_paths(in_keys: list | None, with_out: bool) -> dict[tuple, list[NestedKey] | None]:
    """The TensorDicts of a TensorDict module's call that are read by key, by optree path.

    The input TensorDict (the first argument) reads the module's ``in_keys`` (``None``
    for ``in_keys=[]``: the keys it has at capture); ``tensordict_out`` reads nothing.
    """
    if in_keys is None:
        return {}
    keys = [as_key(unravel_key(k)) for k in in_keys] if in_keys else None
    paths: dict[tuple, list[NestedKey] | None] = {(0, 0): keys}
    if with_out:
        paths[(1, "tensordict_out")] = []
    return paths


def binds_kwargs_by_name(module: Any) -> bool:
    """Whether keyword arguments reach ``module`` by name only (no ``**kwargs``).

    Then their order cannot matter to it, and calls are compared with their keywords
    sorted. A function taking ``**kwargs`` may iterate them: order is kept.
    """
    target = getattr(module, "forward", module) if not inspect.isfunction(module) else module
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return False
    return not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def sorted_kwargs(kwargs: dict) -> dict:
    """Keyword arguments in sorted order (for a function that binds them by name)."""
    keys = list(kwargs)
    if keys == sorted(keys):
        return kwargs
    return {k: kwargs[k] for k in sorted(keys)}


def fit_batch(td: Any, batch_sizes: list) -> None:
    """Give ``td``, a TensorDict dispatch built from a keyword call (batch size ``[]``), the
    first of ``batch_sizes`` (the graphs', most recently used first) whose leading dims its
    entries have, unless one is its own: then the call matches that graph. A module's result
    for its ``out_keys`` does not depend on the batch size of the TensorDict it reads them
    from (dispatch itself equates a keyword call with one of batch size ``[]``)."""
    if td.batch_size in batch_sizes:
        return
    for batch_size in batch_sizes:
        if len(batch_size):
            try:
                td.batch_size = batch_size
                return
            except RuntimeError:  # an entry without those leading dims
                continue


def stand_in(td: Any, in_keys: list, batch_size: Any) -> Any:
    """A TensorDict holding ``td``'s ``in_keys`` entries (the same tensors) with ``batch_size``,
    for a graph captured with that batch size; ``None`` where an entry is missing or does not
    have those leading dims."""
    try:
        out = td.select(*in_keys)
        out.batch_size = batch_size
    except (KeyError, RuntimeError):
        return None
    return out


def add_required(td: Any, requires: Any) -> None:
    """Give ``td``, a TensorDict of the wrapper's own (one built by dispatch, or a stand-in),
    the empty nested TensorDicts a graph requires of its TensorDict argument where it writes
    below them (``Requirement``\\ s at position 0 with a batch size): the values the module
    writes do not depend on them."""
    for position, key, batch_size in requires:
        if position == 0 and batch_size is not None and td.get(key, None) is None:
            td.set(key, TensorDict(batch_size=batch_size, device=td.device))


class Dispatched(Protocol):
    """What :class:`TensorDictCalls` hands a call to once dispatch has read it."""

    def _call_built(self, tensordict: Any, args: tuple, kwargs: dict, built: Any) -> Any:
        """``tensordict`` (``built``: the one dispatch built from keywords or tensors, or None)."""


class TensorDictCalls:
    """A TensorDict module's call styles (see the module docstring), chosen at construction.

    ``keyed``: the module reads keys (``in_keys`` not empty): a first argument that is not a
    TensorDict is one of its inputs, for dispatch to put in one. ``both_styles``: a TensorDict
    module proper, whose keyword calls and TensorDict calls share graphs. ``built``: during a
    call, the TensorDict dispatch built for it (the caller never sees it), else None.
    """

    __slots__ = ("in_keys", "out_keys", "keyed", "both_styles", "built")

    def __init__(self, module: Any, in_keys: list, out_keys: list) -> None:
        self.in_keys, self.out_keys = in_keys, out_keys  # (what dispatch reads, by these names)
        self.keyed = bool(in_keys)
        self.both_styles = isinstance(module, TensorDictModuleBase)
        self.built: TensorDictBase | None = None

    def call(self, wrapper: Dispatched, args: tuple, kwargs: dict) -> Any:
        """A call the hot path cannot take as it is (keywords, positional tensors,
        ``tensordict_out``, no argument) through dispatch: a TensorDict call is passed on
        unchanged by it (and a function reading a TensorDict, ``in_keys=[]``, is not given one
        built from a tensor)."""
        given = args[0] if args and isinstance(args[0], TensorDictBase) else kwargs.get("tensordict")
        return self._dispatch(*args, _wrapper=wrapper, _given=given, **kwargs)

    @dispatch(source="in_keys", dest="out_keys", auto_batch_size=False)
    def _dispatch(self, tensordict, *args: Any, tensordict_out: Any = None, _wrapper: Any = None, _given: Any = None,
                  **kwargs: Any) -> Any:
        # built by dispatch from keywords or tensors (batch size []): the caller never sees it
        built = tensordict if tensordict is not _given and isinstance(tensordict, TensorDictBase) else None
        if tensordict_out is not None:
            kwargs["tensordict_out"] = tensordict_out
        return _wrapper._call_built(tensordict, args, kwargs, built)

    def one_tensordict(self, args: tuple, kwargs: dict) -> bool:
        """A call ``g(td)`` of a TensorDict module served in both call styles (see ``_graphs``)."""
        return self.both_styles and len(args) == 1 and not kwargs and isinstance(args[0], TensorDictBase)

    def built_first(self, args: tuple) -> bool:
        """Whether the call's first argument is the TensorDict dispatch built (from keywords:
        it has no batch size of the caller's to blame)."""
        return self.built is not None and bool(args) and args[0] is self.built
