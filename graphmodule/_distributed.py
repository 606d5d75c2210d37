"""Graphs beside ``torch.distributed``: released before their process group goes, and the
rules of capturing a ``DistributedDataParallel`` step.

**Teardown.** NCCL (2.26 and later) finalizes or aborts a communicator only once every CUDA
graph that captured one of its collectives is destroyed: ``commDestroySync`` polls, with no
time limit, until the graphs' references are gone. A wrapper that still holds such a graph
when ``destroy_process_group()`` runs, or when the interpreter exits and tears the groups
down, hangs the process for ever. So a wrapper that captures while a process group is
initialized is remembered (weakly) with the groups alive then, and its graphs are released
(:meth:`~graphmodule.CudaGraphModule.reset`):

- before ``ProcessGroup.shutdown()`` or ``ProcessGroup.abort()`` of one of those groups,
  which ``destroy_process_group()`` calls for each group it destroys (this module wraps the
  two methods at the first such capture);
- at interpreter exit, from an ``atexit`` handler: it runs before the interpreter's teardown
  destroys the groups of a program that never called ``destroy_process_group()``, after an
  uncaught exception too.

A released wrapper warms up and captures again at its next call, as after ``reset()``.

**Capture rules.** :func:`refuse_ddp` runs before a capture (``_refuse.before_capture``), on the modules the function
reads, and refuses a ``DistributedDataParallel`` step that cannot be captured, naming the
cause and the fix; :func:`explain_failure` names DDP's part in a failed capture that the
generic causes of ``_diagnose`` describe otherwise (the causes' names are :data:`CAUSES`' keys).
"""

from __future__ import annotations

import atexit
import logging
import threading
import warnings
import weakref
from typing import Any, Callable, Iterable

import torch
from torch import nn

from ._errors import CaptureError

__all__ = ["CAUSES", "DDP_WARMUP", "explain_failure", "live_groups", "note_capture", "refuse_ddp", "release"]

log = logging.getLogger("graphmodule")

#: eager forward passes DistributedDataParallel needs before a capture: in its first 11 with
#: gradients it times itself with CUDA events and waits for them on the host (its runtime
#: statistics), and in its second it rebuilds its buckets, syncing them across ranks
DDP_WARMUP = 11

#: cause name -> what to do
CAUSES = {
    "ddp-warmup": (
        f"DistributedDataParallel waits for the GPU in its first {DDP_WARMUP} forward passes with "
        "gradients (it times them for its runtime statistics) and rebuilds its gradient buckets in "
        f"the second. Warm up longer: CudaGraphModule(step, warmup={DDP_WARMUP}) or more (forward "
        "passes run outside the wrapper count too)."
    ),
    "ddp-default-stream": (
        "DistributedDataParallel was built on the default stream. It keeps its parameters' gradient "
        "accumulators, which run on the stream they were created on, and the default (legacy) stream "
        "cannot join a capture. Build it on a side stream: `s = torch.cuda.Stream()`, then `with "
        "torch.cuda.stream(s): model = DistributedDataParallel(...)`, then "
        "`torch.cuda.current_stream().wait_stream(s)`."
    ),
    "collective-on-cpu-group": (
        "a collective on CUDA tensors runs on a process group whose CUDA backend is not NCCL "
        "(gloo copies them through the host), which a CUDA graph cannot capture. Use a NCCL group "
        "for CUDA tensors: init_process_group('nccl'), or 'cpu:gloo,cuda:nccl' to keep gloo for "
        "CPU tensors."
    ),
}

# wrapper -> names of the process groups alive when it captured
_CAPTURED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()
_INSTALLED: list[bool] = [False]


def live_groups() -> frozenset[str]:
    """The names of the initialized process groups (none without ``torch.distributed``)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return frozenset()
    return frozenset(dist.distributed_c10d._world.pg_names.values())


def note_capture(wrapper: Any) -> None:
    """``wrapper`` has captured: remember it with the process groups alive now, if any."""
    groups = live_groups()
    if not groups:
        return
    with _LOCK:
        _CAPTURED[wrapper] = _CAPTURED.get(wrapper, frozenset()) | groups
    _install()


def release(groups: frozenset[str] | None, when: str) -> int:
    """Release the graphs of the wrappers that captured while one of ``groups`` was alive
    (every remembered wrapper for ``None``); the number released."""
    with _LOCK:
        chosen = [w for w, alive in list(_CAPTURED.items()) if groups is None or alive & groups]
        for wrapper in chosen:
            del _CAPTURED[wrapper]
    for wrapper in chosen:
        device = wrapper.device
        try:
            if device is not None and device.type == "cuda":
                torch.cuda.synchronize(device)  # its last replay done before its graphs go
            wrapper.reset()
        except Exception as exc:  # noqa: BLE001 - teardown goes on; say what is left
            warnings.warn(f"{wrapper._owner} could not release its CUDA graphs {when} ({exc}); if the "
                          "process hangs, call reset() on it before destroy_process_group().",
                          RuntimeWarning, stacklevel=2)
            continue
        log.info("%s: released its CUDA graphs %s", wrapper._owner, when)
    return len(chosen)


def _group_name(group: Any) -> frozenset[str] | None:
    name = torch.distributed.distributed_c10d._world.pg_names.get(group)
    return None if name is None else frozenset((name,))


def _wrap(method: str) -> Callable[..., Any]:
    original = getattr(torch.distributed.ProcessGroup, method)

    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        # NCCL finalizes the group's communicators only once no graph holds their collectives
        release(_group_name(self), f"before process group {method}()")
        return original(self, *args, **kwargs)

    wrapped.__name__ = wrapped.__qualname__ = method
    wrapped.__doc__ = getattr(original, "__doc__", None)
    wrapped.__wrapped__ = original
    return wrapped


def _install() -> None:
    """Wrap ``ProcessGroup.shutdown``/``abort`` and register the exit handler, once."""
    with _LOCK:
        if _INSTALLED[0]:
            return
        _INSTALLED[0] = True
    try:
        for method in ("shutdown", "abort"):
            if hasattr(torch.distributed.ProcessGroup, method):
                setattr(torch.distributed.ProcessGroup, method, _wrap(method))
    except (AttributeError, TypeError) as exc:  # a torch whose ProcessGroup refuses new attributes
        warnings.warn(f"graphmodule could not hook ProcessGroup.shutdown ({exc}): call reset() on every "
                      "CudaGraphModule that captured collectives before destroy_process_group(), or "
                      "the process may hang there.", RuntimeWarning, stacklevel=3)
    # (handlers run last-registered first: before any registered earlier that tears groups down)
    atexit.register(release, None, "at interpreter exit")


# -- capture rules ---------------------------------------------------------------------------

def _backend(group: Any, device: torch.device) -> str:
    """The name of the backend ``group`` runs collectives on ``device``'s tensors with."""
    try:
        return group._get_backend(device).name().lower()
    except Exception:  # noqa: BLE001 - an older torch: the group's backend string
        return str(torch.distributed.get_backend(group)).lower()


def _ddp_problem(ddp: nn.Module) -> tuple[str, str] | None:
    """``(cause, what was found)`` for a DistributedDataParallel module a graph cannot capture."""
    name = f"DistributedDataParallel({type(ddp.module).__name__})"
    param = next(ddp.parameters(), None)
    if param is not None and param.is_cuda:
        backend = _backend(ddp.process_group, param.device)
        if backend != "nccl":
            return "collective-on-cpu-group", (f"{name} reduces CUDA gradients on a process group whose "
                                               f"backend for {param.device.type} is {backend!r}")
    if torch.is_grad_enabled() and ddp.require_backward_grad_sync:
        try:
            logged = int(ddp._get_ddp_logging_data().get("iteration", 0))
        except Exception:  # noqa: BLE001 - no logging data in this torch: nothing to check
            return None
        # the logger records the index of the forward pass before the one logging, up to 10
        if logged < DDP_WARMUP - 1:
            ran = logged + 1 if logged else "at most 1"
            return "ddp-warmup", (f"{name} ran {ran} forward pass(es) with gradients before this capture; "
                                  f"a capture needs {DDP_WARMUP} before it")
    return None


def refuse_ddp(owner: str, modules: Iterable[tuple[nn.Module, str]]) -> None:
    """Raise the :class:`CaptureError` of the first module in ``modules`` (``(module, where)``
    pairs, as ``Watch.modules``) that a CUDA graph cannot capture."""
    ddp_type = torch.nn.parallel.DistributedDataParallel
    for module, where in modules:
        if not isinstance(module, ddp_type):
            continue
        problem = _ddp_problem(module)
        if problem is not None:
            cause, found = problem
            raise CaptureError(owner, cause, CAUSES[cause], RuntimeError(f"{found} ({where})."), None)


def explain_failure(err: CaptureError, modules: Iterable[tuple[nn.Module, str]]) -> CaptureError:
    """``err``, or the error naming DDP's part in it when the function reads a DDP module."""
    ddp_type = torch.nn.parallel.DistributedDataParallel
    if not any(isinstance(module, ddp_type) for module, _ in modules):
        return err
    if err.cause == "cross-stream" and "legacy stream" in str(err.original):
        named = CaptureError(err.owner, "ddp-default-stream", CAUSES["ddp-default-stream"], err.original, err.where)
        named.__cause__ = err.__cause__
        return named
    return err
