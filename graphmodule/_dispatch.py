"""TensorDict modules: their keys, and the ways they can be called.

A TensorDict module (anything with ``in_keys``, or a function given ``in_keys``) is
called with a TensorDict, with keyword arguments named after its ``in_keys``
(``g(obs=x)``, through tensordict's own :func:`~tensordict.nn.dispatch`), or with
``tensordict_out=`` to receive the outputs in another TensorDict. Each form ends
in the same captured function, ``module(tensordict, *args, **kwargs)``, whose
TensorDict is read by key: its ``in_keys`` must be present, other keys are ignored.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Sequence

from tensordict import TensorDictBase
from tensordict.utils import unravel_key

from ._tree import as_key, leaf_keys

__all__ = ["resolve_keys", "run_with_tensordict_out", "module_name"]


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
            own_list = _normalise(own)
            given_list = _normalise(given)
            if given_list and given_list != own_list:
                warnings.warn(
                    f"CudaGraphModule ignores {name}={given!r}: the module has its own "
                    f"{name}={own!r}, which it uses. Leave {name} unset to silence this warning.",
                    UserWarning,
                    stacklevel=4,
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
    name = getattr(target, "__name__", None) or type(target).__name__
    return name


def run_with_tensordict_out(
    run: Callable[..., Any], tensordict: TensorDictBase, tensordict_out: TensorDictBase, args, kwargs
) -> TensorDictBase:
    """Run with the outputs going to ``tensordict_out``; ``tensordict`` is left unchanged.

    The function runs on a shallow copy of ``tensordict``; the entries it wrote there
    (new keys, or keys bound to new tensors) are set in ``tensordict_out``.
    """
    work = tensordict.copy()
    result = run(work, args, kwargs)
    if result is work:
        for key in leaf_keys(work):
            value = work.get(key)
            if tensordict.get(key, None) is not value:
                tensordict_out.set(key, value)
    elif isinstance(result, TensorDictBase):
        tensordict_out.update(result)
    else:
        return result
    return tensordict_out


def in_keys_for_layout(in_keys: Sequence[Any] | None) -> list | None:
    """The keys a TensorDict module reads (``None``: every key it had at capture)."""
    if not in_keys:
        return None
    return [as_key(unravel_key(k)) for k in in_keys]
