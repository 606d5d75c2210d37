"""The exceptions graphmodule raises, and the one shape their messages take.

Hierarchy::

    Exception
     ├── ValueError
     │    └── InputMismatchError          a call's inputs differ from what was captured
     │         └── RequiresGradError      an input requires grad (also a RuntimeError)
     └── RuntimeError
          ├── CaptureError                capturing the CUDA graph failed; names the likely cause
          └── GraphStateError             the wrapper cannot run in its current state

Every message says what was expected, what was got, where (a key path such as
``kwargs['obs']`` or ``tensordict['agent', 'obs']``) and what to do. The same facts are
kept as attributes (``mismatches``, ``path``, ``expected``, ``got``) for code that
catches the error.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CaptureError",
    "GraphModuleError",
    "GraphStateError",
    "InputMismatchError",
    "Mismatch",
    "RequiresGradError",
]


class GraphModuleError(Exception):
    """Base class of every error graphmodule raises."""


@dataclass(frozen=True)
class Mismatch:
    """One difference between a call's inputs and the captured ones.

    ``kind`` is one of ``"structure"``, ``"missing"``, ``"extra"``, ``"type"``,
    ``"shape"``, ``"dtype"``, ``"device"``, ``"requires_grad"``, ``"value"``,
    ``"batch_size"`` or ``"mode"``.
    """

    path: str
    kind: str
    expected: str
    got: str

    def describe(self) -> str:
        if self.kind == "missing":
            return f"{self.path}: missing (expected {self.expected})"
        if self.kind == "extra":
            return f"{self.path}: not in the captured inputs (got {self.got})"
        return f"{self.path}: expected {self.kind} {self.expected}, got {self.got}"


# What to do, per kind of mismatch: printed once per kind, after the list.
_ADVICE = {
    "shape": "CUDA graphs replay fixed shapes: pad or slice the input to the captured shape, "
    "or use one CudaGraphModule per shape.",
    "batch_size": "CUDA graphs replay fixed shapes: pass a TensorDict of the captured batch size, "
    "or use one CudaGraphModule per batch size.",
    "dtype": "copying into the graph's buffer would cast silently: convert the input with "
    ".to(dtype) before the call.",
    "device": "the graph only reads its own GPU buffers: move the input with .to(device) "
    "before the call.",
    "value": "non-tensor arguments are baked into the graph at capture: pass a value that "
    "changes as a tensor, or use one CudaGraphModule per value.",
    "structure": "pass the same containers, keys and number of arguments as at capture "
    "(keyword arguments are matched by name).",
    "missing": "pass the same containers, keys and number of arguments as at capture "
    "(keyword arguments are matched by name).",
    "extra": "pass the same containers, keys and number of arguments as at capture "
    "(keyword arguments are matched by name).",
    "type": "pass the same kinds of values as at capture (a tensor where a tensor was captured).",
    "mode": "the graph replays the branch it captured: switch back, or use one "
    "CudaGraphModule per mode.",
    "requires_grad": "replays cannot backpropagate to the caller's tensors: pass x.detach(), "
    "or train inside the wrapped function (loss.backward(); optimizer.step()) and read the "
    "parameters from the module instead of passing them.",
}


class InputMismatchError(GraphModuleError, ValueError):
    """A call's inputs differ from those the graph was captured with.

    All mismatches of the call are listed at once. The wrapper is unchanged by the
    error: call it again with matching inputs.

    Attributes:
        mismatches: every :class:`Mismatch` found, in input order.
        path, expected, got: those of the first mismatch.
    """

    def __init__(self, owner: str, mismatches: list[Mismatch], when: str = "captured") -> None:
        self.owner = owner
        self.mismatches = list(mismatches)
        first = self.mismatches[0]
        self.path, self.expected, self.got = first.path, first.expected, first.got
        count = len(self.mismatches)
        lines = [
            f"{owner} was {when} with other inputs than this call's "
            f"({count} mismatch{'es' if count > 1 else ''}):"
        ]
        lines += [f"  {m.describe()}" for m in self.mismatches]
        seen: list[str] = []
        for m in self.mismatches:
            advice = _ADVICE.get(m.kind)
            if advice and advice not in seen:
                seen.append(advice)
        lines += [f"To fix: {advice}" for advice in seen]
        super().__init__("\n".join(lines))

    def __reduce__(self):  # keep the error picklable (multiprocessing, pytest-xdist)
        return (type(self), (self.owner, self.mismatches))


class RequiresGradError(InputMismatchError, RuntimeError):
    """An input requires grad: a replay cannot backpropagate to it.

    Also a ``RuntimeError``, which is what ``tensordict.nn.CudaGraphModule`` raises here.
    """

    def __init__(self, owner: str, mismatches: list[Mismatch], when: str = "called") -> None:
        InputMismatchError.__init__(self, owner, mismatches, when)


class CaptureError(GraphModuleError, RuntimeError):
    """Capturing the CUDA graph failed.

    The capture was ended cleanly (no stream is left capturing, the CUDA random
    generator works again) and the original exception is chained as ``__cause__``.

    Attributes:
        cause: a short name of the likely cause, e.g. ``"host-sync"``.
        hint: what to do about it.
        where: ``file:line`` of the user code that was running, when known.
    """

    def __init__(self, owner: str, cause: str, hint: str, original: BaseException, where: str | None):
        self.owner, self.cause, self.hint, self.where = owner, cause, hint, where
        self.original = original
        first_line = (str(original).strip().splitlines() or [type(original).__name__])[0]
        at = f" at {where}" if where else ""
        super().__init__(
            f"{owner} failed to capture its CUDA graph{at}: {type(original).__name__}: "
            f"{first_line}\nLikely cause ({cause}): {hint}"
        )

    def __reduce__(self):
        return (type(self), (self.owner, self.cause, self.hint, self.original, self.where))


class GraphStateError(GraphModuleError, RuntimeError):
    """The wrapper cannot run in its current state (e.g. after a failed capture)."""
