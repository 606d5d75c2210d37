"""Optimizers the wrapped function steps, made capturable before their first step, as
``torch.compile`` does.

torch refuses to step an optimizer built with ``capturable=False`` inside a CUDA graph
("... but param_groups' capturable is False"): its step counts live on the host, where a
replay would not advance them. TorchRL's published scripts build plain
``torch.optim.Adam(...)``. So around each warmup call a step pre-hook (torch's global one,
answering this thread only) looks at every optimizer the function steps, just before the
step reads its param groups, and sets ``capturable=True`` on them where :func:`verdict`
says the switch is exact: the class has the flag, the optimizer never stepped (its state
is made on the GPU from the start, so warmup calls and replays run the same code), and
every parameter is on the graph's device. One warning per call names what was switched.
``torch.compile`` does the same when it traces a step (``_set_capturable`` in
``torch/_dynamo/variables/optimizer.py``: uninitialised state, CUDA parameters), so inside a
``torch.compile``-d function (which dynamo traces, this hook included) the hook stands aside.

Where the switch cannot be made (the optimizer stepped before the wrapper's first call,
parameters elsewhere, a step first taken inside the capture) the capture fails as torch
says, cause ``optimizer-not-capturable``, and :func:`explain` names the optimizer and the fix.

The switch is not free of change: capturable Adam (AdamW, RMSprop...) computes its bias
corrections from the step count as tensors on the GPU, where the plain step uses Python
floats, so parameters can differ from a ``capturable=False`` eager step in the last bits
(a fused optimizer's math is the same either way).

The simulated backend (``backend="simulate"``, on a CPU) stands in for that switch where it
can: torch refuses ``capturable=True`` for CPU tensors, and a plain step reads its step counts
on the host, which a simulated capture refuses as CUDA's does. Adam and AdamW, whose CPU step
can be fused (its step counts are tensors then), are made ``fused=True`` instead, so that a
CPU test serves the programs a GPU serves; their parameters too differ from a plain step's in
the last bits. Other classes are refused there as on a GPU that cannot switch them.

>>> import torch
>>> opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))])
>>> verdict(facts(opt), torch.device("cuda", 0)).name  # its parameter is on the CPU
'OFF_DEVICE'
"""

from __future__ import annotations

import enum
import threading
import warnings
from typing import Any, Callable, NamedTuple

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from ._discover import Discovery
from ._errors import CaptureError
from ._paths import user_stacklevel

__all__ = ["Facts", "Verdict", "explain", "facts", "stepping_capturable", "verdict"]

CAUSE = "optimizer-not-capturable"


class Verdict(enum.Enum):
    """What the wrapper does with an optimizer its function steps."""

    SWITCH = "capturable=True is set on its param groups"
    CAPTURABLE = "capturable already"
    NO_FLAG = "its class has no capturable flag (SGD steps in a graph as it is)"
    STEPPED = "it has state (a step, load_state_dict): its step counts are on the host"
    OFF_DEVICE = "a parameter is not on the graph's device"
    FUSE = "fused=True is set on its param groups (a simulated graph's stand-in for capturable)"
    NO_GRAPH = "the wrapper captures no CUDA graph (simulated, eager, no CUDA)"


class Facts(NamedTuple):
    """What :func:`verdict` reads of one optimizer."""

    flags: tuple  # each param group's capturable (None: the class has no such flag)
    stepped: bool  # some parameter has state
    devices: frozenset  # the devices of its parameters
    fusable: bool = False  # a class whose CPU step can be fused, not fused yet, float parameters


def facts(opt: torch.optim.Optimizer) -> Facts:
    """The facts of ``opt`` now."""
    groups = opt.param_groups
    params = [p for group in groups for p in group["params"]]
    fusable = (type(opt) in _FUSED_ON_CPU and not any(group.get("fused") or group.get("differentiable")
                                                      for group in groups)
               and all(torch.is_floating_point(p) for p in params))
    return Facts(flags=tuple(group.get("capturable") for group in groups),
                 stepped=any(bool(state) for state in opt.state.values()),
                 devices=frozenset(p.device for p in params), fusable=fusable)


# torch's fused CPU steps of the classes that have the capturable flag
_FUSED_ON_CPU = (torch.optim.Adam, torch.optim.AdamW)
_CPU = torch.device("cpu")


def verdict(found: Facts, device: torch.device | None, simulated: bool = False) -> Verdict:
    """Whether an optimizer with these facts, stepped by a graph on ``device`` (None: no CUDA
    graph), is made capturable (``SWITCH``), and why not otherwise; ``simulated``: by a
    simulated graph on the CPU, where ``FUSE`` stands in for the switch. Pure."""
    if simulated:
        switchable = None not in found.flags and not any(found.flags) and not found.stepped
        return Verdict.FUSE if switchable and found.fusable and found.devices <= {_CPU} else Verdict.NO_GRAPH
    if device is None or device.type != "cuda":
        return Verdict.NO_GRAPH  # (capturable needs CUDA tensors: on the CPU torch refuses the flag)
    if None in found.flags:
        return Verdict.NO_FLAG
    if all(found.flags):
        return Verdict.CAPTURABLE
    if not found.devices <= {device}:  # (first: its steps are not the graph's, stepped or not)
        return Verdict.OFF_DEVICE
    if found.stepped:
        return Verdict.STEPPED
    return Verdict.SWITCH


class _Switch:
    """The step pre-hook: makes the optimizers this thread steps capturable where exact."""

    def __init__(self, device: torch.device | None, simulated: bool) -> None:
        self.device, self.simulated, self.thread = device, simulated, threading.get_ident()
        self.switched: list[torch.optim.Optimizer] = []

    # run as Python where torch.compile traces the step (dynamo cannot trace threading.get_ident,
    # and warns): the step is split there, and its param groups are switched before it is traced
    @torch.compiler.disable
    def __call__(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if threading.get_ident() != self.thread:
            return
        now = verdict(facts(opt), self.device, self.simulated)
        if now is Verdict.SWITCH:
            for group in opt.param_groups:
                group["capturable"] = True
        elif now is Verdict.FUSE:
            for group in opt.param_groups:
                group["fused"], group["foreach"] = True, False  # (torch refuses both at once)
        else:
            return
        self.switched.append(opt)


def stepping_capturable(owner: str, module: Any, device: torch.device | None, body: Callable[[], Any],
                        simulated: bool = False) -> Any:
    """``body()`` (a warmup call of ``module``), the optimizers it steps made capturable
    first where :func:`verdict` says so (``simulated``: fused, its stand-in on the CPU), with
    one warning naming them."""
    if device is None and not simulated:
        return body()
    switch = _Switch(device, simulated)
    handle = register_optimizer_step_pre_hook(switch)
    try:
        return body()
    finally:
        handle.remove()
        if switch.switched:
            message = (_fused_message if simulated else _switched_message)(owner, module, switch.switched, device)
            warnings.warn(message, UserWarning, stacklevel=user_stacklevel())


def _places(module: Any) -> dict[int, str]:
    found = Discovery(module)
    return {id(opt): place for opt, place in zip(found.optimizers, found.optimizer_places)}


def _named(opt: torch.optim.Optimizer, places: dict[int, str]) -> str:
    place = places.get(id(opt), "a place not found from the function (an argument?)")
    return f"{type(opt).__name__} at {place}"


def _names(module: Any, switched: list) -> str:
    places = _places(module)
    return "; ".join(_named(opt, places) for opt in switched)


def _switched_message(owner: str, module: Any, switched: list, device: torch.device) -> str:
    names = _names(module, switched)
    which = "it" if len(switched) == 1 else "them"
    return (f"{owner} made the optimizer(s) it steps capturable (capturable=True on their param_groups, "
            f"before their first step): {names}. A CUDA graph steps only capturable optimizers, whose step "
            f"counts and bias corrections are tensors on {device}, as torch.compile makes them; parameters "
            f"can differ from a capturable=False eager step in the last bits. To silence this warning, "
            f"create {which} with capturable=True.")


def _fused_message(owner: str, module: Any, switched: list, device: Any) -> str:
    names = _names(module, switched)
    return (f"{owner} made the optimizer(s) it steps fused (fused=True on their param_groups, before their "
            f"first step): {names}. On a GPU the wrapper makes them capturable, which torch refuses for CPU "
            f"tensors; backend='simulate' stands in with a fused step, whose step counts are tensors too. "
            f"Parameters can differ from a plain eager step in the last bits. To silence this warning, create "
            f"them with fused=True on the CPU and capturable=True on a GPU.")


def explain(err: CaptureError, found: Discovery, device: torch.device | None) -> CaptureError:
    """``err``, or, where torch refused to capture a step (``optimizer-not-capturable``), the
    error naming each optimizer found that is not capturable, why it was not switched and
    the fix (``expected X, got Y at <place>; do Z``)."""
    if err.cause != CAUSE:
        return err
    lines = []
    for opt, place in zip(found.optimizers, found.optimizer_places):
        now = facts(opt)
        why = verdict(now, device)
        if why in (Verdict.NO_GRAPH, Verdict.NO_FLAG, Verdict.CAPTURABLE):
            continue
        got = f"{type(opt).__name__} with capturable=False"
        if why is Verdict.STEPPED:
            got += (" with state from before the wrapper's first call (a step or load_state_dict: its step counts "
                    "are on the host)")
            fix = ("create it with capturable=True, or before the first call set capturable=True in each of "
                   "its param_groups and reload its state (opt.load_state_dict(opt.state_dict()) moves its "
                   "step counts to the GPU)")
        elif why is Verdict.OFF_DEVICE:
            elsewhere = ", ".join(sorted(str(d) for d in now.devices - {device}))
            got += f" with parameters on {elsewhere} (the graph runs on {device})"
            fix = f"move its parameters to {device} before creating it, with capturable=True"
        else:  # (SWITCH: not stepped during the warmup calls, where the wrapper sets the flag)
            got += " first stepped inside the capture, not during the warmup calls"
            fix = "create it with capturable=True"
        lines.append(f"expected a capturable optimizer, got {got} at {place}; do: {fix}.")
    if not lines:
        return err
    named = CaptureError(err.owner, CAUSE, "\n".join(lines), err.original, err.where)
    named.__cause__ = err.__cause__
    return named
