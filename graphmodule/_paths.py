"""Names for places in a call's inputs, and short descriptions of values, for messages.

Shared by the hot readers (``_tree``, ``_slots``) and the cold explainer (``_explain``); nothing
here runs on a replay that matches.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Sequence

import torch
from tensordict import TensorDictBase

NestedKey = tuple  # a TensorDict key as a tuple of strings


def as_key(key: Any) -> NestedKey:
    """``"a"`` and ``("a", "b")`` as tuples of strings."""
    return (key,) if isinstance(key, str) else tuple(key)


def format_key(key: NestedKey) -> str:
    return ", ".join(repr(part) for part in key)


def format_path(path: Sequence[Any], arg_names: Sequence[str] = ()) -> str:
    """``(0, 1, 'obs')`` → ``args[1]['obs']``; ``(1, 'x')`` → ``kwargs['x']``."""
    if not path:
        return "inputs"
    head, rest = path[0], list(path[1:])
    if head == 0 and rest:
        index = rest.pop(0)
        text = arg_names[index] if index < len(arg_names) else f"args[{index}]"
    elif head == 1 and rest:
        name = rest.pop(0)
        text = name if name == "tensordict_out" and arg_names else f"kwargs[{name!r}]"
    else:
        text = "inputs"
    return text + "".join(f"[{part!r}]" for part in rest)


def leaf_texts(leaf_paths: Sequence[tuple], arg_names: Sequence[str] = ()) -> list[str]:
    """Printable places of a layout's leaves: ``(optree path, key in a TensorDict or None)``."""
    out = []
    for path, key in leaf_paths:
        text = format_path(path, arg_names)
        out.append(text if key is None else f"{text}[{format_key(key)}]")
    return out


def describe(value: Any) -> str:
    """A short description of a value for messages; never prints tensor data."""
    if isinstance(value, torch.Tensor):
        layout = "" if value.layout is torch.strided else f", {value.layout}"
        return f"a tensor of shape {tuple(value.shape)}, {value.dtype} on {value.device}{layout}"
    if isinstance(value, TensorDictBase):
        return f"a {type(value).__name__} with batch size {tuple(value.batch_size)}"
    if isinstance(value, float):
        return repr(value)  # keeps -0.0 apart from 0.0
    text = repr(value)
    return text if len(text) <= 60 else f"a {type(value).__name__}"


# (and torch.compiler.disable's wrapper around the wrapper's __call__, in torch/_dynamo)
_OWN = (os.sep + "graphmodule" + os.sep, os.sep + "tensordict" + os.sep, os.sep + os.path.join("torch", "_dynamo", ""))


def user_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the user's line: the first frame outside
    graphmodule, tensordict (whose ``dispatch`` may sit between) and dynamo, counted from the caller."""
    frame, level = sys._getframe(1), 1
    while frame is not None and any(part in frame.f_code.co_filename for part in _OWN):
        frame, level = frame.f_back, level + 1
    return level
