"""The exceptions graphmodule raises, and the one shape their messages take.

Hierarchy::

    Exception
     ├── ValueError
     │    ├── InputMismatchError          a call's inputs differ from what was captured
     │    │    ├── RequiresGradError      an input requires grad (also a RuntimeError)
     │    │    └── MissingKeyError        a TensorDict lacks a key the graph reads (also a KeyError)
     │    └── UnsupportedError            the call does something a replay cannot reproduce
     └── RuntimeError
          ├── CaptureError                capturing the CUDA graph failed; names the likely cause
          ├── GraphStateError             the wrapper cannot run in its current state
          └── StaleGraphError             something the graph reads by address was replaced

Every message says what was expected, what was got, where (a key path such as
``kwargs['obs']`` or ``tensordict['agent', 'obs']``) and what to do. The same facts are
kept as attributes (``mismatches``, ``path``, ``expected``, ``got``) for code that
catches the error.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = [
    "CaptureError",
    "GraphModuleError",
    "GraphStateError",
    "InputMismatchError",
    "Mismatch",
    "MismatchKind",
    "MissingKeyError",
    "RequiresGradError",
    "StaleGraphError",
    "UnsupportedError",
]


# where a signature comes from when no graph was captured (no CUDA, or a failed capture with
# on_capture_failure="eager"): "CudaGraphModule(f) was <this> with other inputs than this call's"
WITHOUT_GRAPH = "first called after warmup (eagerly: no CUDA graph)"


class GraphModuleError(Exception):
    """Base class of every error graphmodule raises."""


_SAME_INPUTS = ("pass the same containers, keys and number of arguments as at capture "
                "(keyword arguments are matched by name).")


class MismatchKind(str, enum.Enum):
    """What differs between a call's input and the captured one, with what to do about it
    (:attr:`advice`, printed once per kind after the list as ``To fix: ...``) and the words
    naming it in ``expected <label> X, got Y`` (:attr:`label`). A ``str``: each kind equals
    its name in lower case (``MismatchKind.DTYPE == "dtype"``)."""

    label: str
    advice: str

    def __new__(cls, value: str, advice: str, label: str | None = None) -> MismatchKind:
        kind = str.__new__(cls, value)
        kind._value_, kind.advice = value, advice
        kind.label = value if label is None else label
        return kind

    __str__ = str.__str__  # (the name, as in messages)

    STRUCTURE = ("structure", _SAME_INPUTS)
    ORDER = ("order", "the graph replays the order it captured (a function iterating a dict or TensorDict sees "
             "it): pass the entries in the captured order.", "key order")
    MISSING = ("missing", _SAME_INPUTS)
    EXTRA = ("extra", _SAME_INPUTS)
    TYPE = ("type", "pass the same kinds of values as at capture (a tensor where a tensor was captured).")
    SHAPE = ("shape", "CUDA graphs replay fixed shapes: pass max_graphs=N to keep a graph per shape (up to N "
             "shapes), or pad the input to the captured shape (bucket inputs of varying sizes into a few padded "
             "shapes).")
    DTYPE = ("dtype", "copying into the graph's buffer would cast silently: convert the input with .to(dtype) "
             "before the call.")
    DEVICE = ("device", "the graph only reads its own GPU buffers: move the input with .to(device) before the call.")
    LAYOUT = ("layout", "CUDA graphs copy strided tensors only: pass a dense tensor (.to_dense()), or its indices "
              "and values as separate fixed-size tensors.")
    REQUIRES_GRAD = (
        "requires_grad", "requires_grad of every input, and of the parameters a graph backpropagates to, is part "
        "of the capture: it decides which gradients the backward graph computes. Pass inputs as at capture "
        "(x.detach() where it did not require grad), keep the parameters' requires_grad as at capture (or reset() "
        "after changing it), or pass max_graphs=2 to keep one graph per pattern of inputs.")
    VALUE = ("value", "non-tensor arguments are baked into the graph at capture: pass a value that changes as a "
             "tensor, or use one CudaGraphModule per value.")
    BATCH_SIZE = ("batch_size", "CUDA graphs replay fixed shapes: pass max_graphs=N to keep a graph per batch size "
                  "(up to N batch sizes), or pass a TensorDict of the captured batch size (pad it, or bucket varying "
                  "batch sizes into a few padded ones).")
    ALIAS = ("alias", "the graph was captured with other aliasing between its inputs (the same tensor passed "
             "twice, or views of one tensor) and writes into them: pass separate tensors as at capture "
             "(x.clone()), or the same aliasing.")
    STRIDE = ("stride", "a replay rebuilds a view of an input the function returns on your tensor with the "
              "captured strides, and copies inputs sharing memory as one block laid out as at capture: pass "
              "tensors with the captured strides (.contiguous() where they were contiguous).")
    OVERLAP = ("overlap", "eagerly, torch refuses to write in place into a tensor whose elements share memory "
               "(x.expand(...)), and so does the graph: pass a tensor of its own (x.clone()).", "")
    INFERENCE = (
        "inference", "torch lets only inference mode write an inference tensor (one made under "
        "torch.inference_mode()), and autograd refuses to save one for backward: pass a normal tensor "
        "(x.clone() outside inference mode, or make it under torch.no_grad()), or call the wrapper under "
        "torch.inference_mode() (with max_graphs=2, a graph of its own).", "")
    UNREAD = (
        "unread", "the module writes keys below this entry, which it does not read: whether the TensorDict you "
        "pass holds a nested TensorDict there decides what eager code would do (merge into it, or create it), so "
        "it must be as at capture. Pass TensorDicts of one layout, or add a key under that entry to the module's "
        "in_keys.", "")
    MODE = ("mode", "the graph replays the branch it captured: switch back, pass max_graphs=2 to keep one graph "
            "per mode, or use one CudaGraphModule per mode.")
    GRAD_MODE = (
        "grad_mode", "the graph was captured under another grad mode, which decides whether its outputs track "
        "gradients (and under torch.inference_mode(), whether they are inference tensors): call it the same way "
        "(e.g. always under torch.no_grad()), or pass max_graphs=2 to keep one graph per mode.")
    INTERACTION_TYPE = ("interaction_type", "the graph replays the sampling branch it captured: call it under the "
                        "captured interaction/exploration type, or pass max_graphs=2 to keep one graph per type.")
    AUTOCAST = (
        "autocast", "autocast decides each op's dtype when the graph is captured, so the graph replays the dtypes "
        "it captured: call it under the captured autocast state (the same torch.autocast(...) around every call), "
        "or pass max_graphs=2 to keep one graph per state.")
    DEFAULT_DTYPE = (
        "default_dtype", "the graph replays the dtypes it captured for tensors the function makes from Python "
        "numbers (torch.zeros(3), torch.arange(3.)): call it under the captured torch.set_default_dtype(...), or "
        "pass max_graphs=2 to keep one graph per default dtype.")
    DETERMINISTIC = (
        "deterministic", "the graph replays the kernels it captured, picked under the captured "
        "torch.use_deterministic_algorithms(...): call it under that setting, or pass max_graphs=2 to keep one "
        "graph per setting.")
    HOOK = (
        "hook", "a replay runs no Python, so a module backward hook inside the graph would not run: remove it, "
        "register it on a module outside the wrapped block, or hook the parameters' gradients (p.register_hook), "
        "which run eagerly at every backward.")


@dataclass(frozen=True)
class Mismatch:
    """One difference between a call's inputs and the captured ones.

    ``kind``: a :class:`MismatchKind` (given as one or as its name: ``"dtype"``), which also
    says what to do about it. ``"hook"`` is a module backward hook on a graph captured as a
    layer, ``"inference"`` an inference tensor where the replay writes into the input or saves
    it for backward, ``"overlap"`` an expanded tensor where the replay writes into the input,
    ``"unread"`` a nested TensorDict the module does not read but writes into, or would merge
    into.
    """

    path: str
    kind: MismatchKind
    expected: str
    got: str
    #: the same fact in ``tensordict.nn.CudaGraphModule``'s words, for code matching on them
    compat: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if type(self.kind) is not MismatchKind:  # (a name: its kind; an unknown one raises)
            object.__setattr__(self, "kind", MismatchKind(self.kind))

    def describe(self, captured: bool = True) -> str:
        """One line; ``captured``: the inputs compared with are a capture's (else, without a
        graph, those of the first call after warmup)."""
        kind = self.kind
        if kind is MismatchKind.MISSING:
            return f"{self.path}: missing (expected {self.expected})"
        if kind is MismatchKind.EXTRA:
            inputs = "the captured inputs" if captured else "those inputs"
            return f"{self.path}: not in {inputs} (got {self.got})"
        if kind is MismatchKind.ALIAS:
            at = "as at capture" if captured else "as then"
            return f"{self.path}: expected {self.expected} ({at}), got {self.got}"
        label = f"{kind.label} " if kind.label else ""
        return f"{self.path}: expected {label}{self.expected}, got {self.got}"


class InputMismatchError(GraphModuleError, ValueError):
    """A call's inputs differ from those the graph was captured with.

    All mismatches of the call are listed at once. The wrapper is unchanged by the
    error: call it again with matching inputs.

    Attributes:
        mismatches: every :class:`Mismatch` found, in input order.
        path, expected, got: those of the first mismatch.
    """

    def __init__(self, owner: str, mismatches: list[Mismatch], when: str = "captured",
                 advice: str | None = None) -> None:
        self.owner, self.when, self.advice = owner, when, advice
        self.mismatches = list(mismatches)
        first = self.mismatches[0]
        self.path, self.expected, self.got = first.path, first.expected, first.got
        count = len(self.mismatches)
        lines = [
            f"{owner} was {when} with other inputs than this call's "
            f"({count} mismatch{'es' if count > 1 else ''}):"
        ]
        lines += [f"  {m.describe(when != WITHOUT_GRAPH)}" for m in self.mismatches]
        seen: list[str] = [advice] if advice else []  # advice given: it replaces the per-kind one
        for m in () if advice else self.mismatches:
            text = m.kind.advice
            if text not in seen:
                seen.append(text)
        lines += [f"To fix: {advice}" for advice in seen]
        compat: list[str] = []
        for m in self.mismatches:
            if m.compat and m.compat not in compat:
                compat.append(m.compat)
        lines += [f"(tensordict.nn.CudaGraphModule's words: {text})" for text in compat]
        super().__init__("\n".join(lines))

    def __reduce__(self):  # keep the error picklable (multiprocessing, pytest-xdist)
        return (type(self), (self.owner, self.mismatches, self.when, self.advice))


class RequiresGradError(InputMismatchError, RuntimeError):
    """An input's ``requires_grad`` differs from the capture's, or an input requires grad
    where a replay cannot backpropagate to it (a function that runs backward itself).

    Also a ``RuntimeError``, which is what ``tensordict.nn.CudaGraphModule`` raises here.
    """

    def __init__(self, owner: str, mismatches: list[Mismatch], when: str = "called",
                 advice: str | None = None) -> None:
        InputMismatchError.__init__(self, owner, mismatches, when, advice)


class MissingKeyError(InputMismatchError, KeyError):
    """A TensorDict lacks a key the captured graph reads.

    Also a ``KeyError``, which is what ``tensordict.nn.CudaGraphModule`` raises here.
    """

    def __str__(self) -> str:  # KeyError would print the message quoted
        return self.args[0] if self.args else ""


class UnsupportedError(GraphModuleError, ValueError):
    """The call does something a graph replay cannot reproduce, found at capture.

    The graph is dropped and the wrapper is left as if the call had not been made:
    change the function (the message says how) or keep it eager.
    """

    def __init__(self, owner: str, what: str, advice: str) -> None:
        self.owner, self.what, self.advice = owner, what, advice
        super().__init__(f"{owner} cannot replay this call as a CUDA graph: {what}\nTo fix: {advice}")

    def __reduce__(self):
        return (type(self), (self.owner, self.what, self.advice))


class StaleGraphError(GraphModuleError, RuntimeError):
    """A tensor or value the graph read at capture was replaced since.

    The graph reads memory by address and Python values as they were at capture, so a
    replay would use the old ones. Raised before any replay, with ``on_stale="raise"``.

    Without a graph (no CUDA), the same changes raise: they would on a GPU.

    Attributes:
        changes: ``(where, what)`` pairs, e.g. ``("module[0].weight", "another tensor")``.
    """

    def __init__(self, owner: str, changes: list[tuple[str, str]], when: str = "captured") -> None:
        self.owner, self.changes, self.when = owner, list(changes), when
        captured = when != WITHOUT_GRAPH
        would = "" if captured else " (a CUDA graph would replay what it read then)"
        lines = [f"{owner} was {when} reading state that has changed since{would}:"]
        lines += [f"  {where}: {what}" for where, what in self.changes]
        again = "warm up and capture again" if captured else "warm up again"
        lines.append(
            "To fix: update tensors in place (p.copy_(new), module.load_state_dict(sd) without "
            "assign=True, an optimizer's state tensors with copy_: opt.load_state_dict replaces them), "
            "keep values that change in tensors "
            f"(e.g. a tensor learning rate), or pass on_stale='recapture' to {again} "
            "whenever this happens."
        )
        super().__init__("\n".join(lines))

    def __reduce__(self):
        return (type(self), (self.owner, self.changes, self.when))


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
