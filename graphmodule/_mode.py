"""What a call's outcome depends on besides its inputs: the modes a graph bakes in.

- grad mode: whether outputs track gradients;
- train/eval of every module the function reaches (dropout, batch norm);
- tensordict's interaction type (``set_interaction_type`` / torchrl's
  ``set_exploration_type``): whether a probabilistic module samples or takes the mode.

A graph captured under one mode replays that mode's branch, so the mode is part of
the captured signature: a call under another one is refused, or gets its own graph.
"""

from __future__ import annotations

from operator import attrgetter, itemgetter
from typing import Any, Sequence

import torch
from torch import nn

try:
    from tensordict.nn.probabilistic import interaction_type as _interaction_type
except ImportError:  # pragma: no cover - older tensordict
    def _interaction_type() -> Any:
        return None

from . import _dictwatch
from ._errors import Mismatch

__all__ = ["ModeReader"]

_is_grad_enabled = torch.is_grad_enabled
_training = attrgetter("training")
_training_item = itemgetter("training")


class ModeReader:
    """Reads the current mode of a call to a function reaching ``modules``."""

    def __init__(self, modules: Sequence[nn.Module], labels: Sequence[str]):
        self.modules = list(modules)
        self.labels = list(labels)
        # ``module.training`` read from each module's __dict__: half the time of getattr
        # on a class with __getattr__ (nn.Module's), for modules that keep it there
        if all("training" in vars(m) for m in self.modules):
            self._sources, self._get = [vars(m) for m in self.modules], _training_item
        else:
            self._sources, self._get = self.modules, _training
        # Where dict watchers see every store into those __dict__s (``module.train()``
        # included, see _dictwatch), the modules' modes are read again only after one of
        # them changed: a critic update reaching some 40 modules read 40 dicts per call.
        self._flag: _dictwatch.Flag | None = None
        self._modes: tuple = ()
        if self._get is _training_item and self._sources and all(
                _dictwatch.watchable(d, instance_dict=True) for d in self._sources):
            flag = _dictwatch.Flag()
            if _dictwatch.watch(self._sources, flag):
                self._flag = flag

    def read(self) -> tuple:
        flag = self._flag
        if flag is None:
            modes = tuple(map(self._get, self._sources))
        elif flag.raised:  # lowered before reading: a change from here on raises it again
            flag.raised = False
            modes = self._modes = tuple(map(self._get, self._sources))
        else:
            modes = self._modes
        return (_is_grad_enabled(), _interaction_type(), modes)

    def mismatches(self, captured: tuple, now: tuple) -> list[Mismatch]:
        found = []
        names = {True: "enabled", False: "disabled (torch.no_grad() or inference_mode)"}
        if captured[0] != now[0]:
            found.append(Mismatch("torch.is_grad_enabled()", "grad_mode", names[captured[0]], names[now[0]]))
        if captured[1] != now[1]:
            found.append(Mismatch("interaction_type()", "interaction_type", str(captured[1]), str(now[1])))
        modes = {True: "train mode", False: "eval mode"}
        for label, before, after in zip(self.labels, captured[2], now[2]):
            if before != after:
                found.append(Mismatch(f"{label}.training", "mode", modes[before], modes[after]))
        return found
