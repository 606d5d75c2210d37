"""Which graph a call goes to when a wrapper holds several (a flag's values, ``max_graphs=N``).

Every call first tries the most recently used graph, but one after a call that switched graphs
(a flag that alternates at every call), which tries the graph this index names first, so that
an alternating call costs a lookup rather than a failed match. A call of another signature (an epoch's
last, smaller minibatch; evaluation's batch size; a policy called in train and in eval mode)
used to try every graph's full match in turn, the most expensive way to miss.
:class:`CallIndex` remembers, per *call key* (the modes, each argument's ``shape`` and a
Python scalar argument's value -- a bool flag that alternates -- read without flattening
anything), the graph such a call matched last; the wrapper then runs that graph's full match
only. The key is a hint, never a decision: a graph found through it is matched in full, and a
key found nowhere falls back to trying every graph. Signatures that share a key (the same
shapes, other dtypes or constants) cost that scan, never a wrong graph. Strides are not in the
key: a call of any layout has its shape's signature (``_spec``).

    >>> import torch
    >>> from graphmodule._index import call_key
    >>> call_key((torch.zeros(2, 3),), {}, (True,))
    ((True,), (torch.Size([2, 3]),), (), ())
"""

from __future__ import annotations

import weakref
from typing import Any

from torch import Tensor

__all__ = ["CallIndex", "call_key"]


_VALUES = frozenset({bool, int, float, str, type(None)})


def _arg_key(a: Any) -> Any:
    # a Python scalar by value: a flag that alternates between calls picks its graph
    # (max_graphs=None keeps one per value); strides are not part of a signature
    if isinstance(a, Tensor):
        return a.shape
    return a if type(a) in _VALUES else getattr(a, "shape", None)


def call_key(args: tuple, kwargs: dict, mode: Any) -> tuple:
    """What a call's graph is looked up by: the modes, then each argument's ``shape``
    (``None`` for an argument without one; its value for a Python scalar), keyword names
    included."""
    return (mode, tuple([_arg_key(a) for a in args]), tuple(kwargs), tuple([_arg_key(v) for v in kwargs.values()]))


class CallIndex:
    """Call key -> the graph (an ``Entry``) a call with that key matched last.

    It holds its graphs weakly and answers only with graphs the wrapper still holds, so an
    evicted, replaced or released graph is never returned and never kept alive.
    """

    __slots__ = ("_refs",)

    def __init__(self) -> None:
        self._refs: dict[tuple, weakref.ref] = {}

    def find(self, args: tuple, kwargs: dict, mode: Any, entries: list) -> Any:
        """The graph a call with this key matched last, if the wrapper still holds it
        (``entries``), else ``None``."""
        try:
            ref = self._refs.get(call_key(args, kwargs, mode))
        except Exception:  # noqa: BLE001 - a shape that cannot be read or hashed: no hint
            return None
        if ref is None:
            return None
        entry = ref()
        return entry if entry is not None and entry in entries else None

    def remember(self, args: tuple, kwargs: dict, mode: Any, entry: Any, entries: list) -> None:
        """``entry`` matched this call; ``entries``: the graphs the wrapper holds."""
        try:
            self._refs[call_key(args, kwargs, mode)] = weakref.ref(entry)
        except Exception:  # noqa: BLE001 - no hint for this call
            return
        if len(self._refs) > 2 * len(entries) + 8:  # forget graphs no longer held
            self._refs = {k: r for k, r in self._refs.items() if r() is not None and r() in entries}

    def __len__(self) -> int:
        return len(self._refs)
