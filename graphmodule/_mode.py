"""What a call's outcome depends on besides its inputs: the modes a graph bakes in.

- grad mode: whether outputs track gradients, and ``torch.inference_mode()``: whether
  they are inference tensors (a graph captured in inference mode also has inference
  tensors for buffers, which only inference mode may write);
- train/eval of every module the function reaches (dropout, batch norm);
- tensordict's interaction type (``set_interaction_type`` / torchrl's
  ``set_exploration_type``): whether a probabilistic module samples or takes the mode;
- autocast (``torch.autocast``) on the devices a graph runs on: each op's dtype, decided
  when the op is recorded, and whether autocast's cast cache is on;
- the default dtype (``torch.set_default_dtype``): the dtype of the tensors the function
  makes from Python numbers (``torch.zeros(3)``, ``torch.arange(3.)``);
- ``torch.use_deterministic_algorithms``: which kernels ops pick (and whether one without a
  deterministic variant raises).

A graph captured under one mode replays that mode's branch, so the mode is part of
the captured signature: a call under another one is refused, or gets its own graph.
What no graph can replay under a mode as the eager call runs is refused before a capture
(``_refuse.before_capture``).
"""

from __future__ import annotations

from operator import attrgetter, itemgetter
from typing import Any, Iterable, NamedTuple, Sequence

import torch
from torch import nn

try:
    from tensordict.nn import probabilistic as _probabilistic
    from tensordict.nn.probabilistic import interaction_type as _interaction_type
except ImportError:  # pragma: no cover - older tensordict
    def _interaction_type() -> Any:
        return None
else:
    # read at every call: where interaction_type() only returns its mode manager's mode (as in
    # tensordict 0.15), that manager's get_mode is called directly, a frame less
    if getattr(getattr(_interaction_type, "__code__", None), "co_names", ()) == ("_interaction_type", "get_mode"):
        _interaction_type = _probabilistic._interaction_type.get_mode

from . import _dictwatch
from ._errors import Mismatch, MismatchKind

__all__ = ["Mode", "ModeReader", "describe_autocast", "global_mode", "saves_inputs"]

_is_grad_enabled = torch.is_grad_enabled
_is_inference = torch.is_inference_mode_enabled
_any_autocast = torch._C._is_any_autocast_enabled
_autocast_enabled = torch.is_autocast_enabled
_autocast_dtype = torch.get_autocast_dtype
_autocast_cache = torch.is_autocast_cache_enabled
_default_dtype = torch.get_default_dtype
_deterministic = torch._C._get_deterministic_algorithms  # (torch.are_deterministic_algorithms_enabled, a C call)
_training = attrgetter("training")
_training_item = itemgetter("training")

# Autocast of other device types changes no op on the tensors a graph runs on (CUDA, or the
# CPU for the simulated and eager backends).
AUTOCAST_DEVICES = ("cuda", "cpu")


class Mode(NamedTuple):
    """A call's mode. :meth:`ModeReader.read` returns it as a plain tuple (the hot path
    compares tuples); ``Mode(*mode)`` names its fields.

    ``autocast``: ``None`` where autocast is off on every device of :data:`AUTOCAST_DEVICES`,
    else ``(((device_type, dtype), ...), cache_enabled)`` for the devices where it is on.
    """

    grad: bool
    interaction: Any
    modules: tuple
    autocast: tuple | None
    inference: bool
    dtype: torch.dtype = torch.float32
    deterministic: bool = False

    def grad_mode(self) -> str:
        if self.inference:
            return "inference_mode (torch.inference_mode())"
        return "enabled" if self.grad else "disabled (torch.no_grad())"


def _autocast() -> tuple | None:
    on = tuple((device, _autocast_dtype(device)) for device in AUTOCAST_DEVICES if _autocast_enabled(device))
    return (on, _autocast_cache()) if on else None


def describe_autocast(state: tuple | None) -> str:
    """``"off"``, or the ``torch.autocast(...)`` calls that make ``state``."""
    if state is None:
        return "off"
    on, cache = state
    return " and ".join(f"torch.autocast({device!r}, dtype={dtype}, cache_enabled={cache})" for device, dtype in on)


def global_mode() -> tuple:
    """The modes read without knowing the function's modules (before its first capture, when
    its modules are not known yet): :class:`Mode`'s fields, with no module modes."""
    return (_is_grad_enabled(), _interaction_type(), (), _autocast() if _any_autocast() else None, _is_inference(),
            _default_dtype(), _deterministic())


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
        """The call's mode, as a tuple of :class:`Mode`'s fields."""
        flag = self._flag
        if flag is None:
            modes = tuple(map(self._get, self._sources))
        elif flag.raised:  # lowered before reading: a change from here on raises it again
            flag.raised = False
            modes = self._modes = tuple(map(self._get, self._sources))
        else:
            modes = self._modes
        # (one C call when autocast is off everywhere, the usual case)
        return (_is_grad_enabled(), _interaction_type(), modes, _autocast() if _any_autocast() else None,
                _is_inference(), _default_dtype(), _deterministic())

    def mismatches(self, captured: tuple, now: tuple) -> list[Mismatch]:
        captured, now = Mode(*captured), Mode(*now)
        found = []
        if captured.grad_mode() != now.grad_mode():
            where = "torch.is_inference_mode_enabled()" if captured.inference != now.inference else "torch.is_grad_enabled()"
            found.append(Mismatch(where, MismatchKind.GRAD_MODE, captured.grad_mode(), now.grad_mode()))
        if captured.interaction != now.interaction:
            found.append(Mismatch("interaction_type()", MismatchKind.INTERACTION_TYPE, str(captured.interaction),
                                  str(now.interaction)))
        if captured.autocast != now.autocast:
            found.append(Mismatch("torch.autocast", MismatchKind.AUTOCAST, describe_autocast(captured.autocast),
                                  describe_autocast(now.autocast)))
        if captured.dtype != now.dtype:
            found.append(Mismatch("torch.get_default_dtype()", MismatchKind.DEFAULT_DTYPE, str(captured.dtype), str(now.dtype)))
        if captured.deterministic != now.deterministic:
            found.append(Mismatch("torch.are_deterministic_algorithms_enabled()", MismatchKind.DETERMINISTIC,
                                  str(captured.deterministic), str(now.deterministic)))
        modes = {True: "train mode", False: "eval mode"}
        for label, before, after in zip(self.labels, captured.modules, now.modules):
            if before != after:
                found.append(Mismatch(f"{label}.training", MismatchKind.MODE, modes[before], modes[after]))
        return found


def saves_inputs(mode: tuple, layer: Any, externals: Iterable[Any]) -> bool:
    """Whether autograd may save a call's inputs for backward: captured with grad enabled and
    something that requires grad (a layer, a train step's parameters). Eagerly, an inference
    tensor saved for backward is refused; a graph's buffers are normal tensors, which are not."""
    return bool(mode) and Mode(*mode).grad and (layer is not None or any(t.requires_grad for t in externals))
